"""Checkpoint rounds the workers run themselves: Storm's checkpoint interval, for plain clients.

The worker with the lowest slot of the plan coordinates: its requests to itself go straight
to its :class:`~spark_storm.worker.checkpoint.participant.CheckpointManager`
(:class:`_ThisWorker`), those to the others over their connections, as a Spark driver's do.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_storm.errors import CoordinatorBusyError, RequestTimeoutError, StormError
from spark_storm.state.protocol import INTERVAL_PRIORITY, SAVEPOINT_PRIORITY, Coordinator, WorkerStatus
from spark_storm.state.savepoint import Manifest
from spark_storm.topology.model import topology_to_dict
from spark_storm.worker.checkpoint.participant import CheckpointManager

__all__ = ["IntervalCheckpoints", "take_savepoint"]

logger = logging.getLogger(__name__)


class _ThisWorker:
    """The coordinator's endpoint for the worker it runs in: requests go straight to its manager."""

    def __init__(self, manager: CheckpointManager) -> None:
        self._manager = manager

    def request(self, op: int, body: bytes, timeout: float) -> tuple[int, bytes]:
        done = threading.Event()
        answer: list[tuple[int, bytes]] = []

        def reply(status: int, data: bytes) -> None:
            answer.append((status, data))
            done.set()

        self._manager.handle(op, body, reply)
        if not done.wait(timeout):
            msg = f"no answer to request op {op} from this worker within {timeout:.1f}s"
            raise RequestTimeoutError(msg)
        return answer[0]


def _endpoints(manager: CheckpointManager) -> dict[str, Any]:
    """Every worker of the plan as a coordinator in this worker reaches it (itself directly)."""
    state = manager.state
    out: dict[str, Any] = {str(slot): conn for slot, conn in state.connections.items()}
    out[str(state.slot)] = _ThisWorker(manager)
    return out


def take_savepoint(
    manager: CheckpointManager, parent: str | Path, commit_first: bool, hold: bool = False
) -> tuple[Path, Manifest]:
    """Coordinate a savepoint of the whole topology from this worker (``POST /savepoint``); return it.

    See :meth:`~spark_storm.state.protocol.Coordinator.savepoint`.
    """
    settings = manager.settings
    coordinator = Coordinator(
        f"savepoint by worker {manager.state.slot}",
        lambda: _endpoints(manager),
        settings.commit_timeout_s,
        settings.retries,
        priority=SAVEPOINT_PRIORITY,
    )
    topology = manager.state.plan.topology
    version = hashlib.sha256(json.dumps(topology_to_dict(topology), sort_keys=True, default=str).encode()).hexdigest()
    return coordinator.savepoint(parent, topology.name, version[:16], commit_first=commit_first, hold=hold)


class IntervalCheckpoints:
    """Storm's checkpoint interval, for topologies fed by plain clients (no Spark driver coordinating).

    The worker with the lowest slot of the plan runs a round every
    ``topology.state.checkpoint.interval.ms``.  It stands aside while a Spark query drives
    the topology, so the two never interleave: while a driver was heard within
    ``topology.state.coordinator.lease.ms``, and while any worker holds a coordinated batch
    (a Spark micro-batch: BATCH_HEADER bit 0x80) that its driver has not committed, however
    slow the batch, unless no group of it came for ``topology.state.coordinator.batch.hold.ms``
    (the driver is presumed gone; docs/design/state.md, "Who coordinates").  The round looks
    at every attempt, on the STATUS it starts with (:meth:`driven_by`); the workers hold it to
    the same rule at each of its requests (they answer BUSY), and a PREPARE looks for an
    open batch where groups are logged, so a driver that comes during a round stops it.
    """

    def __init__(self, manager: CheckpointManager, stopping: threading.Event) -> None:
        self._manager = manager
        settings = manager.settings
        self._interval_s = settings.interval_s
        self._stopping = stopping
        self._lease_s = settings.lease_s
        self._hold_s = settings.batch_hold_s
        self._coordinator = Coordinator(
            f"worker {manager.state.slot} (topology.state.checkpoint.interval.ms)",
            self._endpoints,
            settings.commit_timeout_s,
            settings.retries,
            priority=INTERVAL_PRIORITY,
            stand_aside=self.driven_by,
        )
        self.rounds = 0
        self.stood_aside = 0
        self.last_error: str | None = None

    @property
    def enabled(self) -> bool:
        return self._interval_s > 0

    def _endpoints(self) -> dict[str, Any]:
        return _endpoints(self._manager)

    def driven_by(self, statuses: Mapping[str, WorkerStatus]) -> str | None:
        """Say why a Spark query drives the topology now (the interval rounds stand aside), or None."""
        for s in statuses.values():
            if s.priority_age_s is not None and s.priority_age_s < self._lease_s:
                return f"a Spark driver was heard by {s.worker} {s.priority_age_s:.1f}s ago"
            if s.open_batch_idle_s is not None and s.open_batch_idle_s < self._hold_s:
                return f"{s.worker} holds a Spark batch its driver has not committed yet"
        return None

    def run(self) -> None:
        """Run a round per interval while this worker has the lowest slot (the coordinator thread)."""
        state = self._manager.state
        while not self._stopping.wait(self._interval_s):
            if state.slot != min(state.plan.slots):
                continue
            try:
                self._coordinator.checkpoint({})
                self.rounds += 1
                self._manager.count("interval_rounds")
                self.last_error = None
            except CoordinatorBusyError as exc:  # a Spark query drives the topology: its commits run the rounds
                logger.debug("worker %s: interval round %s", state.slot, exc)
                self.stood_aside += 1
                self._manager.count("interval_stood_aside")
            except StormError as exc:
                self.last_error = str(exc)
                logger.warning("worker %s: interval checkpoint failed: %s", state.slot, exc)
