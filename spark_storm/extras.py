"""Optional parts and the extras that install them: one line naming the extra when one is missing.

A worker host installs only what it uses (``pip install 'spark-storm[zmq]'``); the base
install runs the tcp transport, workers, topologies, the UI and local clusters.  When a
part is used without its library, :func:`missing_extra` turns the ``ModuleNotFoundError``
into a :class:`~spark_storm.errors.MissingExtraError` whose message names the extra.
"""

from __future__ import annotations

from typing import Final

from spark_storm.errors import MissingExtraError

__all__ = ["EXTRAS", "extra_for", "missing_extra", "require"]

#: Top-level module -> (extra, what needs it).
EXTRAS: Final[dict[str, tuple[str, str]]] = {
    "zmq": ("zmq", "the zmq transport"),
    "kafka": ("kafka", "the kafka transport and the Kafka result bolt"),
    "crc32c": ("kafka", "the kafka transport"),
    "kazoo": ("cluster", "cluster mode (ZooKeeper)"),
    "redis": ("redis", "the redis state backend"),
    "pyspark": ("spark", "the Spark side"),
}


def extra_for(module: str | None) -> str | None:
    """Return the extra that installs ``module`` (a dotted name is taken by its top level), or None."""
    if not module:
        return None
    entry = EXTRAS.get(module.partition(".")[0])
    return entry[0] if entry else None


def missing_extra(exc: ModuleNotFoundError, what: str | None = None) -> MissingExtraError | None:
    """Return the one-line error for a module an extra installs, or None if no extra installs it.

    Parameters
    ----------
    exc : ModuleNotFoundError
        The failed import (its ``name`` is the missing module).
    what : str, optional
        What was being used (default: the part the extra is for).
    """
    name = (exc.name or "").partition(".")[0]
    if name not in EXTRAS:
        return None
    extra, part = EXTRAS[name]
    msg = f"{what or part} needs {name!r}, which is not installed: pip install 'spark-storm[{extra}]'"
    return MissingExtraError(msg, name=name)


def require(module: str, what: str | None = None) -> None:
    """Import ``module`` (an optional library) or raise the one-line :class:`MissingExtraError`."""
    import importlib

    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        error = missing_extra(exc, what)
        if error is None:
            raise
        raise error from None
