"""Configuration: the packaged defaults, a storm.yaml, and overrides from code.

Every key has its default in ``spark_storm/defaults.yaml`` (shipped in the package,
read with :mod:`importlib.resources`); nothing in the code carries an inline default.
A :class:`Config` is an immutable mapping with typed getters whose errors name the key,
the bad value and the fix.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml

from spark_storm.errors import ConfigError
from spark_storm.plugins import did_you_mean

__all__ = [
    "STORM_LOCAL_MODE_ZMQ",
    "STORM_MESSAGING_TRANSPORT",
    "Config",
    "default_config",
    "is_loopback_host",
    "load_config",
]

logger = logging.getLogger(__name__)

STORM_MESSAGING_TRANSPORT: Final = "storm.messaging.transport"
STORM_MAX_FRAME_BYTES: Final = "storm.messaging.max.frame.bytes"
STORM_BIND_HOST: Final = "storm.messaging.bind.host"
STORM_OVERFLOW_POLICY: Final = "storm.messaging.send.overflow.policy"
STORM_SEND_TIMEOUT_MS: Final = "storm.messaging.send.timeout.ms"
STORM_SERVER_RECEIVE_QUEUE_SIZE: Final = "storm.messaging.server.receive.queue.size"
STORM_HANDSHAKE_TIMEOUT_MS: Final = "storm.messaging.handshake.timeout.ms"
STORM_SERVER_SESSIONS_MAX: Final = "storm.messaging.server.sessions.max"
STORM_LEDGER_MAX: Final = "storm.messaging.server.ledger.max.size"
STORM_LEDGER_REDELIVER_MS: Final = "storm.messaging.server.ledger.redeliver.after.ms"
STORM_LEDGER_MAX_BYTES: Final = "storm.messaging.server.ledger.max.bytes"
STORM_SERVER_MAX_CONNECTIONS: Final = "storm.messaging.server.max.connections"
STORM_SERVER_IDLE_TIMEOUT_MS: Final = "storm.messaging.server.idle.timeout.ms"
STORM_GROUP_MAX_FRAMES: Final = "storm.messaging.server.group.max.frames"
STORM_GROUP_MAX_BYTES: Final = "storm.messaging.server.group.max.bytes"
STORM_AUTH_SECRET: Final = "storm.messaging.auth.secret"
STORM_AUTH_SECRET_FILE: Final = "storm.messaging.auth.secret.file"
STORM_LOCAL_PENDING_MAX: Final = "storm.messaging.local.pending.max.size"
TCP_BATCH_BYTES: Final = "storm.messaging.tcp.transfer.batch.size"
TCP_FLUSH_INTERVAL_MS: Final = "storm.messaging.tcp.flush.interval.ms"
TCP_MIN_WAIT_MS: Final = "storm.messaging.tcp.min_wait_ms"
TCP_MAX_WAIT_MS: Final = "storm.messaging.tcp.max_wait_ms"
TCP_MAX_RETRIES: Final = "storm.messaging.tcp.max_retries"
TCP_HIGH_WATERMARK: Final = "storm.messaging.tcp.buffer.high.watermark"
TCP_LOW_WATERMARK: Final = "storm.messaging.tcp.buffer.low.watermark"
TCP_FLUSH_TIMEOUT_MS: Final = "storm.messaging.tcp.flush.timeout.ms"
TCP_BUFFER_SIZE: Final = "storm.messaging.tcp.buffer_size"
TCP_BACKLOG: Final = "storm.messaging.tcp.socket.backlog"
TCP_CONNECT_TIMEOUT_MS: Final = "storm.messaging.tcp.connect.timeout.ms"
TLS_ENABLE: Final = "storm.messaging.tcp.tls.enable"
TLS_CERT_FILE: Final = "storm.messaging.tcp.tls.cert.file"
TLS_KEY_FILE: Final = "storm.messaging.tcp.tls.key.file"
TLS_KEY_PASSWORD: Final = "storm.messaging.tcp.tls.key.password"
TLS_CA_FILE: Final = "storm.messaging.tcp.tls.ca.file"
TLS_CLIENT_AUTH: Final = "storm.messaging.tcp.tls.client.auth"
TLS_HOSTNAME_VERIFICATION: Final = "storm.messaging.tcp.tls.hostname.verification"
TLS_MIN_VERSION: Final = "storm.messaging.tcp.tls.min.version"
ZMQ_THREADS: Final = "zmq.threads"
ZMQ_LINGER_MILLIS: Final = "zmq.linger.millis"
ZMQ_HWM: Final = "zmq.hwm"
STORM_LOCAL_MODE_ZMQ: Final = "storm.local.mode.zmq"
ZMQ_IPC_DIR: Final = "storm.messaging.zmq.ipc.dir"
ZMQ_CURVE_SERVER_PUBLIC: Final = "storm.messaging.zmq.curve.server.public.key"
ZMQ_CURVE_SERVER_SECRET: Final = "storm.messaging.zmq.curve.server.secret.key"
ZMQ_CURVE_CLIENT_SECRET: Final = "storm.messaging.zmq.curve.client.secret.key"
ZMQ_CURVE_ALLOWED: Final = "storm.messaging.zmq.curve.client.allowed.keys"
KAFKA_BOOTSTRAP: Final = "storm.messaging.kafka.bootstrap.servers"
KAFKA_TOPIC_PREFIX: Final = "storm.messaging.kafka.topic.prefix"
KAFKA_PARTITIONS: Final = "storm.messaging.kafka.topic.partitions"
KAFKA_REPLICATION: Final = "storm.messaging.kafka.topic.replication.factor"
KAFKA_HEARTBEAT_MS: Final = "storm.messaging.kafka.heartbeat.ms"
KAFKA_LINGER_MS: Final = "storm.messaging.kafka.linger.ms"
KAFKA_POLL_MAX_RECORDS: Final = "storm.messaging.kafka.poll.max.records"
KAFKA_CLIENT_CONFIG: Final = "storm.messaging.kafka.client.config"
SPARK_FOREACH_LINGER_MS: Final = "storm.spark.foreach.linger.ms"

# Namespaces whose every key we own: a key there that is not in defaults.yaml is a typo.
_OWNED_PREFIXES: Final = (
    "storm.messaging.tcp.",
    "storm.messaging.local.",
    "storm.messaging.auth.",
    "storm.messaging.server.",
    "storm.messaging.send.",
    "storm.messaging.zmq.",
    "storm.messaging.kafka.",
    "storm.spark.",
    "zmq.",
    "topology.receiver.",
    "topology.executor.",
    "topology.backpressure.",
    "topology.transfer.",
    "topology.worker.",
    "topology.serializer",
    "topology.state.",
    "worker.",
    "storm.zookeeper.",
    "nimbus.",
    "supervisor.",
    "ui.",
)


@functools.cache
def _packaged_defaults() -> dict[str, Any]:
    text = resources.files("spark_storm").joinpath("defaults.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict):  # pragma: no cover - the packaged file is ours
        msg = "spark_storm/defaults.yaml is not a mapping; the package is damaged, reinstall it"
        raise ConfigError(msg)
    return data


class Config(Mapping[str, Any]):
    """An immutable, validated configuration (defaults + storm.yaml + overrides).

    Parameters
    ----------
    values : Mapping[str, Any]
        The merged key/value pairs.  Use :func:`load_config` or :meth:`of` to build one.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)
        _check_owned_keys(self._values)

    @classmethod
    def of(cls, conf: Mapping[str, Any] | None) -> Config:
        """Return ``conf`` as a Config, filling every missing key from the defaults."""
        if isinstance(conf, Config):
            return conf
        merged = dict(_packaged_defaults())
        merged.update(conf or {})
        return cls(merged)

    def with_overrides(self, overrides: Mapping[str, Any]) -> Config:
        """Return a copy with ``overrides`` applied on top."""
        merged = dict(self._values)
        merged.update(overrides)
        return Config(merged)

    def __getitem__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            hint = did_you_mean(key, self._values, lead="; ")
            msg = f"config key {key!r} is not set and has no default{hint}"
            raise ConfigError(msg) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        shown = {k: ("***" if "secret" in k and v else v) for k, v in self._values.items()}
        return f"Config({shown!r})"

    # typed getters -------------------------------------------------------------------
    def get_int(self, key: str, *, minimum: int | None = None) -> int:
        """Return ``key`` as an int, checking it is at least ``minimum``."""
        value = self[key]
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            else:
                msg = f"config key {key!r} must be an integer, got {value!r}"
                raise ConfigError(msg)
        if minimum is not None and value < minimum:
            msg = f"config key {key!r} must be >= {minimum}, got {value}"
            raise ConfigError(msg)
        return value

    def get_float(self, key: str, *, minimum: float | None = None, maximum: float | None = None) -> float:
        """Return ``key`` as a finite float within [``minimum``, ``maximum``]."""
        value = self[key]
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            msg = f"config key {key!r} must be a number, got {value!r}"
            raise ConfigError(msg)
        if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
            low = "" if minimum is None else f">= {minimum}"
            high = "" if maximum is None else f"<= {maximum}"
            msg = f"config key {key!r} must be {' and '.join(x for x in (low, high) if x)}, got {value!r}"
            raise ConfigError(msg)
        return number

    def get_bool(self, key: str) -> bool:
        """Return ``key`` as a bool (accepts true/false/yes/no/1/0 strings)."""
        value = self[key]
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in {"true", "yes", "1", "false", "no", "0"}:
            return value.strip().lower() in {"true", "yes", "1"}
        msg = f"config key {key!r} must be true or false, got {value!r}"
        raise ConfigError(msg)

    def get_str(self, key: str) -> str:
        """Return ``key`` as a non-empty string."""
        value = self[key]
        if not isinstance(value, str) or not value:
            msg = f"config key {key!r} must be a non-empty string, got {value!r}"
            raise ConfigError(msg)
        return value

    def get_optional_str(self, key: str) -> str | None:
        """Return ``key`` as a string, or None when it is null or empty."""
        value = self[key]
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            msg = f"config key {key!r} must be a string or null, got {value!r}"
            raise ConfigError(msg)
        return value

    def get_choice(self, key: str, choices: tuple[str, ...]) -> str:
        """Return ``key``, which must be one of ``choices``."""
        value = self.get_str(key)
        if value not in choices:
            msg = f"config key {key!r} must be one of {', '.join(choices)}; got {value!r}"
            raise ConfigError(msg)
        return value

    def get_mapping(self, key: str) -> dict[str, Any]:
        """Return ``key`` as a mapping with string keys (null reads as empty)."""
        value = self[key]
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            msg = f"config key {key!r} must be a mapping of names to values, got {value!r}"
            raise ConfigError(msg)
        return dict(value)

    def get_str_list(self, key: str) -> list[str]:
        """Return ``key`` as a list of strings (null reads as empty; one string as a list of one)."""
        value = self[key]
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            msg = f"config key {key!r} must be a list of strings, got {value!r}"
            raise ConfigError(msg)
        return list(value)

    def auth_secret(self) -> bytes | None:
        """Return the shared secret (inline or from the secret file), or None."""
        inline = self[STORM_AUTH_SECRET]
        if inline is not None and inline != "":
            return str(inline).encode("utf-8")
        path = self.get_optional_str(STORM_AUTH_SECRET_FILE)
        if path is None:
            return None
        try:
            secret = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            msg = f"config key {STORM_AUTH_SECRET_FILE!r}: cannot read {path!r}: {exc.strerror}"
            raise ConfigError(msg) from exc
        if not secret:
            msg = f"config key {STORM_AUTH_SECRET_FILE!r}: {path!r} is empty; put the secret in it"
            raise ConfigError(msg)
        return secret.encode("utf-8")


