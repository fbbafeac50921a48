"""Transports and the factory that picks one by configuration (Storm's TransportFactory).

``storm.messaging.transport`` takes an alias from :data:`TRANSPORT_ALIASES` or a dotted
path, in either of Storm's two plugin styles:

* a class implementing :class:`~spark_storm.messaging.api.IContext`
  (``"pkg.mod:MyContext"`` or ``"pkg.mod.MyContext"``), built with ``from_conf(conf)``;
* any object with a ``make_context(conf)`` callable: a module (``"pkg.mod"``), a class
  or an instance (``"pkg.mod:factory"``).

Alias targets are strings, so ``pyzmq`` is imported only when someone picks ``zmq``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

from spark_storm.config import STORM_MESSAGING_TRANSPORT, Config
from spark_storm.errors import TransportInitError, UnknownTransportError
from spark_storm.extras import extra_for
from spark_storm.messaging.api import IContext
from spark_storm.plugins import Problem, TargetError, attribute_hint, did_you_mean, import_target

__all__ = ["TRANSPORT_ALIASES", "make_context", "resolve_transport"]

TRANSPORT_ALIASES: Final[Mapping[str, str]] = {
    "local": "spark_storm.transport.local:Context",
    "tcp": "spark_storm.transport.tcp:Context",
    "zmq": "spark_storm.transport.zmq:Context",
    "kafka": "spark_storm.transport.kafka:Context",
}


def _import_target(name: str, target: str) -> object:
    """Import a transport plugin (a module, or an attribute of one), wording what went wrong."""
    try:
        return import_target(target, module_alone=True)
    except TargetError as err:
        module, missing, cause = err.module, err.missing, err.cause
        if err.kind == Problem.MODULE and missing is not None and not module.startswith(missing):
            extra = extra_for(missing)
            hint = f": pip install 'spark-storm[{extra}]'" if extra else ""
            msg = f"transport {name!r}: module {module!r} needs {missing!r}, which is not installed{hint}"
            raise TransportInitError(msg) from cause
        if err.kind in (Problem.MODULE, Problem.PATH):
            msg = f"transport {name!r}: no module named {missing or module or target!r}; check the dotted path"
            raise UnknownTransportError(msg) from cause
        if err.kind == Problem.ATTRIBUTE:
            msg = f"transport {name!r}: module {module!r} has no attribute {err.attr!r}.{attribute_hint(err, ' ')}"
            raise UnknownTransportError(msg) from None
        msg = f"transport {name!r}: importing {module!r} failed: {cause}"
        raise TransportInitError(msg) from cause


@functools.cache
def resolve_transport(name: str) -> object:
    """Return the plugin object for an alias or dotted path (cached).

    Raises
    ------
    UnknownTransportError
        No such alias, module or attribute (with a "did you mean" where one is close),
        or the object is not a transport.
    TransportInitError
        The plugin's module exists but failed to import.
    """
    if not isinstance(name, str) or not name.strip():
        msg = (
            f"{STORM_MESSAGING_TRANSPORT} must name a transport "
            f"({', '.join(TRANSPORT_ALIASES)} or a dotted path), got {name!r}"
        )
        raise UnknownTransportError(msg)
    target = TRANSPORT_ALIASES.get(name, name)
    if target == name and "." not in name and ":" not in name:
        hint = did_you_mean(name, TRANSPORT_ALIASES)
        msg = (
            f"no such transport: {name!r}.{hint} Use one of {', '.join(sorted(TRANSPORT_ALIASES))} "
            "or a dotted path to an IContext class or an object with make_context(conf)"
        )
        raise UnknownTransportError(msg)
    plugin = _import_target(name, target)
    is_context_class = isinstance(plugin, type) and issubclass(plugin, IContext)
    if not is_context_class and not callable(getattr(plugin, "make_context", None)):
        msg = (
            f"transport {name!r} resolves to {plugin!r}, which is neither an IContext subclass "
            "nor an object with a make_context(conf) method"
        )
        raise UnknownTransportError(msg)
    return plugin


def make_context(conf: Mapping[str, Any] | None = None) -> IContext:
    """Build the context named by ``storm.messaging.transport``.

    Parameters
    ----------
    conf : Mapping, optional
        Configuration; missing keys take the packaged defaults.

    Raises
    ------
    UnknownTransportError
        See :func:`resolve_transport`.
    TransportInitError
        The plugin was found but building the context failed (cause chained), or it
        returned something that is not an IContext.
    """
    config = Config.of(conf)
    name = config[STORM_MESSAGING_TRANSPORT]
    plugin = resolve_transport(name)
    try:
        if isinstance(plugin, type) and issubclass(plugin, IContext):
            context: object = plugin.from_conf(config)
        else:
            context = plugin.make_context(config)  # type: ignore[attr-defined]
    except Exception as exc:
        msg = f"transport {name!r} failed to build its context: {type(exc).__name__}: {exc}"
        raise TransportInitError(msg) from exc
    if not isinstance(context, IContext):
        msg = f"transport {name!r} returned {context!r}, which is not an IContext"
        raise TransportInitError(msg)
    return context
