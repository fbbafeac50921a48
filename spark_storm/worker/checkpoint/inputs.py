"""A worker's input logs: what its source tasks accepted, sealed at barriers, replayed after a rollback.

What a source task accepts is logged before the worker acks it (:meth:`InputLogs.log_group`);
a barrier seals each log's segment (:meth:`InputLogs.seal`), made durable off the gate; a
commit truncates what it covers and records the Spark batches it holds; a rollback retags
what came after the committed epoch as the next one and :meth:`InputLogs.replay` publishes
it again.  The logs also say which delivery groups are replays (:meth:`InputLogs.group_seen`)
and which Spark batches are open (logged, their driver's commit still to come).

Threads: the receive thread(s) log and check groups under :attr:`InputLogs.gate`; the
request threads seal, truncate and retag under it; the replay thread publishes each record
under it and waits for room outside it; a refresh changes the table of logs under it.  The
open batches and the counters are guarded by the object's own condition.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_storm.codec.tuples import Barrier
from spark_storm.errors import CheckpointError
from spark_storm.messaging.api import GroupKey
from spark_storm.messaging.wire import BatchHeader
from spark_storm.state import NO_EPOCH, InputLog, LogRecord, StateBackend

if TYPE_CHECKING:
    from spark_storm.worker.state import WorkerState

__all__ = ["InputLogs"]

logger = logging.getLogger(__name__)


class InputLogs:
    """The input logs of one worker's source tasks.

    Parameters
    ----------
    state : WorkerState
    backend : callable
        Returns the worker's state backend (where the logs are).
    writer : str
        This process's name in the logs (``host_port_pid``): a task that moved has had two writers.
    mark_dirty : callable
        Tells the worker its uncommitted state cannot be trusted (a failed append, a replay that failed).
    """

    def __init__(
        self, state: WorkerState, backend: Callable[[], StateBackend], writer: str, mark_dirty: Callable[[str], None]
    ) -> None:
        self._state = state
        self._backend = backend
        self._writer = writer
        self._mark_dirty = mark_dirty
        #: Orders what the receive path accepts against barrier injections, rollbacks and the replay.
        self.gate = threading.RLock()
        self._cond = threading.Condition()
        #: After a PAUSE, until the replay caught up: what sources accept is logged, not published.
        self.replaying = False
        self._logs: dict[int, InputLog] = {}
        self._batches: dict[str, int] = {}  # per query, the last batch in committed state
        self._unaccepted: set[GroupKey] = set()  # groups whose appends failed part way
        #: Coordinated batches (a Spark driver's, BATCH_HEADER bit 0x80) logged here and not
        #: committed yet: query id -> (newest such batch, when a group of it last came).
        self._open_batches: dict[str, tuple[int, float]] = {}
        self._last_group: float | None = None
        self.logged_groups = 0
        self.replayed_records = 0
        #: Resets a log the first time it opens, when the topology starts from a savepoint (seed.py).
        self.seed: Callable[[int, InputLog], None] | None = None

    # --- the table of logs --------------------------------------------------------------------------
    def _is_source(self, task: int) -> bool:
        plan = self._state.plan
        return plan.topology.components[plan.task_component[task]].source

    def open(self) -> int:
        """Open the local source tasks' logs (at start); return the last epoch a barrier closed in them."""
        epoch = NO_EPOCH
        for task in sorted(self._state.local_tasks):
            if self._is_source(task):
                epoch = max(epoch, self._open(task).last_barrier())
        return epoch

    def _open(self, task: int) -> InputLog:
        log = self._logs.get(task)
        if log is not None:
            return log
        log = self._backend().input_log(task, self._writer)
        if self.seed is not None:
            self.seed(task, log)
        self._logs[task] = log
        for query, batch in log.committed_batches().items():
            self._batches[query] = max(batch, self._batches.get(query, batch))
        now = time.monotonic()
        with self._cond:
            for query, batch, _partition, _sequence in log.keys():  # noqa: SIM118 (an InputLog, not a dict)
                # After a restart: a logged group of a query a driver has committed before, and of
                # a batch it has not, is a coordinated batch still open.
                if batch > self._batches.get(query, batch):
                    newest = self._open_batches.get(query, (batch, now))[0]
                    self._open_batches[query] = (max(batch, newest), now)
        if log.keys() or any(True for _ in log.entries(NO_EPOCH)):
            self._mark_dirty(f"source task {task} has input logged by an earlier run")
        return log

    def follow_plan(self) -> None:
        """Open the logs of source tasks that moved here, drop those that moved away (a refresh)."""
        local = self._state.local_tasks
        with self.gate:
            for task in sorted(local):
                if self._is_source(task):
                    self._open(task)
            for task in [t for t in self._logs if t not in local]:
                self._logs.pop(task)

    # --- the receive path (under the gate) -----------------------------------------------------------
    def group_seen(self, key: GroupKey) -> bool:
        """Whether a group is a replay: its batch is committed, or it is in an input log whole."""
        query, batch = key[0], key[1]
        if self._batches.get(query, -1) >= batch:
            return True
        if key in self._unaccepted:  # logged in part only: the sender's retry is new input
            return False
        return any(log.has(key) for log in self._logs.values())

    def log_group(self, key: GroupKey | None, by_task: list[tuple[int, list[bytes]]], epoch: int) -> None:
        """Append what source tasks accepted of one message or group to their logs, as ``epoch``, before any ack.

        A group is accepted only once every task's share is logged.  If an append fails part
        way, the shares logged already stay (a rollback's replay counts a group once per log),
        the worker is marked dirty, the group's key is not taken as seen, and the error goes on
        to the caller, so the group fails and its sender's retry is logged and queued as new.
        """
        try:
            for task, payloads in by_task:
                log = self._logs.get(task) or self._open(task)
                log.append(LogRecord(key, list(payloads)), epoch)
        except Exception as exc:
            if key is not None:
                self._unaccepted.add(key)
            self._mark_dirty(f"an input-log append failed: {type(exc).__name__}: {exc}")
            raise
        if key is not None:
            self._unaccepted.discard(key)
            with self._cond:
                self.logged_groups += 1
                self._last_group = time.monotonic()

    def note_group(self, header: BatchHeader) -> None:
        """Note a delivery group the receive path logged (under the gate): a coordinated batch is open."""
        if not header.coordinated or header.batch_id <= self._batches.get(header.query_id, -1):
            return
        with self._cond:
            newest = self._open_batches.get(header.query_id, (header.batch_id, 0.0))[0]
            self._open_batches[header.query_id] = (max(newest, header.batch_id), time.monotonic())

    # --- a round's steps (the request threads) --------------------------------------------------------
    def seal(self, epoch: int, generation: int) -> list[tuple[int, Callable[[], None]]]:
        """Close every log's segment at barrier ``epoch`` and queue the barrier at its source task (under the gate).

        Returns the fsyncs that make each sealed segment durable, to run with the gate released.
        """
        state = self._state
        sealed: list[tuple[int, Callable[[], None]]] = []
        for task in sorted(state.local_tasks):
            if not self._is_source(task):
                continue
            sealed.append((task, self._open(task).seal(epoch)))
            queue = state.queue_of(task)
            if queue is not None:  # never waits: the gate is held
                queue.publish([(task, Barrier(epoch, generation, -1))], [0], wait=False)
        return sealed

    def committed(self, epoch: int, batches: dict[str, int]) -> None:
        """Drop what ``epoch`` covers and record the Spark batches it holds (a COMMIT)."""
        with self.gate:
            for log in self._logs.values():
                if batches:
                    log.set_committed_batches(batches)
                log.truncate(epoch)
            for query, batch in batches.items():
                self._batches[query] = max(batch, self._batches.get(query, batch))
            self._unaccepted = {k for k in self._unaccepted if self._batches.get(k[0], -1) < k[1]}
        with self._cond:
            for query, batch in batches.items():
                if self._open_batches.get(query, (batch + 1, 0.0))[0] <= batch:
                    del self._open_batches[query]

    def rolled_back(self, epoch: int) -> None:
        """Cut the logs back to committed ``epoch``: what came after it becomes the next epoch (under the gate)."""
        for log in self._logs.values():
            log.truncate(epoch)
            log.retag(epoch, epoch + 1)

    def savepoint_view(self, committed: int) -> dict[str, Any]:
        """Return what a savepoint at ``committed`` keeps of the logs: batches, kept keys, records after it.

        ``kept`` holds, per source component, the groups of open batches that committed
        epochs took in whole (a restored topology takes them as replays); groups logged after
        ``committed`` are not in the savepoint (``uncommitted`` counts their records).
        """
        plan = self._state.plan
        kept: dict[str, list[list[Any]]] = {}
        uncommitted = 0
        with self.gate:
            for task, log in sorted(self._logs.items()):
                kept.setdefault(plan.task_component[task], []).extend(list(k) for k in log.kept())
                uncommitted += sum(1 for _ in log.entries(committed))
            batches = dict(self._batches)
        return {"batches": batches, "kept": kept, "uncommitted": uncommitted}

    # --- the replay -------------------------------------------------------------------------------------
    def replay(self, epoch: int, generation: int, current: Callable[[], int]) -> None:
        """Publish every record logged after ``epoch`` again, untracked, until caught up (a thread of its own).

        ``current()`` is the worker's generation: a newer one means another rollback took over.
        """
        done: dict[int, int] = {}
        receiver = self._state.receiver
        try:
            while True:
                progressed = False
                with self.gate:
                    logs = list(self._logs.items())
                for task, log in logs:
                    records = list(log.replayable(epoch))
                    for record in records[done.get(task, 0) :]:
                        items = receiver.decode_replay(task, record.payloads)
                        # Published under the gate, as the receive path publishes, so a PAUSE (which
                        # takes the gate to stop the executors and raise the generation) finds this
                        # record queued before it clears the queues, or sees it never published; the
                        # wait for room is outside the gate, so a full queue never holds a PAUSE up.
                        while True:
                            with self.gate:
                                if current() != generation:
                                    return  # another rollback took over
                                full = receiver.publish_replay(task, items)
                            if full is None:
                                break
                            full.wait_for_room(sum(w for _, w in items), 0.05)
                        with self._cond:
                            self.replayed_records += 1
                        progressed = True
                    done[task] = len(records)
                if progressed:
                    continue
                with self.gate:  # nothing new: what the receive path accepts from now on it publishes itself
                    if all(sum(1 for _ in log.replayable(epoch)) == done.get(t, 0) for t, log in self._logs.items()):
                        self._replayed(generation, current)
                        return
        except Exception as exc:  # a corrupt log: the next round fails with it (and says so)
            logger.exception("worker %s: replay after epoch %d failed", self._state.slot, epoch)
            self._mark_dirty(f"replay failed: {exc}")
            with self.gate:
                self._replayed(generation, current)

    def _replayed(self, generation: int, current: Callable[[], int]) -> None:
        # Caller holds the gate.  An older replay's end is not this one's.
        if current() == generation:
            with self._cond:
                self.replaying = False
                self._cond.notify_all()

    def wait_replayed(self, generation: int, current: Callable[[], int], deadline: float) -> None:
        """Wait until the replay of ``generation`` caught up (a PREPARE after a rollback).

        Raises
        ------
        CheckpointError
            It did not by ``deadline`` (``time.monotonic()``).
        """
        with self._cond:
            while self.replaying and current() == generation:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    msg = "the replay after the rollback did not finish in time (topology.state.commit.timeout.ms)"
                    raise CheckpointError(msg)
                self._cond.wait(min(0.5, remaining))

    # --- what STATUS and /health say -------------------------------------------------------------------
    def open_batch_idle_s(self) -> float | None:
        """Seconds since a group came of the least idle coordinated batch open here; None if none is."""
        with self._cond:
            return self._open_idle(time.monotonic())

    def _open_idle(self, now: float) -> float | None:  # under _cond
        return min((now - t for _, t in self._open_batches.values()), default=None)

    def status(self) -> dict[str, Any]:
        """Return the logs' part of STATUS: the age of the last group, and the least idle open Spark batch."""
        now = time.monotonic()
        with self._cond:
            return {
                "replaying": self.replaying,
                "last_group_age_s": None if self._last_group is None else now - self._last_group,
                "open_batch_idle_s": self._open_idle(now),
            }
