"""Every worker setting, read and checked once when the worker is built.

A worker that starts with a bad value must say so at once, naming the key — not run
half-way (a receive thread that dies on its first batch, a timer that never beats) or
break later (a SIGTERM that cannot compute its deadline).  :meth:`WorkerSettings.from_conf`
reads each ``topology.*`` / ``worker.*`` key the worker process uses with a typed getter
whose error names the key, the value and what is allowed.  The other settings objects are
read once the same way: :class:`~spark_storm.worker.checkpoint.CheckpointSettings` (the
``topology.state.*`` keys, beside these), and per component, whose configuration may
override the topology's: a spout's pending limit and wait (the spout executor), a window's
spec (:func:`~spark_storm.topology.windows.window_spec`), a multilang child's settings
(:class:`~spark_storm.shell.MultilangSettings`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from spark_storm.config import Config
from spark_storm.errors import ConfigError
from spark_storm.worker.affinity import KEY as AFFINITY_KEY
from spark_storm.worker.affinity import SLOT, check_affinity

__all__ = ["SWITCH_INTERVAL_ENV", "WorkerSettings", "switch_interval_from_env"]

#: Overrides ``topology.worker.switch.interval.ms`` in every worker process started with it in
#: its environment, in microseconds (below the key's 10 us floor).  The race tier of scripts/test
#: sets 1 so a buffer two threads share breaks in CI; tests/conftest.py applies it to the pytest
#: process too.  Workers started by a local cluster or a supervisor inherit it.
SWITCH_INTERVAL_ENV = "SPARK_STORM_SWITCH_INTERVAL_US"


def switch_interval_from_env() -> float | None:
    """Return the switch interval in seconds that :data:`SWITCH_INTERVAL_ENV` asks for, or None if unset.

    Raises
    ------
    ConfigError
        The variable is not a number of microseconds in (0, 1000000].
    """
    raw = os.environ.get(SWITCH_INTERVAL_ENV, "").strip()
    if not raw:
        return None
    try:
        micros = float(raw)
    except ValueError:
        micros = -1.0
    if not 0 < micros <= 1_000_000:
        msg = f"{SWITCH_INTERVAL_ENV}={raw!r}: give the GIL switch interval in microseconds, above 0, at most 1000000"
        raise ConfigError(msg)
    return micros / 1_000_000


@dataclass(frozen=True)
class WorkerSettings:
    """The worker's configuration, typed and validated (see spark_storm/defaults.yaml)."""

    receiver_mode: str
    receiver_buffer_size: int
    receiver_full_wait_s: float
    executor_queue_size: int
    executor_batch_size: int
    bp_high: float
    bp_low: float
    hold_max: int
    transfer_queue_size: int
    transfer_batch_size: int
    tick_s: float | None
    error_policy: str
    dead_letter_file: str | None
    load_interval_s: float
    heartbeat_dir: str | None
    heartbeat_every_s: float
    metrics_port: int
    metrics_host: str
    shutdown_timeout_s: float
    quiet_s: float
    ready_timeout_s: float
    gc_threshold: int
    switch_interval_s: float | None
    message_timeout_s: float
    cpu_affinity: str | tuple[int, ...] | None
    host_ports: tuple[int, ...]

    @classmethod
    def from_conf(cls, conf: Config) -> WorkerSettings:
        """Read and check every key.

        Raises
        ------
        ConfigError
            Naming the first bad key, its value and what it must be.
        """
        high = conf.get_float("topology.backpressure.high.watermark", minimum=0.0, maximum=1.0)
        low = conf.get_float("topology.backpressure.low.watermark", minimum=0.0, maximum=1.0)
        if not 0 < low < high <= 1:
            msg = (
                "topology.backpressure.low.watermark and .high.watermark need 0 < low < high <= 1, "
                f"got low={low} high={high}"
            )
            raise ConfigError(msg)
        tick = conf["topology.tick.tuple.freq.secs"]
        tick_s = None if tick is None else conf.get_float("topology.tick.tuple.freq.secs", minimum=0.001)
        port = conf.get_int("topology.worker.metrics.port", minimum=-1)
        affinity = check_affinity(conf[AFFINITY_KEY])
        if port > 65535:
            msg = (
                f"config key 'topology.worker.metrics.port' must be -1 (off), 0 (any free port) or 1..65535, got {port}"
            )
            raise ConfigError(msg)
        return cls(
            receiver_mode=conf.get_choice("topology.receiver.mode", ("push", "pull")),
            receiver_buffer_size=conf.get_int("topology.receiver.buffer.size", minimum=1),
            receiver_full_wait_s=conf.get_int("topology.receiver.full.wait.ms", minimum=1) / 1000,
            executor_queue_size=conf.get_int("topology.executor.receive.buffer.size", minimum=1),
            executor_batch_size=conf.get_int("topology.executor.batch.size", minimum=1),
            bp_high=high,
            bp_low=low,
            hold_max=conf.get_int("topology.backpressure.hold.max.size", minimum=1),
            transfer_queue_size=conf.get_int("topology.transfer.buffer.size", minimum=1),
            transfer_batch_size=conf.get_int("topology.transfer.batch.size", minimum=1),
            tick_s=tick_s,
            error_policy=conf.get_choice("topology.bolt.error.policy", ("log", "fail", "stop")),
            dead_letter_file=conf.get_optional_str("topology.worker.dead.letter.file"),
            load_interval_s=conf.get_int("topology.load.metrics.interval.ms", minimum=1) / 1000,
            heartbeat_dir=conf.get_optional_str("worker.heartbeat.dir"),
            heartbeat_every_s=conf.get_float("worker.heartbeat.frequency.secs", minimum=0.05),
            metrics_port=port,
            metrics_host=conf.get_str("topology.worker.metrics.host"),
            shutdown_timeout_s=conf.get_int("topology.worker.shutdown.timeout.ms", minimum=0) / 1000,
            quiet_s=conf.get_int("topology.worker.shutdown.quiet.ms", minimum=0) / 1000,
            ready_timeout_s=conf.get_int("topology.worker.connections.ready.timeout.ms", minimum=0) / 1000,
            gc_threshold=conf.get_int("topology.worker.gc.threshold", minimum=0),
            switch_interval_s=_switch_interval(conf),
            message_timeout_s=conf.get_int("topology.message.timeout.secs", minimum=1),
            cpu_affinity=affinity,
            host_ports=_ports(conf) if affinity == SLOT else (),
        )


def _ports(conf: Config) -> tuple[int, ...]:
    """``supervisor.slots.ports``: the slots of this worker's host, as its supervisor passes them (for ``"slot"``)."""
    raw = conf["supervisor.slots.ports"]
    if not isinstance(raw, list | tuple) or not all(type(p) is int for p in raw):
        msg = f"config key 'supervisor.slots.ports' must be a list of port numbers, got {raw!r}"
        raise ConfigError(msg)
    return tuple(raw)


def _switch_interval(conf: Config) -> float | None:
    """Return the process's switch interval: the environment's override (the race tier), else the key's."""
    from_env = switch_interval_from_env()
    if from_env is not None:
        return from_env
    if conf["topology.worker.switch.interval.ms"] is None:
        return None
    return conf.get_float("topology.worker.switch.interval.ms", minimum=0.01, maximum=1000) / 1000
