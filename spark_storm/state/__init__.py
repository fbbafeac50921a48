"""State for stateful bolts, exact through failures: key-value state, changelogs, input logs.

Below ``worker/`` (which runs the checkpoint protocol, docs/design/state.md) and above ``codec/``
(which encodes what is stored).  ``topology.state.provider`` picks the backend:

* ``embedded`` (default) — files on this host (:mod:`spark_storm.state.files`);
* ``memory`` — the same in the worker's memory, not durable (tests);
* ``redis`` — a Redis server (:mod:`spark_storm.state.redis`), for tasks that move between hosts;
* a dotted path to a :class:`StateBackend` subclass, built with ``(topology, config)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from spark_storm.config import Config
from spark_storm.errors import ConfigError
from spark_storm.plugins import did_you_mean, load_object
from spark_storm.state.backend import NO_EPOCH, InputLog, StateBackend, TaskStore
from spark_storm.state.format import LogRecord
from spark_storm.state.kv import DELETED, KeyValueState
from spark_storm.state.writer import StateWriter

__all__ = [
    "DELETED",
    "NO_EPOCH",
    "PROVIDERS",
    "STATE_PROVIDER",
    "STATE_PROVIDER_CONFIG",
    "InputLog",
    "KeyValueState",
    "LogRecord",
    "StateBackend",
    "StateWriter",
    "TaskStore",
    "make_backend",
]

STATE_PROVIDER: Final = "topology.state.provider"
STATE_PROVIDER_CONFIG: Final = "topology.state.provider.config"
PROVIDERS: Final = ("embedded", "memory", "redis")
_SETTINGS: Final = {
    "embedded": {"dir", "log.fsync", "snapshot.min.keys"},
    "memory": {"snapshot.min.keys"},
    "redis": {"url", "prefix", "snapshot.min.keys", "connect.timeout.ms"},
}


def provider_settings(conf: Config) -> tuple[str, dict[str, Any]]:
    """Return (provider, its settings), checked: unknown providers and settings name the fix."""
    name = conf.get_str(STATE_PROVIDER)
    settings = conf.get_mapping(STATE_PROVIDER_CONFIG)
    allowed = _SETTINGS.get(name)
    if allowed is not None:
        for key in settings:
            if key not in allowed:
                hint = did_you_mean(str(key), allowed)
                msg = (
                    f"{STATE_PROVIDER_CONFIG}: {key!r} is not a setting of the {name} provider.{hint} "
                    f"Settings: {', '.join(sorted(allowed))}"
                )
                raise ConfigError(msg)
    fsync = settings.get("log.fsync", "commit")
    if fsync not in ("commit", "group"):
        msg = f"{STATE_PROVIDER_CONFIG} log.fsync must be 'commit' or 'group', got {fsync!r}"
        raise ConfigError(msg)
    return name, dict(settings)


def make_backend(conf: Config, topology: str) -> StateBackend:
    """Build the backend ``topology.state.provider`` names, for ``topology``.

    Raises
    ------
    ConfigError
        An unknown provider or setting (with the closest one), or a class that is not a backend.
    StateUnavailableError
        Redis cannot be reached (naming the address).
    """
    name, settings = provider_settings(conf)
    if name == "embedded":
        from spark_storm.state.files import EmbeddedBackend

        return EmbeddedBackend(topology, settings.get("dir"), fsync_each=settings.get("log.fsync") == "group")
    if name == "memory":
        from spark_storm.state.memory import MemoryBackend

        return MemoryBackend()
    if name == "redis":
        from spark_storm.state.redis import RedisBackend

        return RedisBackend.from_settings(topology, settings)
    if ":" not in name and "." not in name:
        hint = did_you_mean(name, PROVIDERS)
        msg = f"{STATE_PROVIDER} {name!r} is not a provider.{hint} Use one of {', '.join(PROVIDERS)}"
        raise ConfigError(msg)
    cls = load_object(name, STATE_PROVIDER)
    if not (isinstance(cls, type) and issubclass(cls, StateBackend)):
        msg = f"{STATE_PROVIDER} {name!r} is not a StateBackend subclass"
        raise ConfigError(msg)
    factory: Any = cls  # a plugin's constructor takes (topology, settings)
    backend: StateBackend = factory(topology, settings)
    return backend


def snapshot_min_keys(settings: Mapping[str, Any]) -> int:
    """``snapshot.min.keys`` of the provider's settings (default 1000)."""
    value = settings.get("snapshot.min.keys", 1000)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{STATE_PROVIDER_CONFIG} snapshot.min.keys must be a positive integer, got {value!r}"
        raise ConfigError(msg)
    return value
