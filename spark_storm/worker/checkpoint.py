"""The worker's side of exact state (docs/state.md): barriers, changelogs, input logs, rollbacks.

Two classes, used only when the topology has a stateful component:

* :class:`ExecutorCheckpoints` — one per executor, on its thread: aligns checkpoint
  barriers per task (a channel that delivered barrier ``E`` is held back until every
  upstream task did, as in Flink), then encodes each stateful task's changes as epoch
  ``E``, hands the entry to the worker's :class:`~spark_storm.state.StateWriter` (the
  write and its fsync run off the executor thread), sends ``E`` on to every downstream
  task behind its data, and lets the held items through;
* :class:`CheckpointManager` — one per worker: the input logs of its source tasks, the
  generation, and the answers to the coordinator's requests (STATUS, PAUSE, RESUME,
  PREPARE, COMMIT; :mod:`spark_storm.state.protocol`).  Its ``gate`` orders what the
  receive path accepts against barrier injections and rollbacks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.tuples import BROADCAST_TASK, Barrier
from spark_storm.config import Config
from spark_storm.errors import CheckpointError, ConfigError, RequestTimeoutError, StateError, StormError
from spark_storm.messaging.api import REQUEST_BUSY, REQUEST_FAILED, REQUEST_OK, GroupKey
from spark_storm.messaging.wire import BatchHeader
from spark_storm.reports import CheckpointMetrics, StateMetrics
from spark_storm.state import (
    NO_EPOCH,
    InputLog,
    KeyValueState,
    LogRecord,
    StateWriter,
    TaskStore,
    make_backend,
    provider_settings,
    snapshot_min_keys,
)
from spark_storm.state.protocol import (
    COMMIT,
    OP_NAMES,
    PAUSE,
    PREPARE,
    RESUME,
    STATUS,
    Coordinator,
    WorkerStatus,
    decode_body,
    encode_body,
)
from spark_storm.topology.model import resolve_class
from spark_storm.worker.queue import QueueItem
from spark_storm.worker.stateful import is_stateful
from spark_storm.worker.stats import LatencyHistogram

if TYPE_CHECKING:
    from spark_storm.worker.executor import Executor
    from spark_storm.worker.state import WorkerState

__all__ = ["CheckpointManager", "ExecutorCheckpoints", "IntervalCheckpoints", "topology_is_stateful"]

logger = logging.getLogger(__name__)

Reply = Callable[[int, bytes], None]


def topology_is_stateful(bolt_classes: Mapping[str, object]) -> bool:
    """Whether any component's bolt class keeps checkpointed state."""
    return any(is_stateful(cls) for cls in bolt_classes.values())


def _lost_of(conn: Any) -> int:
    """Return what a client connection counted as lost."""
    lost = conn.metrics().get("lost", 0)
    return int(lost) if isinstance(lost, int | float) else 0


def _channel(payload: Any) -> int:
    """Return the upstream task an executor-queue payload came from (-1: a client)."""
    if type(payload) is list:
        return int(payload[0].source.task) if payload else -2
    if isinstance(payload, Barrier):
        return payload.source_task
    if isinstance(payload, ColumnarBatch):
        return int(payload.source.task)
    return -2


