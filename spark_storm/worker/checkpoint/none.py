"""A topology without state: the checkpoint side of a worker that has nothing to checkpoint.

:class:`NoCheckpoints` answers what the worker asks of its checkpoints without a test for
None at every call: nothing to open, log, pause or commit; executors run their batches as
they come; a coordinator's STATUS is answered "stateless" (a Spark query's commit then
skips its round) and any other request is refused, saying why.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from spark_storm.messaging.api import REQUEST_FAILED, REQUEST_OK
from spark_storm.reports import CheckpointMetrics
from spark_storm.state.protocol import STATUS, encode_body
from spark_storm.worker.checkpoint.alignment import NoAlignment
from spark_storm.worker.checkpoint.participant import Reply

if TYPE_CHECKING:
    from spark_storm.worker.executor import Executor
    from spark_storm.worker.state import WorkerState

__all__ = ["NoCheckpoints"]


class NoCheckpoints:
    """The checkpoints of a topology with no stateful component."""

    stateful = False
    generation = 0
    replaying = False

    def __init__(self, state: WorkerState) -> None:
        self.state = state
        #: No input is logged, so nothing orders the receive path against anything.
        self.gate = contextlib.nullcontext()

    def for_executor(self, executor: Executor) -> NoAlignment:
        """Return an executor's checkpoint side: its batches go straight to its bolts."""
        return NoAlignment(executor)

    def open(self) -> None:
        """No input logs, no changelogs."""

    def set_active(self, executors: list[Executor], on: bool) -> None:
        """(De)activate executors: no rollback ever owns them here."""
        for executor in executors:
            if on:
                executor.activate()
            else:
                executor.deactivate()

    def executors_moved(self, added: list[str], removed: list[str]) -> None:
        """Nothing uncommitted moved with them."""

    def mark_dirty(self, reason: str) -> None:
        """No state to roll back (a lost tuple's tree fails, or times out, as in Storm)."""

    def drain_writes(self, timeout: float) -> bool:
        """No changelog writes."""
        return True

    def close(self) -> None:
        """No backend to close."""

    def metrics(self) -> CheckpointMetrics | None:
        """No checkpoint view."""
        return None

    def status(self) -> dict[str, Any]:
        """Return what STATUS answers for a worker without state."""
        return {
            "worker": str(self.state.slot),
            "stateful": False,
            "epoch": 0,
            "committed": 0,
            "generation": 0,
            "dirty": False,
            "reasons": [],
        }

    def handle(self, op: int, body: bytes, reply: Reply) -> None:
        """Answer STATUS; refuse the rest (there is nothing to checkpoint)."""
        if op == STATUS:
            reply(REQUEST_OK, encode_body(self.status()))
            return
        reply(REQUEST_FAILED, f"topology {self.state.plan.topology.name!r} has no stateful component".encode())