def _check_owned_keys(values: Mapping[str, Any]) -> None:
    known = _packaged_defaults()
    for key in values:
        if key in known or not isinstance(key, str):
            continue
        if key.startswith(_OWNED_PREFIXES):
            hint = did_you_mean(key, known)
            msg = f"unknown config key {key!r}: it is not in spark_storm/defaults.yaml.{hint}"
            raise ConfigError(msg)


def default_config() -> Config:
    """Return the packaged defaults as a Config."""
    return Config.of(None)


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Build a Config from the defaults, an optional storm.yaml, then ``overrides``.

    Parameters
    ----------
    path : str or Path, optional
        A YAML file of ``key: value`` pairs (Storm's storm.yaml format).
    overrides : Mapping, optional
        Values from code; they win over the file.

    Raises
    ------
    ConfigError
        The file cannot be read or is not a YAML mapping, or a key is unknown.
    """
    merged = dict(_packaged_defaults())
    if path is not None:
        data = read_yaml(path, "config file")
        if data is None:
            data = {}
        if not isinstance(data, dict):
            msg = f"config file {str(path)!r} must hold a mapping of key: value, not {type(data).__name__}"
            raise ConfigError(msg)
        merged.update(data)
    merged.update(overrides or {})
    return Config(merged)


def read_yaml(path: str | Path, what: str) -> Any:
    """Load a YAML file; errors name ``what``, the path and the problem.

    Raises
    ------
    ConfigError
        The file cannot be read or is not valid YAML.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"cannot read {what} {str(path)!r}: {exc.strerror}"
        raise ConfigError(msg) from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        msg = f"{what} {str(path)!r} is not valid YAML: {exc}"
        raise ConfigError(msg) from exc


def is_loopback_host(host: str) -> bool:
    """Return True when ``host`` only accepts connections from this machine."""
    if host in {"localhost", "ip6-localhost"}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
