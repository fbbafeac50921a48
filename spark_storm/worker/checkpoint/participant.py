"""A worker's part in the checkpoint protocol (docs/design/state.md): STATUS, PAUSE, RESUME, PREPARE, COMMIT.

:class:`CheckpointManager` answers one coordinator at a time (a lease), and keeps what the
rounds decide: the generation (raised by a rollback's PAUSE), the epoch the last barrier
opened, the committed epoch, whether the worker is *dirty* (its uncommitted state cannot be
trusted: the next round rolls everyone back), and which stateful tasks wrote each epoch.  The
worker's input logs are its :attr:`CheckpointManager.inputs`; each executor's side is the
:class:`~spark_storm.worker.checkpoint.alignment.ExecutorCheckpoints` it hands out.

Threads: a request is decoded on the receive thread and run on a thread of its own, one
mutating request at a time (``_requests``); the rollback steps own the executors between a
PAUSE and its RESUME (``activation``); counters, the generation seen by tasks and the
prepared table are guarded by ``_cond``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_storm.config import Config
from spark_storm.errors import CheckpointError, ConfigError, CoordinatorBusyError, StateError
from spark_storm.messaging.api import REQUEST_BUSY, REQUEST_FAILED, REQUEST_OK
from spark_storm.reports import CheckpointMetrics
from spark_storm.state import NO_EPOCH, StateWriter, TaskStore, make_backend
from spark_storm.state.protocol import (
    COMMIT,
    INTERVAL_PRIORITY,
    OP_NAMES,
    PAUSE,
    PREPARE,
    RELEASE,
    RESUME,
    SAVEPOINT,
    STATUS,
    decode_body,
    encode_body,
)
from spark_storm.state.savepoint import write_task
from spark_storm.topology.model import resolve_class
from spark_storm.topology.windows import window_spec
from spark_storm.worker.checkpoint.alignment import ExecutorCheckpoints
from spark_storm.worker.checkpoint.inputs import InputLogs
from spark_storm.worker.checkpoint.seed import Seeder
from spark_storm.worker.checkpoint.settings import CheckpointSettings
from spark_storm.worker.stateful import is_stateful

if TYPE_CHECKING:
    from spark_storm.worker.executor import Executor
    from spark_storm.worker.state import WorkerState

__all__ = ["CheckpointManager", "Reply"]

logger = logging.getLogger(__name__)

Reply = Callable[[int, bytes], None]


def _lost_of(conn: Any) -> int:
    """Return what a client connection counted as lost."""
    lost = conn.metrics().get("lost", 0)
    return int(lost) if isinstance(lost, int | float) else 0


class CheckpointManager:
    """A worker's generation, epochs and answers to the coordinators (a stateful topology's).

    Parameters
    ----------
    state : WorkerState
    conf : Config
    """

    stateful = True

    def __init__(self, state: WorkerState, conf: Config) -> None:
        self.state = state
        self.settings = CheckpointSettings.from_conf(conf)
        self._cond = threading.Condition()
        self.backend = make_backend(conf, state.plan.topology.name)
        #: Makes the executors' changelog entries durable off their threads, in order.
        self.writer = StateWriter()
        slot = state.slot
        self.inputs = InputLogs(state, lambda: self.backend, f"{slot.host}_{slot.port}_{os.getpid()}", self.mark_dirty)
        #: Starting from a savepoint (topology.state.savepoint.path): checked here, before anything opens.
        self.seeder = Seeder.from_conf(conf, state.plan)
        self.inputs.seed = self.seeder.seed_log if self.seeder is not None else None
        self._lease: tuple[str, float, int] | None = None  # (coordinator, time of its last request, priority)
        self._priority_seen: float | None = None  # when a priority coordinator (a Spark driver) last asked
        self.generation = 0
        self.epoch = NO_EPOCH
        self.committed = NO_EPOCH
        self.paused = False
        self.dirty_reasons: list[str] = []
        self._stores: dict[int, TaskStore] = {}
        self._prepared: dict[int, int] = {}
        #: Per local task (stateful or not), the last epoch whose barrier it passed on in this generation.
        self._passed: dict[int, int] = {}
        #: The epoch of the last PREPARE this worker answered ready (not dirty), and its generation:
        #: STATUS reports it, so a coordinator can tell an epoch every worker prepared (roll forward).
        self._ready: tuple[int, int] = (NO_EPOCH, -1)
        self._failed: dict[int, str] = {}
        self._requests = threading.Lock()  # mutating requests run one at a time
        self._lost_seen: dict[Any, int] = {}  # messages each client connection counted lost, at the last PREPARE
        self._was_active: set[Any] = set()
        #: Orders executor (de)activation by the worker (start, HTTP, refresh, stop) against a
        #: rollback's PAUSE and RESUME, which own the executors in between (set_active).
        self.activation = threading.Lock()
        self.counters = {"rollbacks": 0, "committed_epochs": 0, "interval_rounds": 0, "interval_stood_aside": 0}
        self.last_commit_at: float | None = None

    # --- the worker's calls ------------------------------------------------------------------------
    @property
    def gate(self) -> threading.RLock:
        """The input logs' gate: what the receive path accepts, against barriers and rollbacks."""
        return self.inputs.gate

    def for_executor(self, executor: Executor) -> ExecutorCheckpoints:
        """Return the checkpoint side of a new executor (its barrier alignment and its tasks' changelogs)."""
        return ExecutorCheckpoints(executor, self)

    def open(self) -> None:
        """Before the worker accepts anything: open its source tasks' input logs and learn its epoch.

        The epoch is where the last barrier left this worker's tasks (their changelogs and
        their logs' barrier markers): input accepted from now on belongs to the epoch after it.
        """
        plan = self.state.plan
        epoch = self.inputs.open()
        committed = NO_EPOCH
        for spec in plan.executors_of(self.state.slot):
            if is_stateful(resolve_class(plan.topology.components[spec.component].bolt, "bolt")):
                for task in spec.tasks:
                    store = self.task_store(task)
                    committed = max(committed, store.committed())
                    epoch = max([epoch, committed, *store.epochs()])
        with self._cond:
            self.epoch = max(self.epoch, epoch)
            self.committed = max(self.committed, committed)

    def task_store(self, task: int) -> TaskStore:
        """Return the changelog of local stateful task ``task`` (one object per task, kept)."""
        store = self._stores.get(task)
        if store is None:
            store = self.backend.task_store(task)
            if self.seeder is not None:
                self.seeder.seed_task(task, store)
            self._stores[task] = store
        return store

    def note_restored(self, task: int, epoch: int, had_state: bool) -> None:
        """Note that a stateful task restored ``epoch`` (at its executor's start)."""
        with self._cond:
            self.committed = max(self.committed, epoch)
            self.epoch = max(self.epoch, epoch)
            self._prepared[task] = epoch
        if had_state:
            self.mark_dirty(f"task {task} restored epoch {epoch} at start")

    def executors_moved(self, added: list[str], removed: list[str]) -> None:
        """Follow a refresh that moved executors in or out: their uncommitted effects went with the old ones."""
        self.inputs.follow_plan()
        if added or removed:
            self.mark_dirty(f"executors moved (+{', '.join(added) or '-'} / -{', '.join(removed) or '-'})")

    def count(self, name: str) -> None:
        """Add one to counter ``name`` (any thread)."""
        with self._cond:
            self.counters[name] += 1

    def mark_dirty(self, reason: str) -> None:
        """Note that uncommitted state here cannot be trusted: the next round rolls everyone back."""
        with self._cond:
            if reason not in self.dirty_reasons:
                self.dirty_reasons.append(reason)
                del self.dirty_reasons[:-8]
                logger.warning("worker %s: state is dirty: %s", self.state.slot, reason)

    def log_group(self, key: Any, by_task: list[tuple[int, list[bytes]]]) -> None:
        """Log what source tasks accepted (the receive path, under the gate), as the epoch after the last barrier."""
        self.inputs.log_group(key, by_task, self.epoch + 1)

    def set_active(self, executors: list[Executor], on: bool) -> None:
        """(De)activate executors for the worker, unless a rollback owns them: then its RESUME will.

        A worker's start activates its executors once its connections are ready, and the HTTP
        endpoints and a refresh can switch them too; none of that may reach an executor
        between a PAUSE and its RESUME, while its state is restored.
        """
        with self.activation:
            if self.paused:
                specs = {e.spec for e in executors}
                self._was_active = self._was_active | specs if on else self._was_active - specs
                return
            for executor in executors:
                if on:
                    executor.activate()
                else:
                    executor.deactivate()

    def drain_writes(self, timeout: float) -> bool:
        """Wait until every changelog entry handed to the writer is written (or failed)."""
        return self.writer.drain(timeout)

    def close(self) -> None:
        """Let pending changelog writes end, then close the backend (input-log segments made durable)."""
        if not self.writer.close(5.0):
            logger.warning("worker %s: changelog writes still running at close", self.state.slot)
        self.backend.close()

    # --- tasks report (executor threads, the writer thread) ----------------------------------------
    def task_prepared(self, task: int, epoch: int, generation: int) -> None:
        """Task ``task``'s entry for ``epoch`` is durable (the writer thread); stale generations are ignored."""
        with self._cond:
            if generation != self.generation:
                return  # a rollback overtook this epoch: its round failed already
            self._prepared[task] = max(epoch, self._prepared.get(task, NO_EPOCH))
            self._failed.pop(task, None)
            self._cond.notify_all()

    def task_passed(self, task: int, epoch: int, generation: int) -> None:
        """Task ``task`` passed barrier ``epoch`` on (its executor thread): what came before it has arrived.

        A payload of the epoch that arrived undecodable marked the worker dirty before this
        (the receive thread decodes a connection's messages in order, the barrier after the
        data), so a PREPARE that waits for it sees the hole.
        """
        with self._cond:
            if generation != self.generation:
                return  # a rollback overtook this epoch
            self._passed[task] = max(epoch, self._passed.get(task, NO_EPOCH))
            self._cond.notify_all()

    def task_failed(self, task: int, epoch: int, error: str, generation: int) -> None:
        """Task ``task`` could not save ``epoch``: the round fails, and the next one rolls back."""
        with self._cond:
            if generation != self.generation:
                return  # a rollback overtook this epoch: it is discarded anyway
            self._failed[task] = f"task {task} could not write epoch {epoch}: {error}"
            self._cond.notify_all()
        self.mark_dirty(f"task {task} failed to write epoch {epoch}")

    # --- requests ------------------------------------------------------------------------------------
    def handle(self, op: int, body: bytes, reply: Reply) -> None:
        """Answer a coordinator's request (the receive thread calls this; slow work goes elsewhere)."""
        name = OP_NAMES.get(op, str(op))
        try:
            args = decode_body(body, f"{name} request")
            if op == STATUS:
                reply(REQUEST_OK, encode_body(self.status()))
                return
            if op not in (PAUSE, RESUME, PREPARE, COMMIT, SAVEPOINT, RELEASE):
                reply(REQUEST_FAILED, f"unknown checkpoint request op {op}".encode())
                return
            priority = int(args.get("priority", INTERVAL_PRIORITY))
            busy = self._take_lease(str(args.get("coordinator", "?")), priority)
            if busy is not None:
                reply(REQUEST_BUSY, busy.encode())
                return
        except StateError as exc:
            reply(REQUEST_FAILED, str(exc).encode())
            return
        threading.Thread(
            target=self._run, args=(op, args, priority, reply), name=f"spark-storm-checkpoint-{name}", daemon=True
        ).start()

    def _run(self, op: int, args: dict[str, Any], priority: int, reply: Reply) -> None:
        name = OP_NAMES[op]
        try:
            with self._requests:
                if op == PAUSE:
                    self._pause(int(args["generation"]))
                    answer: dict[str, Any] = {"ok": True}
                elif op == RESUME:
                    self._resume(int(args["epoch"]), int(args["generation"]))
                    answer = {"ok": True}
                elif op == PREPARE:
                    waiter = self._prepare(int(args["epoch"]), int(args["generation"]), priority)
                elif op == COMMIT:
                    self._commit(
                        int(args["epoch"]), {str(q): int(b) for q, b in dict(args.get("batches") or {}).items()}
                    )
                    answer = {"ok": True}
                elif op == SAVEPOINT:
                    answer = self._savepoint(Path(str(args["dir"])), int(args["epoch"]))
                elif op == RELEASE:
                    with self._cond:
                        if self._lease is not None and self._lease[0] == str(args.get("coordinator")):
                            self._lease = None
                    answer = {"ok": True}
            if op == PREPARE:
                answer = waiter()
            reply(REQUEST_OK, encode_body(answer))
        except CoordinatorBusyError as exc:  # an interval round's PREPARE met a Spark batch: it stands aside
            reply(REQUEST_BUSY, str(exc).encode())
        except (StateError, ConfigError, KeyError, TypeError, ValueError) as exc:
            logger.warning("worker %s: %s refused: %s", self.state.slot, name, exc)
            reply(REQUEST_FAILED, f"{type(exc).__name__}: {exc}".encode())
        except Exception as exc:  # anything else is a bug here: answer it (the round retries) and log it whole
            logger.exception("worker %s: %s failed", self.state.slot, name)
            reply(REQUEST_FAILED, f"{type(exc).__name__}: {exc}".encode())

    def _take_lease(self, coordinator: str, priority: int) -> str | None:
        """Let ``coordinator`` change things unless another did lately (and ranks as high); else say why not.

        The interval rounds (:data:`INTERVAL_PRIORITY`) also stand aside while a Spark driver
        was heard within the lease and while a Spark batch is open here, at every request: a
        COMMIT frees the lease, and a round that started before the driver came must not go on
        (a retry of it committed an epoch between the driver's commit and its next batch).
        """
        if priority <= INTERVAL_PRIORITY and (driven := self._driven()) is not None:
            return driven
        now = time.monotonic()
        lease_s = self.settings.lease_s
        with self._cond:
            if priority > INTERVAL_PRIORITY:
                self._priority_seen = now
            lease = self._lease
            if lease is not None and lease[0] != coordinator and now - lease[1] < lease_s and lease[2] >= priority:
                holder, since, _ = lease
                return (
                    f"busy: coordinated by {holder} (its lease ends in {lease_s - (now - since):.1f}s; "
                    "topology.state.coordinator.lease.ms)"
                )
            self._lease = (coordinator, now, priority)
        return None

    def _driven(self) -> str | None:
        """Say why a Spark query drives this worker now (an interval round must stand aside), or None."""
        open_idle = self.inputs.open_batch_idle_s()
        now = time.monotonic()
        with self._cond:
            seen = self._priority_seen
        if seen is not None and now - seen < self.settings.lease_s:
            return (
                f"busy: a Spark driver coordinated this worker {now - seen:.1f}s ago "
                "(the interval rounds wait topology.state.coordinator.lease.ms)"
            )
        if open_idle is not None and open_idle < self.settings.batch_hold_s:
            return (
                f"busy: a Spark batch its driver has not committed is open here (its last group came "
                f"{open_idle:.1f}s ago; the interval rounds wait topology.state.coordinator.batch.hold.ms)"
            )
        return None

    def status(self) -> dict[str, Any]:
        """Return what STATUS answers."""
        inputs = self.inputs.status()
        with self._cond:
            now = time.monotonic()
            lease = self._lease
            return {
                "lease_holder": None if lease is None else lease[0],
                "lease_age_s": None if lease is None else now - lease[1],
                "priority_age_s": None if self._priority_seen is None else now - self._priority_seen,
                "worker": str(self.state.slot),
                "stateful": True,
                "epoch": self.epoch,
                "committed": self.committed,
                "prepared": self._ready[0] if self._ready[1] == self.generation else NO_EPOCH,
                "generation": self.generation,
                "dirty": bool(self.dirty_reasons),
                "reasons": list(self.dirty_reasons),
                **inputs,
            }

    def _executors(self) -> list[Executor]:
        return list(self.state.executors.values())

    # --- a rollback: PAUSE, then RESUME -------------------------------------------------------------------
    def _pause(self, generation: int) -> None:
        with self.activation:
            self._pause_executors(generation)

    def _pause_executors(self, generation: int) -> None:
        if generation < self.generation:
            msg = f"PAUSE of generation {generation}, but this worker is at {self.generation} already"
            raise CheckpointError(msg)
        if generation == self.generation and self.paused:
            return  # a retried PAUSE
        state = self.state
        executors = self._executors()
        if not self.paused:  # paused twice, the first PAUSE knows which executors were active (now none is)
            self._was_active = {e.spec for e in executors if e.active.is_set()}
        with self.gate:  # taken while the executors still run: a receive thread holding it drains
            # Stop the executors first, then raise the generation: an executor reads the generation
            # before it takes a batch, so a batch taken before this PAUSE emits under the old one
            # and its output is dropped on arrival (by peers paused already) or cleared below.
            for executor in executors:
                executor.deactivate()  # returns once no take is under way
            with self._cond:
                self.generation = generation  # from now on, payloads of older generations are dropped on arrival
            self.paused = True
            self.inputs.replaying = True  # what sources accept is logged only: the replay publishes it
        # The gate is released: a receive thread may still need it to let a blocked sender go.
        # Until its RESUME this worker needs a rollback: a coordinator that died in between
        # leaves it paused, and the next round (anybody's) sees it dirty and rolls back again.
        self.mark_dirty("paused for a rollback that has not resumed")
        deadline = time.monotonic() + 10.0
        while True:  # empty the queues until no executor is inside a batch (one blocked on a full queue goes on)
            for executor in executors:
                executor.queue.clear()
            if not any(e.busy for e in executors):
                break
            if time.monotonic() > deadline:
                stuck = [str(e.spec) for e in executors if e.busy]
                msg = f"executors {stuck} did not stop within 10s to roll back"
                raise CheckpointError(msg)
            time.sleep(0.001)
        for executor in executors:
            executor.drop_queued()
        if not state.transfer.clear():
            msg = "the transfer thread did not clear its queue within 5s to roll back"
            raise CheckpointError(msg)
        released = state.acker.release_all()
        logger.warning(
            "worker %s: paused for a rollback (generation %d); %d pending tuple trees released",
            state.slot,
            generation,
            released,
        )

    def _resume(self, epoch: int, generation: int) -> None:
        with self.activation:
            self._resume_executors(epoch, generation)

    def _resume_executors(self, epoch: int, generation: int) -> None:
        if generation != self.generation or not self.paused:
            msg = f"RESUME of generation {generation}, but this worker is at {self.generation} (paused: {self.paused})"
            raise CheckpointError(msg)
        if epoch < self.committed:
            # A coordinator that read STATUS before another one's COMMIT (a Spark driver and the
            # interval rounds, racing) would roll back below a committed epoch, whose input the
            # commit truncated: refuse, so the next round reads STATUS again (bench.chaos, D4).
            msg = f"RESUME to epoch {epoch}, but epoch {self.committed} is committed here; read STATUS again"
            raise CheckpointError(msg)
        state = self.state
        timeout = self.settings.commit_timeout_s
        if not self.writer.drain(timeout):  # no late write may land on a cut-back changelog
            msg = f"changelog writes still running after {timeout:.0f}s; the rollback waits for them"
            raise CheckpointError(msg)
        with self.gate:
            for executor in self._executors():
                executor.checkpoints.rollback(epoch)
            self.inputs.rolled_back(epoch)
            with self._cond:
                self.epoch = epoch
                self.committed = max(self.committed, epoch)
                self._prepared = dict.fromkeys(self._prepared, epoch)
                self._passed = {t: min(e, epoch) for t, e in self._passed.items()}
                self._failed.clear()
                self.dirty_reasons = []
                self.counters["rollbacks"] += 1
            self.inputs.replaying = True
            self.paused = False
            for executor in self._executors():
                if executor.spec in self._was_active:
                    executor.activate()
        threading.Thread(
            target=self.inputs.replay,
            args=(epoch, generation, lambda: self.generation),
            name="spark-storm-replay",
            daemon=True,
        ).start()
        logger.warning("worker %s: rolled back to epoch %d (generation %d); replaying", state.slot, epoch, generation)

    # --- a round: PREPARE, then COMMIT ------------------------------------------------------------------
    def _prepare(self, epoch: int, generation: int, priority: int) -> Callable[[], dict[str, Any]]:
        if generation != self.generation:
            msg = f"PREPARE for generation {generation}, but this worker is at {self.generation}: roll back first"
            raise CheckpointError(msg)
        if self.paused:
            msg = "PREPARE while paused for a rollback: RESUME first"
            raise CheckpointError(msg)
        timeout = self.settings.commit_timeout_s
        deadline = time.monotonic() + timeout
        self.inputs.wait_replayed(generation, lambda: self.generation, deadline)
        sealed: list[tuple[int, Callable[[], None]]] = []
        with self.gate:
            # Under the gate, where groups are logged: a group of a Spark batch that came since the
            # request was let in would fall on both sides of an interval round's barrier.
            if priority <= INTERVAL_PRIORITY and (driven := self._driven()) is not None:
                raise CoordinatorBusyError(driven)
            if epoch > self.epoch:
                sealed = self.inputs.seal(epoch, generation)
                with self._cond:
                    self.epoch = epoch
        for task, make_durable in sealed:  # the fsyncs, with the gate released: receiving goes on
            try:
                make_durable()
            except Exception as exc:  # a retried PREPARE would not seal again: the next round rolls back
                msg = f"task {task}'s input log up to barrier {epoch} was not made durable: {exc}"
                self.mark_dirty(msg)
                raise CheckpointError(msg) from exc
        executors = self._executors()
        stateful = [t for e in executors if e.checkpoints.stateful for t in e.spec.tasks]
        # Every local task, stateless ones too: the epoch is ready here only once barrier ``epoch``
        # passed each of them.  A payload of the epoch that arrives after this answer and cannot
        # be decoded (a hole, bench.chaos seed 1001 #159) would mark the worker dirty too late:
        # the epoch would commit without it, and the next rollback, to that epoch, could not
        # bring it back (the commit truncated the input logs).
        local = [t for e in executors for t in e.spec.tasks]

        def wait() -> dict[str, Any]:
            self._check_transport_losses()
            spoiled = self._await_barrier(epoch, generation, stateful, local, deadline)
            if spoiled is not None:
                return spoiled
            self._check_transport_losses()  # what the transport lost until the barrier passed, too
            with self._cond:
                if self.dirty_reasons:
                    return {"epoch": epoch, "dirty": True, "generation": generation}
                if self.generation != generation:
                    msg = f"a rollback (generation {self.generation}) overtook epoch {epoch}"
                    raise CheckpointError(msg)
                if (generation, epoch) > (self._ready[1], self._ready[0]):
                    self._ready = (epoch, generation)
                return {"epoch": epoch, "dirty": False, "generation": generation}

        return wait

    def _await_barrier(
        self, epoch: int, generation: int, stateful: list[int], local: list[int], deadline: float
    ) -> dict[str, Any] | None:
        """Wait until every stateful task wrote ``epoch`` and barrier ``epoch`` passed every local task.

        Returns the PREPARE's answer if the epoch was spoiled meanwhile (the worker is dirty),
        else None.

        Raises
        ------
        CheckpointError
            A task could not write the epoch, a rollback overtook it, or the deadline passed.
        """
        with self._cond:
            while True:
                failed = [self._failed[t] for t in stateful if t in self._failed]
                if failed:
                    raise CheckpointError("; ".join(failed))
                if self.dirty_reasons:  # a barrier behind a loss may never come: spoiled now, not at the timeout
                    return {"epoch": epoch, "dirty": True, "generation": generation}
                if self.generation != generation:
                    msg = f"a rollback (generation {self.generation}) overtook epoch {epoch}"
                    raise CheckpointError(msg)
                late = [t for t in stateful if self._prepared.get(t, NO_EPOCH) < epoch]
                behind = [t for t in local if self._passed.get(t, NO_EPOCH) < epoch]
                if not late and not behind:
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timeout = self.settings.commit_timeout_s
                    if late:
                        msg = f"tasks {late} did not write epoch {epoch} within {timeout:.0f}s"
                    else:
                        msg = f"barrier {epoch} did not pass tasks {behind} within {timeout:.0f}s"
                    raise CheckpointError(msg)
                self._cond.wait(min(remaining, 0.5))

    def _check_transport_losses(self) -> None:
        """Mark the state dirty if a connection to another worker lost messages since the last PREPARE.

        A transport drops only by the user's choice (``storm.messaging.send.overflow.policy:
        drop``) or when a connection closes with messages the peer never acknowledged; either
        way tuples of this epoch may be missing downstream, so it must not commit.
        """
        now = self.state.messages_lost()
        # Connections closed since (a refresh) are read once more: closing counts what they never
        # got acknowledged.  Keyed by the connection itself (held until then), not by its id.
        for conn in self._lost_seen:
            if conn not in now:
                now[conn] = _lost_of(conn)
        grown = sum(max(0, lost - self._lost_seen.get(conn, 0)) for conn, lost in now.items())
        self._lost_seen = {conn: lost for conn, lost in now.items() if conn in self.state.connections.values()}
        if grown:
            self.mark_dirty(f"{grown} messages to other workers were lost by the transport")

    def _commit(self, epoch: int, batches: dict[str, int]) -> None:
        if epoch > self.epoch:
            msg = f"COMMIT of epoch {epoch}, which this worker has not prepared (it is at {self.epoch})"
            raise CheckpointError(msg)
        if epoch <= self.committed and not batches:
            return
        try:
            for executor in self._executors():
                cp = executor.checkpoints
                if isinstance(cp, ExecutorCheckpoints) and cp.stateful and cp.restored.is_set():  # filled in at restore
                    for store in list(cp.stores.values()):
                        store.commit(epoch)
        except Exception as exc:
            # Every task prepared the epoch (its entry is durable) and the coordinator committed it:
            # it is committed, whatever marker failed to be written.  The worker says so (a rollback
            # never goes below it) and is dirty: the next round's rollback to it writes the missing
            # markers (ExecutorCheckpoints.rollback) instead of discarding the epoch (bench.chaos, D1).
            with self._cond:
                self.committed = max(self.committed, epoch)
            self.mark_dirty(f"epoch {epoch}'s commit marker could not be written: {type(exc).__name__}: {exc}")
            raise
        self.inputs.committed(epoch, batches)
        with self._cond:
            self.committed = max(self.committed, epoch)
            self._lease = None  # the round is over: the next one may be anybody's
            self.counters["committed_epochs"] += 1
        self.last_commit_at = time.time()

    # --- a savepoint ------------------------------------------------------------------------------------
    def _savepoint(self, root: Path, expected: int) -> dict[str, Any]:
        """Copy every local stateful task's committed state into ``root`` (SAVEPOINT; under ``_requests``).

        The coordinator holds the lease from its first request: no epoch commits meanwhile,
        so the entries up to the committed epoch stay where they are while they are copied.
        A worker whose committed epoch is not ``expected`` copies nothing and says so; so does
        a dirty one, with its reasons (another coordinator's rollback may have paused it since
        the savepoint's own round committed: the coordinator rolls back and tries again).
        """
        with self._cond:
            committed, reasons = self.committed, list(self.dirty_reasons)
        answer: dict[str, Any] = {"epoch": committed, "tasks": [], "stateful": True}
        if reasons:
            answer["dirty"] = reasons
            return answer
        if committed != expected:
            return answer
        plan = self.state.plan
        topo = plan.topology
        for spec in plan.executors_of(self.state.slot):
            comp = topo.components[spec.component]
            cls = resolve_class(comp.bolt, "bolt")
            if not is_stateful(cls):
                continue
            ids = list(plan.component_tasks[spec.component])
            windowed = window_spec(comp.conf, spec.component, topo.conf) is not None
            for task in spec.tasks:
                files = write_task(root, spec.component, ids.index(task), self.task_store(task), committed)
                answer["tasks"].append(
                    {
                        "component": spec.component,
                        "index": ids.index(task),
                        "count": len(ids),
                        "state_version": int(getattr(cls, "state_version", 1)),
                        "windowed": windowed,
                        "files": {p: list(v) for p, v in files.items()},
                    }
                )
        answer.update(self.inputs.savepoint_view(committed))
        return answer

    # --- /health -------------------------------------------------------------------------------------
    def metrics(self) -> CheckpointMetrics:
        """Return the worker's checkpoint view, for /health and the UI."""
        status = self.status()
        with self._cond:
            counters = dict(self.counters)
        return {
            "worker": status["worker"],
            "stateful": True,
            "epoch": status["epoch"],
            "committed": status["committed"],
            "generation": status["generation"],
            "dirty": status["dirty"],
            "reasons": status["reasons"],
            "replaying": status["replaying"],
            "last_group_age_s": status["last_group_age_s"],
            "rollbacks": counters["rollbacks"],
            "replayed_records": self.inputs.replayed_records,
            "committed_epochs": counters["committed_epochs"],
            "logged_groups": self.inputs.logged_groups,
            "interval_rounds": counters["interval_rounds"],
            "interval_stood_aside": counters["interval_stood_aside"],
            "provider": self.backend.describe(),
            "last_commit_at": self.last_commit_at,
        }