class ExecutorCheckpoints:
    """Barrier alignment and the checkpointed state of one executor's tasks (its thread only)."""

    def __init__(self, executor: Executor, manager: CheckpointManager) -> None:
        self._ex = executor
        self._manager = manager
        plan = manager.state.plan
        component = executor.component
        if component.source:
            upstream = frozenset({-1})
        else:
            upstream = frozenset(t for inp in component.inputs for t in plan.component_tasks[inp.component])
        tasks = list(executor.spec.tasks)
        self.expected = {t: upstream for t in tasks}
        topo = plan.topology
        self.downstream = sorted(
            {
                t
                for stream in component.outputs
                for consumer, _inp in topo.consumers(component.id, stream)
                for t in plan.component_tasks[consumer.id]
            }
        )
        self.aligning: dict[int, tuple[int, set[int]]] = {}
        self.done = dict.fromkeys(tasks, NO_EPOCH)
        self.buffered: dict[int, list[QueueItem]] = {}
        self.stateful = is_stateful(type(next(iter(executor.bolts.values())))) if executor.bolts else False
        self.states: dict[int, KeyValueState] = {}
        self.stores: dict[int, TaskStore] = {}
        self._keys_since_full: dict[int, int] = {}
        self._snapshot_min = manager.snapshot_min_keys
        self.committed_seen = manager.committed
        self.durations = LatencyHistogram()
        self.restores = 0
        self.rollbacks = 0
        self.last_bytes: dict[int, int] = {}
        #: Set once every task's state is restored (at the end of the executor's prepare).
        self.restored = threading.Event()

    # --- start ----------------------------------------------------------------------------
    def restore_all(self) -> None:
        """Give every stateful task its last committed state (at prepare, on the executor thread)."""
        if not self.stateful:
            self.restored.set()
            return
        for task, bolt in self._ex.bolts.items():
            store = self._manager.task_store(task)
            epoch, data = store.restore()
            state = KeyValueState(data)
            self.states[task] = state
            self.stores[task] = store
            self._keys_since_full[task] = 0
            self.done[task] = epoch
            had_state = bool(data) or bool(store.epochs())
            self.restores += had_state  # a task that came back from a checkpoint, not a first start
            self._manager.note_restored(task, epoch, had_state)
            bolt.init_state(state)
            if task in self._ex.windows:  # a windowed task's windows are in its state too
                self._ex.windows[task].load(state)
        self.restored.set()

    # --- the executor's batches -----------------------------------------------------------------
    def process(self, items: list[QueueItem]) -> int:
        """Run items through the bolts, handling barriers in order and holding aligned channels back."""
        weight = 0
        chunk: list[QueueItem] = []
        aligning = self.aligning
        for item in items:
            task, payload = item
            if type(payload) is Barrier:
                if chunk:
                    weight += self._ex._process(chunk)
                    chunk = []
                weight += self._on_barrier(task, payload)
                continue
            if aligning and task in aligning and _channel(payload) in aligning[task][1]:
                self.buffered.setdefault(task, []).append(item)  # after its barrier: the next epoch
                continue
            chunk.append(item)
        if chunk:
            weight += self._ex._process(chunk)
        return weight

    def _on_barrier(self, task: int, barrier: Barrier) -> int:
        manager = self._manager
        if barrier.generation < manager.generation or task == BROADCAST_TASK:
            return 0  # from before a rollback: void
        if barrier.epoch <= self.done.get(task, NO_EPOCH):
            return 0  # seen already (a coordinator retried its PREPARE)
        epoch, seen = self.aligning.get(task, (barrier.epoch, set()))
        if barrier.epoch != epoch:
            manager.mark_dirty(f"task {task} got barrier {barrier.epoch} while aligning {epoch}")
            epoch, seen = barrier.epoch, set()
        seen.add(barrier.source_task)
        if seen >= self.expected[task]:
            self.aligning.pop(task, None)
            return self._complete(task, epoch, barrier.generation)
        self.aligning[task] = (epoch, seen)
        return 0

    def _complete(self, task: int, epoch: int, generation: int) -> int:
        ex = self._ex
        ex.emitter.flush()  # what the task emitted before the barrier leaves before it
        if self.stateful:
            self._save(task, epoch, generation)
        ex.emitter.send_barrier(task, epoch, generation, self.downstream)
        self.done[task] = epoch
        released = self.buffered.pop(task, None)
        return self.process(released) if released else 0

    def _save(self, task: int, epoch: int, generation: int) -> None:
        """Encode ``task``'s entry for ``epoch`` here; the worker's writer makes it durable and reports it.

        The task is prepared (``PREPARE`` can be answered) only once the entry is durable, but
        this thread goes on at once: the next epoch's tuples do not wait for the fsync.
        """
        manager = self._manager
        started = time.perf_counter()
        try:
            full, parts = self._encode(task, epoch)
        except Exception as exc:  # a bolt hook or the codec: report it, the round fails and retries
            logger.exception("task %d: saving epoch %d failed", task, epoch)
            manager.task_failed(task, epoch, f"{type(exc).__name__}: {exc}", generation)
            return
        store = self.stores[task]

        def write() -> None:
            try:
                written = store.write_encoded(epoch, full, parts)
            except Exception as exc:  # the backend: report it, the round fails and retries
                logger.exception("task %d: writing epoch %d failed", task, epoch)
                manager.task_failed(task, epoch, f"{type(exc).__name__}: {exc}", generation)
            else:
                self.durations.record(time.perf_counter() - started)  # barrier to durable
                self.last_bytes[task] = written
                manager.task_prepared(task, epoch, generation)

        try:
            manager.writer.submit(write)
        except CheckpointError as exc:  # the worker is stopping
            manager.task_failed(task, epoch, str(exc), generation)

    def _encode(self, task: int, epoch: int) -> tuple[bool, list[bytes]]:
        """Run the bolt's hooks and encode its changes (or, now and then, the whole state) as ``epoch``."""
        bolt = self._ex.bolts[task]
        state = self.states[task]
        if task in self._ex.windows:  # first what the window engine holds in memory
            self._ex.windows[task].save(state, epoch)
        bolt.pre_prepare(epoch)
        store = self.stores[task]
        since = self._keys_since_full[task] + state.changed
        if since > max(self._snapshot_min, len(state)):
            self._keys_since_full[task] = 0
            return True, store.encode(epoch, True, state.snapshot())
        self._keys_since_full[task] = since
        return False, store.encode(epoch, False, state.take_changes())

    def check_commits(self) -> None:
        """Call ``pre_commit`` once a newer epoch is committed (executor thread, between batches)."""
        committed = self._manager.committed
        if committed > self.committed_seen:
            self.committed_seen = committed
            if self.stateful:
                for task, bolt in self._ex.bolts.items():
                    try:
                        bolt.pre_commit(committed)
                    except Exception as exc:  # a hook's error is the bolt's: report it, keep going
                        self._ex.host.report_error(self._ex.component.id, task, f"pre_commit: {exc!r}")

    # --- rollback (the manager's thread, with the executor quiesced) -------------------------
    def reset(self) -> int:
        """Forget alignment and held items; return their weight."""
        dropped = sum(len(p) for items in self.buffered.values() for _t, p in items)
        self.aligning.clear()
        self.buffered.clear()
        return dropped

    def rollback(self, epoch: int) -> None:
        """Put every stateful task back at ``epoch`` (its changelog's entries after it are dropped)."""
        for task in self.done:
            self.done[task] = min(self.done[task], epoch)
        if not self.stateful:
            return
        if not self.restored.wait(60.0):  # a bolt still in prepare (or failed there: the worker stops)
            msg = f"executor {self._ex.spec} has not restored its state yet (its bolts are still preparing)"
            raise CheckpointError(msg)
        for task, bolt in self._ex.bolts.items():
            bolt.pre_rollback()
            store = self.stores[task]
            store.discard_after(epoch)
            _, data = store.restore(epoch)
            if store.committed() < epoch:
                store.mark_committed(epoch)
            self.states[task].restore(data)
            if task in self._ex.windows:
                self._ex.windows[task].load(self.states[task])
            self._keys_since_full[task] = 0
            self.done[task] = epoch
        self.rollbacks += 1

    def metrics(self) -> StateMetrics:
        """Per stateful component: keys and bytes of state, checkpoint durations, restores, rollbacks."""
        p50, p99 = self.durations.percentile(50), self.durations.percentile(99)
        return {
            "stateful": self.stateful,
            "keys": sum(len(s) for s in list(self.states.values())),  # an HTTP thread, while a restore fills it
            "last_checkpoint_bytes": sum(self.last_bytes.values()),
            "checkpoint_p50_ms": None if p50 is None else round(p50 * 1000, 3),
            "checkpoint_p99_ms": None if p99 is None else round(p99 * 1000, 3),
            "checkpoint_buckets": self.durations.buckets(),  # readers merge executors' p99 from these
            "checkpoints": self.durations.total,
            "restores": self.restores,
            "rollbacks": self.rollbacks,
            "epoch": min(self.done.values(), default=NO_EPOCH),
        }


