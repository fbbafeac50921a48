"""The checkpoint keys a worker reads, checked once (beside :class:`~spark_storm.worker.settings.WorkerSettings`)."""

from __future__ import annotations

from dataclasses import dataclass

from spark_storm.config import Config
from spark_storm.state import provider_settings, snapshot_min_keys

__all__ = ["CheckpointSettings"]


@dataclass(frozen=True)
class CheckpointSettings:
    """``topology.state.*``: how rounds run, how long they wait, when a full snapshot replaces deltas.

    Attributes
    ----------
    commit_timeout_s : float
        How long one round (a PREPARE, a replay, the writes a RESUME waits for) may take.
    retries : int
        Rounds a coordinator tries before its commit fails.
    lease_s : float
        How long a worker follows one coordinator after its last request.
    batch_hold_s : float
        How long an open Spark batch holds the interval rounds after its last group (0: not at all).
    interval_s : float
        The interval rounds' period for plain clients (0: off).
    snapshot_min_keys : int
        A full snapshot replaces a task's deltas once they hold more keys than this (and than the state).
    """

    commit_timeout_s: float
    retries: int
    lease_s: float
    batch_hold_s: float
    interval_s: float
    snapshot_min_keys: int

    @classmethod
    def from_conf(cls, conf: Config) -> CheckpointSettings:
        """Read and check every key (ConfigError naming the key and the value)."""
        _, provider = provider_settings(conf)
        return cls(
            commit_timeout_s=conf.get_int("topology.state.commit.timeout.ms", minimum=1) / 1000,
            retries=conf.get_int("topology.state.commit.retries", minimum=1),
            lease_s=conf.get_int("topology.state.coordinator.lease.ms", minimum=1) / 1000,
            batch_hold_s=conf.get_int("topology.state.coordinator.batch.hold.ms", minimum=0) / 1000,
            interval_s=conf.get_int("topology.state.checkpoint.interval.ms", minimum=0) / 1000,
            snapshot_min_keys=snapshot_min_keys(provider),
        )
