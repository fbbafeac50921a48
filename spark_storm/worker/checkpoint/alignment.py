"""An executor's side of exact state: barrier alignment and its stateful tasks' changelogs (docs/design/state.md).

:class:`ExecutorCheckpoints` runs on the executor's thread: it aligns checkpoint barriers
per task (a channel that delivered barrier ``E`` is held back until every upstream task
did, as in Flink), then encodes each stateful task's changes as epoch ``E``, hands the
entry to the worker's :class:`~spark_storm.state.StateWriter` (the write and its fsync run
off the executor thread), sends ``E`` on to every downstream task behind its data, and
lets the held items through.  A rollback (the worker's request thread, with the executor
paused) puts every task back at the committed epoch.  :class:`NoAlignment` stands in for
it in a topology without state.

State TTL (docs/design/state.md) is decided here, at the barrier: the task's clock (its windows'
watermark, the newest event time its tuples carried, or the wall clock) goes to
:meth:`~spark_storm.state.kv.TtlKeyValueState.advance`, which stamps the keys written in
the epoch and removes the expired ones, and the entry records both.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.tuples import BROADCAST_TASK, Barrier
from spark_storm.errors import CheckpointError
from spark_storm.reports import StateMetrics
from spark_storm.state import NO_EPOCH, KeyValueState, TaskStore
from spark_storm.state.format import TtlMeta, encode_entry_parts
from spark_storm.state.kv import TtlKeyValueState
from spark_storm.state.ttl import TtlRestore, restore_with_ttl
from spark_storm.worker.checkpoint.ttl import EventClock, TtlSettings, wall_ms
from spark_storm.worker.queue import QueueItem
from spark_storm.worker.stateful import is_stateful
from spark_storm.worker.stats import LatencyHistogram
from spark_storm.worker.windows.core import NO_TIME
from spark_storm.worker.windows.engine import WINDOW_PREFIX

if TYPE_CHECKING:
    from spark_storm.worker.checkpoint.participant import CheckpointManager
    from spark_storm.worker.executor import Executor

__all__ = ["ExecutorCheckpoints", "NoAlignment"]

logger = logging.getLogger(__name__)


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

    stateful: bool

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
        #: State TTL: the component's keys (read once), the event clock of each task that has one of its own.
        self.ttl = TtlSettings.from_conf(executor.conf, component.id, component.conf) if self.stateful else None
        self.event_clocks: dict[int, EventClock] = {}
        if self.ttl is not None and self.ttl.tracks:
            assert self.ttl.timestamp_field is not None
            self.event_clocks = {t: EventClock(self.ttl.timestamp_field) for t in tasks}
        self.expired = 0
        self._keys_since_full: dict[int, int] = {}
        self._snapshot_min = manager.settings.snapshot_min_keys
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
            epoch, data, meta = restore_with_ttl(store)
            state = KeyValueState(data)
            self._set_ttl(task, state, meta)
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

    def _set_ttl(self, task: int, state: KeyValueState, meta: TtlRestore) -> None:
        """Give a restored state its TTL: on (a TTL, its own event clock, or entries written with TTL) or refused."""
        ttl = self.ttl
        if ttl is None:
            return
        if ttl.refused is not None:
            state.refuse_ttl(ttl.refused)
        else:
            exempt = WINDOW_PREFIX if task in self._ex.windows else None  # the window engine's keys never expire
            if ttl.on or meta.any or state.ttl_on:
                state.enable_ttl(ttl.ttl_ms, exempt).load_ttl(meta.written, meta.ttls, meta.clock)
            else:
                state.configure_ttl(ttl.ttl_ms, exempt)  # on at the first put with a ttl
        clock = self.event_clocks.get(task)
        if clock is not None:  # the event time up to the restored epoch
            clock.newest = meta.clock if meta.clock is not None else NO_TIME

    def _ttl_now(self, task: int) -> int | None:
        """Return the task's TTL clock at this barrier, in ms (None: none yet)."""
        ttl = self.ttl
        assert ttl is not None
        if ttl.clock == "processing":
            return wall_ms()
        clock = self.event_clocks.get(task)
        if clock is not None:
            return clock.now()
        engine = self._ex.windows.get(task)
        if engine is not None and engine.watermark.value != NO_TIME:
            return int(engine.watermark.value)
        return None

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
                    weight += self._run(chunk)
                    chunk = []
                weight += self._on_barrier(task, payload)
                continue
            if aligning and task in aligning and _channel(payload) in aligning[task][1]:
                self.buffered.setdefault(task, []).append(item)  # after its barrier: the next epoch
                continue
            chunk.append(item)
        if chunk:
            weight += self._run(chunk)
        return weight

    def _run(self, chunk: list[QueueItem]) -> int:
        if self.event_clocks:  # TTL's event clock: what these tuples say, before the barrier after them
            clocks = self.event_clocks
            if len(clocks) == 1:
                next(iter(clocks.values())).observe(chunk)
            else:
                for task, clock in clocks.items():
                    clock.observe([item for item in chunk if item[0] == task])
        return self._ex.process(chunk)

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
        self._manager.task_passed(task, epoch, generation)  # a PREPARE of the epoch may answer for this task now
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
        if isinstance(state, TtlKeyValueState):
            return self._encode_ttl(task, epoch, state)
        since = self._keys_since_full[task] + state.changed
        if since > max(self._snapshot_min, len(state)):
            self._keys_since_full[task] = 0
            return True, store.encode(epoch, True, state.snapshot())
        self._keys_since_full[task] = since
        return False, store.encode(epoch, False, state.take_changes())

    def _encode_ttl(self, task: int, epoch: int, state: TtlKeyValueState) -> tuple[bool, list[bytes]]:
        """Decide the epoch's expiries at its barrier, and encode them with the changes (docs/design/state.md)."""
        expired = state.advance(self._ttl_now(task))
        self.expired += len(expired)
        since = self._keys_since_full[task] + state.changed + len(expired)
        full = since > max(self._snapshot_min, len(state))
        self._keys_since_full[task] = 0 if full else since
        changes = state.snapshot() if full else state.take_changes()
        clock, written, ttls = state.entry_ttl(full)
        return full, encode_entry_parts(epoch, full, changes, TtlMeta(clock, written, ttls, expired))

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
        for task, store in self.stores.items():  # never discard a committed epoch's entries
            if store.committed() > epoch:
                msg = f"task {task}: epoch {store.committed()} is committed, a rollback to {epoch} would lose it"
                raise CheckpointError(msg)
        for task, bolt in self._ex.bolts.items():
            bolt.pre_rollback()
            store = self.stores[task]
            store.discard_after(epoch)
            _, data, meta = restore_with_ttl(store, epoch)
            if store.committed() < epoch:
                store.mark_committed(epoch)
            state = self.states[task]
            state.restore(data)
            self._set_ttl(task, state, meta)
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


class NoAlignment:
    """An executor's checkpoint side in a topology without state: its batches go straight to it."""

    stateful = False

    def __init__(self, executor: Executor) -> None:
        self.process = executor.process
        self.restored = threading.Event()

    def restore_all(self) -> None:
        """Nothing to restore."""
        self.restored.set()

    def check_commits(self) -> None:
        """No commits to hear of."""

    def reset(self) -> int:
        """Nothing is held for alignment."""
        return 0

    def rollback(self, epoch: int) -> None:
        """No state to put back."""

    def metrics(self) -> StateMetrics | None:
        """No state to report."""
        return None