class CheckpointManager:
    """A worker's input logs, generation and checkpoint requests (docs/state.md).

    Parameters
    ----------
    state : WorkerState
    conf : Config
    """

    def __init__(self, state: WorkerState, conf: Config) -> None:
        self.state = state
        self.gate = threading.RLock()
        self._cond = threading.Condition()
        _, settings = provider_settings(conf)
        self.snapshot_min_keys = snapshot_min_keys(settings)
        self.backend = make_backend(conf, state.plan.topology.name)
        #: Makes the executors' changelog entries durable off their threads, in order.
        self.writer = StateWriter()
        self._prepare_timeout_s = conf.get_int("topology.state.commit.timeout.ms", minimum=1) / 1000
        self._lease_s = conf.get_int("topology.state.coordinator.lease.ms", minimum=1) / 1000
        self._lease: tuple[str, float, int] | None = None  # (coordinator, time of its last request, priority)
        self._priority_seen: float | None = None  # when a priority coordinator (a Spark driver) last asked
        slot = state.slot
        self._writer = f"{slot.host}_{slot.port}_{os.getpid()}"
        self.generation = 0
        self.epoch = NO_EPOCH
        self.committed = NO_EPOCH
        self.paused = False
        self.replaying = False
        self.dirty_reasons: list[str] = []
        self._logs: dict[int, InputLog] = {}
        self._stores: dict[int, TaskStore] = {}
        self._prepared: dict[int, int] = {}
        self._failed: dict[int, str] = {}
        self._batches: dict[str, int] = {}
        self._unaccepted: set[GroupKey] = set()  # groups whose input-log appends failed part way
        #: Coordinated batches (a Spark driver's, BATCH_HEADER bit 0x80) logged here and not
        #: committed yet: query id -> (newest such batch, when a group of it last came).
        self._open_batches: dict[str, tuple[int, float]] = {}
        self._last_group: float | None = None
        self._requests = threading.Lock()  # mutating requests run one at a time
        self._lost_seen: dict[Any, int] = {}  # messages each client connection counted lost, at the last PREPARE
        self._was_active: set[Any] = set()
        #: Orders executor (de)activation by the worker (start, HTTP, refresh, stop) against a
        #: rollback's PAUSE and RESUME, which own the executors in between (set_active).
        self.activation = threading.Lock()
        self.counters = {
            "rollbacks": 0,
            "replayed_records": 0,
            "committed_epochs": 0,
            "logged_groups": 0,
            "interval_rounds": 0,
            "interval_stood_aside": 0,
        }
        self.last_commit_at: float | None = None

    # --- start ----------------------------------------------------------------------------
    def open(self) -> None:
        """Before the worker accepts anything: open its source tasks' input logs and learn its epoch.

        The epoch is where the last barrier left this worker's tasks (their changelogs and
        their logs' barrier markers): input accepted from now on belongs to the epoch after it.
        """
        plan = self.state.plan
        epoch = committed = NO_EPOCH
        for task in sorted(self.state.local_tasks):
            component = plan.topology.components[plan.task_component[task]]
            if component.source:
                epoch = max(epoch, self._open_log(task).last_barrier())
        for spec in plan.executors_of(self.state.slot):
            if is_stateful(resolve_class(plan.topology.components[spec.component].bolt, "bolt")):
                for task in spec.tasks:
                    store = self.task_store(task)
                    committed = max(committed, store.committed())
                    epoch = max([epoch, committed, *store.epochs()])
        with self._cond:
            self.epoch = max(self.epoch, epoch)
            self.committed = max(self.committed, committed)

    def _open_log(self, task: int) -> InputLog:
        log = self._logs.get(task)
        if log is None:
            log = self._logs[task] = self.backend.input_log(task, self._writer)
            for query, batch in log.committed_batches().items():
                self._batches[query] = max(batch, self._batches.get(query, batch))
            now = time.monotonic()
            with self._cond:
                for query, batch, _partition, _sequence in log.keys():  # noqa: SIM118 (an InputLog, not a dict)
                    # After a restart: a logged group of a query a driver has committed before,
                    # and of a batch it has not, is a coordinated batch still open.
                    if batch > self._batches.get(query, batch):
                        newest = self._open_batches.get(query, (batch, now))[0]
                        self._open_batches[query] = (max(batch, newest), now)
            if log.keys() or any(True for _ in log.entries(NO_EPOCH)):
                self.mark_dirty(f"source task {task} has input logged by an earlier run")
        return log

    def task_store(self, task: int) -> TaskStore:
        """Return the changelog of local stateful task ``task`` (one object per task, kept)."""
        store = self._stores.get(task)
        if store is None:
            store = self._stores[task] = self.backend.task_store(task)
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
        plan = self.state.plan
        with self.gate:  # the receive path and the replay read the logs under it
            for task in sorted(self.state.local_tasks):
                if plan.topology.components[plan.task_component[task]].source:
                    self._open_log(task)
            for task in [t for t in self._logs if t not in self.state.local_tasks]:
                self._logs.pop(task)
        if added or removed:
            self.mark_dirty(f"executors moved (+{', '.join(added) or '-'} / -{', '.join(removed) or '-'})")

    def mark_dirty(self, reason: str) -> None:
        """Note that uncommitted state here cannot be trusted: the next round rolls everyone back."""
        with self._cond:
            if reason not in self.dirty_reasons:
                self.dirty_reasons.append(reason)
                del self.dirty_reasons[:-8]
                logger.warning("worker %s: state is dirty: %s", self.state.slot, reason)

    # --- the receive path (under the gate) -------------------------------------------------------
    def group_seen(self, key: GroupKey) -> bool:
        """Whether a group is a replay: its batch is committed, or it is in an input log whole."""
        query, batch = key[0], key[1]
        if self._batches.get(query, -1) >= batch:
            return True
        if key in self._unaccepted:  # logged in part only: the sender's retry is new input
            return False
        return any(log.has(key) for log in self._logs.values())

    def log_group(self, key: GroupKey | None, by_task: list[tuple[int, list[bytes]]]) -> None:
        """Append what source tasks accepted of one message or group to their input logs (before any ack).

        A group is accepted only once every task's share is logged.  If an append fails part
        way, the shares logged already stay (a rollback's replay counts a group once per log),
        the worker is marked dirty, the group's key is not taken as seen, and the error goes on
        to the caller, so the group fails and its sender's retry is logged and queued as new.
        """
        try:
            for task, payloads in by_task:
                log = self._logs.get(task) or self._open_log(task)
                log.append(LogRecord(key, list(payloads)), self.epoch + 1)
        except Exception as exc:
            if key is not None:
                self._unaccepted.add(key)
            self.mark_dirty(f"an input-log append failed: {type(exc).__name__}: {exc}")
            raise
        if key is not None:
            self._unaccepted.discard(key)
            self.counters["logged_groups"] += 1
            self._last_group = time.monotonic()

    def note_group(self, header: BatchHeader) -> None:
        """Note a delivery group the receive path logged (under the gate): a coordinated batch is open."""
        if not header.coordinated or header.batch_id <= self._batches.get(header.query_id, -1):
            return
        with self._cond:
            newest = self._open_batches.get(header.query_id, (header.batch_id, 0.0))[0]
            self._open_batches[header.query_id] = (max(newest, header.batch_id), time.monotonic())

    # --- tasks report (executor threads) -------------------------------------------------------
    def task_prepared(self, task: int, epoch: int, generation: int) -> None:
        """Task ``task``'s entry for ``epoch`` is durable (the writer thread); stale generations are ignored."""
        with self._cond:
            if generation != self.generation:
                return  # a rollback overtook this epoch: its round failed already
            self._prepared[task] = max(epoch, self._prepared.get(task, NO_EPOCH))
            self._failed.pop(task, None)
            self._cond.notify_all()

    def task_failed(self, task: int, epoch: int, error: str, generation: int) -> None:
        """Task ``task`` could not save ``epoch``: the round fails, and the next one rolls back."""
        with self._cond:
            if generation != self.generation:
                return  # a rollback overtook this epoch: it is discarded anyway
            self._failed[task] = f"task {task} could not write epoch {epoch}: {error}"
            self._cond.notify_all()
        self.mark_dirty(f"task {task} failed to write epoch {epoch}")

    # --- requests --------------------------------------------------------------------------------
    def handle(self, op: int, body: bytes, reply: Reply) -> None:
        """Answer a coordinator's request (the receive thread calls this; slow work goes elsewhere)."""
        name = OP_NAMES.get(op, str(op))
        try:
            args = decode_body(body, f"{name} request")
            if op == STATUS:
                reply(REQUEST_OK, encode_body(self.status()))
                return
            if op not in (PAUSE, RESUME, PREPARE, COMMIT):
                reply(REQUEST_FAILED, f"unknown checkpoint request op {op}".encode())
                return
            busy = self._take_lease(str(args.get("coordinator", "?")), int(args.get("priority", 0)))
            if busy is not None:
                reply(REQUEST_BUSY, busy.encode())
                return
        except StateError as exc:
            reply(REQUEST_FAILED, str(exc).encode())
            return
        threading.Thread(
            target=self._run, args=(op, args, reply), name=f"spark-storm-checkpoint-{name}", daemon=True
        ).start()

    def _run(self, op: int, args: dict[str, Any], reply: Reply) -> None:
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
                    waiter = self._prepare(int(args["epoch"]), int(args["generation"]))
                elif op == COMMIT:
                    self._commit(
                        int(args["epoch"]), {str(q): int(b) for q, b in dict(args.get("batches") or {}).items()}
                    )
                    answer = {"ok": True}
            if op == PREPARE:
                answer = waiter()
            reply(REQUEST_OK, encode_body(answer))
        except (StateError, ConfigError, KeyError, TypeError, ValueError) as exc:
            logger.warning("worker %s: %s refused: %s", self.state.slot, name, exc)
            reply(REQUEST_FAILED, f"{type(exc).__name__}: {exc}".encode())
        except Exception as exc:  # anything else is a bug here: answer it (the round retries) and log it whole
            logger.exception("worker %s: %s failed", self.state.slot, name)
            reply(REQUEST_FAILED, f"{type(exc).__name__}: {exc}".encode())

    def _take_lease(self, coordinator: str, priority: int) -> str | None:
        """Let ``coordinator`` change things unless another did lately (and ranks as high); else say why not."""
        now = time.monotonic()
        with self._cond:
            if priority > 0:
                self._priority_seen = now
            lease = self._lease
            if (
                lease is not None
                and lease[0] != coordinator
                and now - lease[1] < self._lease_s
                and lease[2] >= priority
            ):
                holder, since, _ = lease
                return (
                    f"busy: coordinated by {holder} (its lease ends in {self._lease_s - (now - since):.1f}s; "
                    "topology.state.coordinator.lease.ms)"
                )
            self._lease = (coordinator, now, priority)
        return None

    def status(self) -> dict[str, Any]:
        """Return what STATUS answers."""
        with self._cond:
            now = time.monotonic()
            lease = self._lease
            return {
                "lease_holder": None if lease is None else lease[0],
                "lease_age_s": None if lease is None else time.monotonic() - lease[1],
                "priority_age_s": None if self._priority_seen is None else time.monotonic() - self._priority_seen,
                "worker": str(self.state.slot),
                "stateful": True,
                "epoch": self.epoch,
                "committed": self.committed,
                "generation": self.generation,
                "dirty": bool(self.dirty_reasons),
                "reasons": list(self.dirty_reasons),
                "replaying": self.replaying,
                "last_group_age_s": None if self._last_group is None else time.monotonic() - self._last_group,
                # The least idle coordinated batch open here (seconds since a group of it came).
                "open_batch_idle_s": min((now - t for _, t in self._open_batches.values()), default=None),
            }

    def _executors(self) -> list[Executor]:
        return list(self.state.executors.values())

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
        again = self.paused  # a newer round's PAUSE before the RESUME of an older one
        if not again:  # paused twice, the first PAUSE knows which executors were active (now none is)
            self._was_active = {e.spec for e in executors if e.active.is_set()}
        with self.gate:  # taken while the executors still run: a receive thread holding it drains
            # Stop the executors first, then raise the generation: an executor reads the generation
            # before it takes a batch, so a batch taken before this PAUSE emits under the old one
            # and its output is dropped on arrival (by peers paused already) or cleared below.
            for executor in executors:
                executor.deactivate()  # returns once no take is under way
            self.generation = generation  # from now on, payloads of older generations are dropped on arrival
            self.paused = True
            self.replaying = True  # what sources accept is logged only: the replay publishes it
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
        state = self.state
        if not self.writer.drain(self._prepare_timeout_s):  # no late write may land on a cut-back changelog
            msg = f"changelog writes still running after {self._prepare_timeout_s:.0f}s; the rollback waits for them"
            raise CheckpointError(msg)
        with self.gate:
            for executor in self._executors():
                if executor.checkpoints is not None:
                    executor.checkpoints.rollback(epoch)
            for log in self._logs.values():
                log.truncate(epoch)
                log.retag(epoch, epoch + 1)
            with self._cond:
                self.epoch = epoch
                self.committed = max(self.committed, epoch)
                self._prepared = dict.fromkeys(self._prepared, epoch)
                self._failed.clear()
                self.dirty_reasons = []
            self.counters["rollbacks"] += 1
            self.replaying = True
            self.paused = False
            for executor in self._executors():
                if executor.spec in self._was_active:
                    executor.activate()
        threading.Thread(target=self._replay, args=(epoch, generation), name="spark-storm-replay", daemon=True).start()
        logger.warning("worker %s: rolled back to epoch %d (generation %d); replaying", state.slot, epoch, generation)

    def _replay(self, epoch: int, generation: int) -> None:
        """Publish every logged record after ``epoch`` again, untracked, until caught up with the receive path."""
        done: dict[int, int] = {}
        receiver = self.state.receiver
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
                                if self.generation != generation:
                                    return  # another rollback took over
                                full = receiver.publish_replay(task, items)
                            if full is None:
                                break
                            full.wait_for_room(sum(w for _, w in items), 0.05)
                        with self._cond:
                            self.counters["replayed_records"] += 1
                        progressed = True
                    done[task] = len(records)
                if progressed:
                    continue
                with self.gate:  # nothing new: what the receive path accepts from now on it publishes itself
                    if all(sum(1 for _ in log.replayable(epoch)) == done.get(t, 0) for t, log in self._logs.items()):
                        self.replaying = False
                        with self._cond:
                            self._cond.notify_all()
                        return
        except Exception as exc:  # a corrupt log: the next round fails with it (and says so)
            logger.exception("worker %s: replay after epoch %d failed", self.state.slot, epoch)
            self.mark_dirty(f"replay failed: {exc}")
            with self.gate:
                if self.generation == generation:  # an older replay's end is not this one's
                    self.replaying = False

    def _prepare(self, epoch: int, generation: int) -> Callable[[], dict[str, Any]]:
        if generation != self.generation:
            msg = f"PREPARE for generation {generation}, but this worker is at {self.generation}: roll back first"
            raise CheckpointError(msg)
        if self.paused:
            msg = "PREPARE while paused for a rollback: RESUME first"
            raise CheckpointError(msg)
        deadline = time.monotonic() + self._prepare_timeout_s
        with self._cond:
            while self.replaying and self.generation == generation:
                if not self._cond.wait(min(0.5, max(0.0, deadline - time.monotonic()))) and time.monotonic() > deadline:
                    msg = f"the replay after the rollback did not finish within {self._prepare_timeout_s:.0f}s"
                    raise CheckpointError(msg)
        state = self.state
        sealed: list[tuple[int, Callable[[], None]]] = []
        with self.gate:
            if epoch > self.epoch:
                plan = state.plan
                for task in sorted(state.local_tasks):
                    if not plan.topology.components[plan.task_component[task]].source:
                        continue
                    sealed.append((task, self._open_log(task).seal(epoch)))
                    queue = state.queue_of(task)
                    if queue is not None:  # never waits: the gate is held
                        queue.publish([(task, Barrier(epoch, generation, -1))], [0], wait=False)
                with self._cond:
                    self.epoch = epoch
        for task, make_durable in sealed:  # the fsyncs, with the gate released: receiving goes on
            try:
                make_durable()
            except Exception as exc:  # a retried PREPARE would not seal again: the next round rolls back
                msg = f"task {task}'s input log up to barrier {epoch} was not made durable: {exc}"
                self.mark_dirty(msg)
                raise CheckpointError(msg) from exc
        stateful = [
            t for e in self._executors() if e.checkpoints is not None and e.checkpoints.stateful for t in e.spec.tasks
        ]

        def wait() -> dict[str, Any]:
            self._check_transport_losses()
            with self._cond:
                while True:
                    failed = [self._failed[t] for t in stateful if t in self._failed]
                    if failed:
                        raise CheckpointError("; ".join(failed))
                    if self.generation != generation:
                        msg = f"a rollback (generation {self.generation}) overtook epoch {epoch}"
                        raise CheckpointError(msg)
                    if all(self._prepared.get(t, NO_EPOCH) >= epoch for t in stateful):
                        return {"epoch": epoch, "dirty": bool(self.dirty_reasons), "generation": generation}
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        late = [t for t in stateful if self._prepared.get(t, NO_EPOCH) < epoch]
                        msg = f"tasks {late} did not write epoch {epoch} within {self._prepare_timeout_s:.0f}s"
                        raise CheckpointError(msg)
                    self._cond.wait(min(remaining, 0.5))

        return wait

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
        for executor in self._executors():
            cp = executor.checkpoints
            if cp is not None and cp.stateful and cp.restored.is_set():  # stores are filled in at restore
                for store in list(cp.stores.values()):
                    store.commit(epoch)
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
            self.committed = max(self.committed, epoch)
            self._lease = None  # the round is over: the next one may be anybody's
        self.counters["committed_epochs"] += 1
        self.last_commit_at = time.time()

    def drain_writes(self, timeout: float) -> bool:
        """Wait until every changelog entry handed to the writer is written (or failed)."""
        return self.writer.drain(timeout)

    def close(self) -> None:
        """Let pending changelog writes end, then close the backend (input-log segments made durable)."""
        if not self.writer.close(5.0):
            logger.warning("worker %s: changelog writes still running at close", self.state.slot)
        self.backend.close()

    def metrics(self) -> CheckpointMetrics:
        """Return the worker's checkpoint view, for /health and the UI."""
        status = self.status()
        counters = self.counters
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
            "replayed_records": counters["replayed_records"],
            "committed_epochs": counters["committed_epochs"],
            "logged_groups": counters["logged_groups"],
            "interval_rounds": counters["interval_rounds"],
            "interval_stood_aside": counters["interval_stood_aside"],
            "provider": self.backend.describe(),
            "last_commit_at": self.last_commit_at,
        }


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


