"""The classes a component may name, made runnable by an executor.

:func:`adapt_class` is called on every component's resolved class:

* a pystorm/streamparse ``Bolt`` subclass runs in-process behind
  :class:`~spark_storm.shell.pystorm.InProcessPystormBolt` (no child process);
* a Python class given Flux ``constructorArgs`` / ``properties`` / ``configMethods``
  (component conf ``topology.flux.construct``) is built with them;
* anything else is returned as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_storm.errors import ConfigError
from spark_storm.topology.model import Component

__all__ = ["adapt_class", "is_pystorm_class"]

_CONSTRUCT = "topology.flux.construct"


def is_pystorm_class(cls: Any, kind: str) -> bool:
    """Whether ``cls`` subclasses pystorm's (or streamparse's) ``Bolt`` / ``Spout`` (``kind``)."""
    if not isinstance(cls, type):
        return False
    return any(
        base.__name__ == kind and base.__module__.split(".")[0] in ("pystorm", "streamparse") for base in cls.__mro__
    )


def adapt_class(component: Component, cls: Any) -> Any:
    """Return the class an executor instantiates (with no arguments) for ``component``.

    Raises
    ------
    ConfigError
        A pystorm Spout named for in-process use (run it as a multilang child), or a
        construct specification that is not what Flux gives.
    """
    construct = component.conf.get(_CONSTRUCT)
    if is_pystorm_class(cls, "Bolt"):
        from spark_storm.shell.pystorm import InProcessPystormBolt

        return type(f"InProcess{cls.__name__}", (InProcessPystormBolt,), {"target": cls, "construct": construct})
    if is_pystorm_class(cls, "Spout"):
        msg = (
            f"component {component.id!r}: {cls.__module__}.{cls.__name__} is a pystorm Spout; spark-storm runs pystorm "
            "bolts in-process, spouts as multilang children: use FluxShellSpout (or `shell:` with `spout: true`) "
            f"with the command ['streamparse_run', '{cls.__module__}.{cls.__name__}']"
        )
        raise ConfigError(msg)
    if construct and isinstance(cls, type):
        return _constructed(component, cls, construct)
    return cls


def _constructed(component: Component, cls: type, construct: Any) -> type:
    if not isinstance(construct, Mapping):
        msg = f"component {component.id!r}: {_CONSTRUCT!r} must be a mapping of args, properties, calls"
        raise ConfigError(msg)
    args = list(construct.get("args") or [])
    properties = dict(construct.get("properties") or {})
    calls = [(str(name), list(cargs or [])) for name, cargs in construct.get("calls") or []]
    where = f"component {component.id!r} ({cls.__module__}.{cls.__name__})"

    def __init__(self: Any) -> None:
        try:
            cls.__init__(self, *args)  # type: ignore[misc]
            for name, value in properties.items():
                setter = getattr(self, f"set_{name}", None) or getattr(self, f"set{name[:1].upper()}{name[1:]}", None)
                if callable(setter):
                    setter(value)
                else:
                    setattr(self, name, value)
            for name, cargs in calls:
                getattr(self, name)(*cargs)
        except Exception as exc:  # user code: say which class and what was passed
            msg = (
                f"{where}: building it with constructorArgs {args}, properties {properties}, configMethods "
                f"{calls} raised {type(exc).__name__}: {exc}"
            )
            raise ConfigError(msg) from exc

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__})