class IntervalCheckpoints:
    """Storm's checkpoint interval, for topologies fed by plain clients (no Spark driver coordinating).

    The worker with the lowest slot of the plan runs a round every
    ``topology.state.checkpoint.interval.ms``.  It stands aside while a Spark query drives
    the topology, so the two never interleave: while a driver was heard within
    ``topology.state.coordinator.lease.ms``, and while any worker holds a coordinated batch
    (a Spark micro-batch: BATCH_HEADER bit 0x80) that its driver has not committed, however
    slow the batch, unless no group of it came for ``topology.state.coordinator.batch.hold.ms``
    (the driver is presumed gone; docs/state.md, "Who coordinates").
    """

    def __init__(self, manager: CheckpointManager, conf: Config, stopping: threading.Event) -> None:
        self._manager = manager
        self._interval_s = conf.get_int("topology.state.checkpoint.interval.ms", minimum=0) / 1000
        self._stopping = stopping
        self._lease_s = conf.get_int("topology.state.coordinator.lease.ms", minimum=1) / 1000
        self._hold_s = conf.get_int("topology.state.coordinator.batch.hold.ms", minimum=0) / 1000
        self._coordinator = Coordinator(
            f"worker {manager.state.slot} (topology.state.checkpoint.interval.ms)",
            self._endpoints,
            conf.get_int("topology.state.commit.timeout.ms", minimum=1) / 1000,
            conf.get_int("topology.state.commit.retries", minimum=1),
            priority=0,
        )
        self.rounds = 0
        self.stood_aside = 0
        self.last_error: str | None = None

    @property
    def enabled(self) -> bool:
        return self._interval_s > 0

    def _endpoints(self) -> dict[str, Any]:
        state = self._manager.state
        out: dict[str, Any] = {str(slot): conn for slot, conn in state.connections.items()}
        out[str(state.slot)] = _ThisWorker(self._manager)
        return out

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
                if self.driven_by(self._coordinator.status()) is not None:
                    self.stood_aside += 1
                    self._manager.counters["interval_stood_aside"] = self.stood_aside
                    continue  # the query's commits run the rounds now
                self._coordinator.checkpoint({})
                self.rounds += 1
                self._manager.counters["interval_rounds"] = self.rounds
                self.last_error = None
            except StormError as exc:
                self.last_error = str(exc)
                logger.warning("worker %s: interval checkpoint failed: %s", state.slot, exc)
