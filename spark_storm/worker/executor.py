"""Executors: one thread per executor running its tasks' bolts, and their collectors.

An executor takes whatever its queue holds (up to ``topology.executor.batch.size``
tuples), runs it through its bolts, then flushes everything the bolts emitted in one
go (Storm 2.x batches emits the same way):

* a **tuple executor** runs :class:`~spark_storm.worker.bolt.Bolt` tasks: ``execute``
  per tuple; a columnar batch from a batch bolt upstream becomes one tuple per row;
* a **batch executor** runs :class:`~spark_storm.worker.bolt.BatchBolt` tasks:
  ``execute_batch`` per batch; tuples from tuple bolts upstream become one record batch
  per origin and executor batch.

Emits are buffered per (emitting task, stream, destination task) by the executor's
:class:`Emitter` and leave at the end of the batch: tuples for local tasks as one queue
item per destination, tuples for remote tasks as one message per destination (every row
of that batch, in order), columnar batches whole.  Per tuple the hot path is a dict
lookup and a list append; locks, wake-ups, serialization and counters are per batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from spark_storm.errors import ConfigError, WireFormatError
from spark_storm.messaging import TaskMessage
from spark_storm.topology.assignment import ExecutorSpec, Plan, Slot
from spark_storm.topology.grouping import Grouper, make_grouper
from spark_storm.topology.model import DEFAULT_STREAM, Component, resolve_class
from spark_storm.worker.acker import new_edge
from spark_storm.worker.bolt import BatchBolt, BatchOutputCollector, Bolt, OutputCollector, TopologyContext
from spark_storm.worker.columnar import ColumnarBatch, as_record_batch, batch_from_rows, rows_of
from spark_storm.worker.payloads import arrow_payload, columnar_metadata, pack_tuples
from spark_storm.worker.queue import BatchQueue
from spark_storm.worker.serializer import Serializer
from spark_storm.worker.settings import WorkerSettings
from spark_storm.worker.stats import TaskStats
from spark_storm.worker.tuples import (
    BROADCAST_TASK,
    NO_ANCHORS,
    TICK_SOURCE,
    Anchor,
    Tuple,
    TupleSource,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ACK_OP",
    "FAIL_OP",
    "TOUCHED",
    "BatchCollector",
    "BatchExecutor",
    "Emitter",
    "Executor",
    "ExecutorHost",
    "QueueItem",
    "TaskCollector",
    "TupleExecutor",
    "WorkerView",
    "make_executor",
]

logger = logging.getLogger(__name__)
_now = time.perf_counter
ACK_OP = 1
FAIL_OP = 2

#: An executor queue item: (task, tuples) or (task, columnar batch); task may be BROADCAST_TASK.
QueueItem = tuple[int, Any]
_Key = tuple[int, str, int]  # (emitting task, stream, destination task)


class WorkerView(Protocol):
    """What every part of a worker reads of its state: the plan, where it is, its codec, its queues."""

    @property
    def plan(self) -> Plan: ...

    @property
    def slot(self) -> Slot: ...

    @property
    def worker_id(self) -> int:
        """Return the id naming this worker in tuple-tree anchors (:func:`~spark_storm.worker.acker.worker_id`)."""
        ...

    @property
    def serializer(self) -> Serializer: ...

    def queue_of(self, task: int) -> BatchQueue[QueueItem] | None:
        """Return the receive queue of a local task (None: the task lives elsewhere)."""

    def source_of(self, task: int, stream: str) -> TupleSource:
        """Return the shared origin record of a task's stream (-1: a client); WireFormatError if unknown."""

    def acker_ops(self, worker_id: int, ops: list[list[Any]]) -> None:
        """Apply tuple-tree updates at the acker of ``worker_id``."""


class ExecutorHost(WorkerView, Protocol):
    """What executors need from their worker (the worker's state implements it)."""

    @property
    def local_tasks(self) -> frozenset[int]: ...

    @property
    def max_payload_bytes(self) -> int: ...

    def remote_worker_of(self, task: int) -> int:
        """Return the id of the worker running ``task``, or -1 when it is this one."""

    def send_remote(self, messages: list[TaskMessage], weights: list[int]) -> None:
        """Hand messages for remote tasks to the transfer path (blocks while it is full)."""

    def reroute(self, items: list[QueueItem], weights: list[int]) -> None:
        """Deliver items that a stopped executor's queue refused to where their tasks are now."""

    def get_load(self, tasks: Iterable[int]) -> Mapping[int, float]:
        """Latest load (0..1) of ``tasks``."""

    def request_stop(self, reason: str, *, failure: bool = True) -> None:
        """Ask for the worker's ordered shutdown."""

    def report_error(self, component: str, task: int, error: str) -> None:
        """Remember a bolt error (for /health and the UI)."""


class Emitter:
    """An executor's emits and acker updates, held until the end of its batch.

    Only the owning executor thread adds to it; a bolt that emits from a thread of its
    own gets a fresh emitter flushed at once (see the collectors).
    """

    def __init__(self, host: ExecutorHost, component: str, stats: Mapping[int, TaskStats]) -> None:
        self._host = host
        self._component = component
        self._stats = stats  # emitted tuples are counted here, per emitting task and flush
        self.owner: int | None = None
        self.rows: dict[_Key, list[list[Any]]] = {}
        self.anchors: dict[_Key, list[list[Anchor]]] = {}
        self.batches: list[tuple[int, str, int, pa.RecordBatch, list[Anchor]]] = []
        self.acks: dict[int, list[list[int]]] = {}

    @property
    def stats(self) -> Mapping[int, TaskStats]:
        return self._stats

    def add_anchored(self, key: _Key, values: list[Any], anchors: list[Anchor]) -> None:
        rows = self.rows.setdefault(key, [])
        tracked = self.anchors.get(key)
        if tracked is None:
            tracked = self.anchors[key] = [NO_ANCHORS] * len(rows)
        rows.append(values)
        tracked.append(anchors)

    def acker_op(self, worker_id: int, op: list[int]) -> None:
        self.acks.setdefault(worker_id, []).append(op)

    def flush(self) -> None:
        """Publish local emits (one item per destination task), hand remote ones to the transfer path."""
        if not (self.rows or self.batches or self.acks):
            return
        host = self._host
        local: dict[int, tuple[BatchQueue[QueueItem], list[QueueItem], list[int]]] = {}
        remote: list[TaskMessage] = []
        weights: list[int] = []
        rows_out, self.rows = self.rows, {}
        anchors_out, self.anchors = self.anchors, {}
        stats = self._stats
        for key, rows in rows_out.items():
            src, stream, dest = key
            stats[src].emitted += len(rows)
            anchors = anchors_out.get(key)
            queue = host.queue_of(dest)
            if queue is not None:
                source = host.source_of(src, stream)
                tuples = [Tuple(v, source) for v in rows]
                if anchors is not None:
                    for tup, anchor in zip(tuples, anchors, strict=True):
                        tup.anchors = anchor
                entry = local.get(id(queue))
                if entry is None:
                    entry = local[id(queue)] = (queue, [], [])
                entry[1].append((dest, tuples))
                entry[2].append(len(tuples))
            else:
                self._pack_remote(src, stream, dest, rows, anchors, remote, weights)
        if self.batches:
            self._flush_batches(local, remote, weights)
        for queue, items, item_weights in local.values():
            if not queue.publish(items, item_weights):  # its executor stopped (a refresh moved it)
                host.reroute(items, item_weights)
        if remote:
            host.send_remote(remote, weights)
        if self.acks:
            acks, self.acks = self.acks, {}
            for worker_id, ops in acks.items():
                host.acker_ops(worker_id, ops)

    def _pack_remote(
        self,
        src: int,
        stream: str,
        dest: int,
        rows: list[list[Any]],
        anchors: list[list[Anchor]] | None,
        out: list[TaskMessage],
        weights: list[int],
    ) -> None:
        payload = pack_tuples(self._host.serializer, src, stream, rows, anchors)
        if len(payload) > self._host.max_payload_bytes and len(rows) > 1:
            half = len(rows) // 2  # too big for one frame: split, keeping the order
            self._pack_remote(src, stream, dest, rows[:half], anchors[:half] if anchors else None, out, weights)
            self._pack_remote(src, stream, dest, rows[half:], anchors[half:] if anchors else None, out, weights)
            return
        out.append(TaskMessage(dest, payload))
        weights.append(len(rows))

    def _flush_batches(
        self,
        local: dict[int, tuple[BatchQueue[QueueItem], list[QueueItem], list[int]]],
        remote: list[TaskMessage],
        weights: list[int],
    ) -> None:

        host = self._host
        batches, self.batches = self.batches, []
        for src, stream, dest, data, anchors in batches:
            self._stats[src].emitted += data.num_rows
            queue = host.queue_of(dest)
            if queue is not None:
                batch = ColumnarBatch(data, host.source_of(src, stream))
                batch.anchors = anchors
                entry = local.get(id(queue))
                if entry is None:
                    entry = local[id(queue)] = (queue, [], [])
                entry[1].append((dest, batch))
                entry[2].append(data.num_rows)
                continue
            limit = host.max_payload_bytes
            step = data.num_rows
            if data.nbytes > limit // 2 and data.num_rows > 1:  # keep each message well under a frame
                step = max(1, int(data.num_rows * (limit // 2) / data.nbytes))
            if step < data.num_rows and anchors:
                # every piece is its own edge: split the batch's edge into one per piece
                pieces = [data.slice(i, step) for i in range(0, data.num_rows, step)]
                for piece, piece_anchors in zip(pieces, _split_edges(anchors, len(pieces), self), strict=True):
                    remote.append(
                        TaskMessage(dest, arrow_payload(piece, columnar_metadata(src, stream, piece_anchors)))
                    )
                    weights.append(piece.num_rows)
                continue
            for start in range(0, data.num_rows, step):
                piece = data.slice(start, step)
                remote.append(TaskMessage(dest, arrow_payload(piece, columnar_metadata(src, stream, anchors or None))))
                weights.append(piece.num_rows)


def _split_edges(anchors: list[Anchor], pieces: int, emitter: Emitter) -> list[list[Anchor]]:
    """Replace a batch's edge (per root) by one new edge per piece, in one acker update per root."""
    out: list[list[Anchor]] = [[] for _ in range(pieces)]
    for worker_id, root, edge in anchors:
        update = edge
        for i in range(pieces):
            new = new_edge()
            update ^= new
            out[i].append((worker_id, root, new))
        emitter.acker_op(worker_id, [ACK_OP, root, update])
    return out


#: Key of a parent's ``pending`` dict holding the ids of the workers its anchored children
#: went to (a frozenset); they travel with the parent's ack to the roots' ackers, so a
#: worker that loses a peer fails exactly the trees that passed through it.
TOUCHED: Final = (-1, -1)


def _child_anchors(parents: Sequence[Any], workers: Sequence[int]) -> list[list[Anchor]] | None:
    """Give each emitted copy a fresh edge in every tree its parents belong to (Storm's acker).

    ``workers`` holds, per copy, the id of the worker it goes to (-1: this one).
    """
    if not any(p.anchors for p in parents):
        return None
    touched = frozenset(w for w in workers if w >= 0)
    trees = []
    for _ in workers:
        edge = new_edge()
        child: dict[tuple[int, int], int] = {}
        for parent in parents:
            if not parent.anchors:
                continue
            if parent.pending is None:
                parent.pending = {}
            pending = parent.pending
            if touched:
                pending[TOUCHED] = pending.get(TOUCHED, frozenset()) | touched
            for worker_id, root, _e in parent.anchors:
                key = (worker_id, root)
                pending[key] = pending.get(key, 0) ^ edge
                child[key] = child.get(key, 0) ^ edge
        trees.append([(s, r, e) for (s, r), e in child.items()])
    return trees


def _parents(anchors: Any) -> list[Any]:
    if anchors is None:
        return []
    if isinstance(anchors, (list, tuple)):
        return list(anchors)
    return [anchors]


class _AckingCollector:
    """Acks and fails for tuples and batches alike: both carry anchors and pending edges."""

    def __init__(self, emitter: Emitter, stats: TaskStats, host: ExecutorHost) -> None:
        self._emitter = emitter
        self._stats = stats
        self._host = host

    def _acker_op(self, worker_id: int, op: list[int]) -> None:
        if threading.get_ident() == self._emitter.owner:
            self._emitter.acker_op(worker_id, op)
        else:
            self._host.acker_ops(worker_id, [op])

    def _ack_anchors(self, item: Any) -> None:
        anchors, item.anchors = item.anchors, NO_ANCHORS  # acking twice must not count twice
        pending = item.pending or {}
        touched = sorted(pending.get(TOUCHED, ()))
        for worker_id, root, edge in anchors:
            op: list[Any] = [ACK_OP, root, edge ^ pending.get((worker_id, root), 0)]
            if touched:
                op.append(touched)
            self._acker_op(worker_id, op)

    def _fail_anchors(self, item: Any) -> None:
        anchors, item.anchors = item.anchors, NO_ANCHORS
        for worker_id, root, _edge in anchors:
            self._acker_op(worker_id, [FAIL_OP, root, 0])


class _Route:
    """The groupers of one output stream, and its arity."""

    __slots__ = ("arity", "choose", "direct")

    def __init__(self, arity: int, groupers: list[Grouper], direct: list[Grouper]) -> None:
        self.arity = arity
        self.direct = direct
        if not groupers:
            self.choose: Callable[[list[Any]], list[int]] = _nowhere
        elif len(groupers) == 1:
            self.choose = groupers[0].choose
        else:

            def choose(values: list[Any]) -> list[int]:
                return [t for g in groupers for t in g.choose(values)]

            self.choose = choose


def _nowhere(values: list[Any]) -> list[int]:
    return []


class TaskCollector(_AckingCollector, OutputCollector):
    """The collector of one tuple-bolt task: routes emits by the consumers' groupings."""

    def __init__(self, host: ExecutorHost, emitter: Emitter, component: Component, task: int, stats: TaskStats) -> None:
        super().__init__(emitter, stats, host)
        self._component = component
        self._task = task
        self._routes: dict[str, _Route] = {}
        topo = host.plan.topology
        for stream, fields in component.outputs.items():
            groupers: list[Grouper] = []
            direct: list[Grouper] = []
            for consumer, inp in topo.consumers(component.id, stream):
                targets = list(host.plan.component_tasks[consumer.id])
                grouper = make_grouper(inp, component, targets, local_tasks=host.local_tasks, load=host.get_load)
                (direct if inp.grouping == "direct" else groupers).append(grouper)
            self._routes[stream] = _Route(len(fields), groupers, direct)

    def _bad_emit(self, stream: str, values: Sequence[Any]) -> ConfigError:
        fields = self._component.outputs.get(stream)
        if fields is None:
            msg = (
                f"component {self._component.id!r} emitted on undeclared stream {stream!r}; "
                f"declare it under 'outputs' (declared: {sorted(self._component.outputs)})"
            )
            return ConfigError(msg)
        msg = (
            f"component {self._component.id!r} emitted {len(values)} values on {stream!r}, "
            f"which declares {len(fields)} fields {list(fields)}"
        )
        return ConfigError(msg)

    def emit(
        self,
        values: Sequence[Any],
        stream: str = DEFAULT_STREAM,
        anchors: Sequence[Tuple] | Tuple | None = None,
    ) -> list[int]:
        route = self._routes.get(stream)
        if route is None or len(values) != route.arity:
            raise self._bad_emit(stream, values)
        if type(values) is not list:
            values = list(values)
        targets = route.choose(values)
        if targets:
            self._send(stream, values, targets, anchors)
        return targets

    def _send(
        self, stream: str, values: list[Any], targets: list[int], anchors: Sequence[Tuple] | Tuple | None
    ) -> None:
        emitter = self._emitter
        if threading.get_ident() != emitter.owner:
            emitter = Emitter(self._host, self._component.id, emitter.stats)  # a bolt's own thread: send now
        if anchors is None or (type(anchors) is Tuple and not anchors.anchors):
            trees = None  # untracked: the common case, no tree bookkeeping at all
        else:
            remote = self._host.remote_worker_of
            trees = _child_anchors(_parents(anchors), [remote(dest) for dest in targets])
        task = self._task
        if trees is None:
            rows = emitter.rows
            for dest in targets:
                key = (task, stream, dest)
                out = rows.get(key)
                if out is None:
                    rows[key] = [values]
                else:
                    out.append(values)
        else:
            for dest, tree in zip(targets, trees, strict=True):
                emitter.add_anchored((task, stream, dest), values, tree)
        if emitter is not self._emitter:
            emitter.flush()

    def emit_direct(
        self,
        task: int,
        values: Sequence[Any],
        stream: str = DEFAULT_STREAM,
        anchors: Sequence[Tuple] | Tuple | None = None,
    ) -> None:
        route = self._routes.get(stream)
        if route is None or len(values) != route.arity:
            raise self._bad_emit(stream, values)
        for grouper in route.direct:
            if task in grouper.targets:
                self._send(stream, list(values), [task], anchors)
                return
        msg = (
            f"emit_direct to task {task} on {self._component.id!r} stream {stream!r}: no consumer "
            "subscribed with direct grouping owns that task"
        )
        raise ConfigError(msg)

    def ack(self, tup: Tuple) -> None:
        self._stats.acked += 1
        if tup.anchors:
            self._ack_anchors(tup)

    def fail(self, tup: Tuple) -> None:
        self._stats.failed += 1
        if tup.anchors:
            self._fail_anchors(tup)

    def report_error(self, error: str) -> None:
        self._host.report_error(self._component.id, self._task, error)

    def for_thread(self) -> TaskCollector:
        """Return a collector for the calling thread of the bolt's own: its emits batch until :meth:`flush`."""
        emitter = Emitter(self._host, self._component.id, self._emitter.stats)
        emitter.owner = threading.get_ident()
        return TaskCollector(self._host, emitter, self._component, self._task, self._stats)

    def flush(self) -> None:
        """Send what this collector's thread emitted (see :meth:`for_thread`)."""
        if threading.get_ident() == self._emitter.owner:
            self._emitter.flush()


class BatchCollector(_AckingCollector, BatchOutputCollector):
    """The collector of one batch-bolt task: routes record batches with numpy."""

    def __init__(self, host: ExecutorHost, emitter: Emitter, component: Component, task: int, stats: TaskStats) -> None:
        from spark_storm.topology.routing import make_batch_router

        super().__init__(emitter, stats, host)
        self._component = component
        self._task = task
        self._routes: dict[str, list[tuple[str, Any, list[int]]]] = {}
        topo = host.plan.topology
        for stream in component.outputs:
            routes = []
            for consumer, inp in topo.consumers(component.id, stream):
                targets = list(host.plan.component_tasks[consumer.id])
                router = make_batch_router(inp, component, targets, local_tasks=host.local_tasks, load=host.get_load)
                routes.append((inp.grouping, router, targets))
            self._routes[stream] = routes

    def emit_batch(
        self,
        data: Any,
        stream: str = DEFAULT_STREAM,
        anchors: Sequence[ColumnarBatch] | ColumnarBatch | None = None,
        tasks: Any = None,
    ) -> None:

        routes = self._routes.get(stream)
        if routes is None:
            msg = (
                f"component {self._component.id!r} emitted on undeclared stream {stream!r}; "
                f"declare it under 'outputs' (declared: {sorted(self._component.outputs)})"
            )
            raise ConfigError(msg)
        where = f"component {self._component.id!r} stream {stream!r}"
        try:
            rb = as_record_batch(data, self._component.outputs[stream], where)
        except WireFormatError as exc:
            raise ConfigError(str(exc)) from exc
        if rb.num_rows == 0:
            return
        pieces: list[tuple[int, pa.RecordBatch]] = []
        for grouping, router, _targets in routes:
            try:
                pieces.extend(router.split(rb, tasks if grouping == "direct" else None))
            except ValueError as exc:
                msg = f"{where}: {exc}"
                raise ConfigError(msg) from exc
        if not pieces:
            return
        emitter = self._emitter
        own_thread = threading.get_ident() == emitter.owner
        if not own_thread:
            emitter = Emitter(self._host, self._component.id, emitter.stats)
        remote = self._host.remote_worker_of
        trees = _child_anchors(_parents(anchors), [remote(d) for d, _ in pieces]) if anchors is not None else None
        for i, (dest, piece) in enumerate(pieces):
            emitter.batches.append((self._task, stream, dest, piece, trees[i] if trees else NO_ANCHORS))
        if not own_thread:
            emitter.flush()

    def ack(self, batch: ColumnarBatch) -> None:
        self._stats.acked += batch.num_rows
        if batch.anchors:
            self._ack_anchors(batch)

    def fail(self, batch: ColumnarBatch) -> None:
        self._stats.failed += batch.num_rows
        if batch.anchors:
            self._fail_anchors(batch)


class Executor:
    """Runs the bolts of one executor's task range on its own thread.

    Subclasses say how a batch of queue items reaches the bolts (:meth:`_process`).
    """

    kind = "tuple"

    def __init__(
        self,
        host: ExecutorHost,
        spec: ExecutorSpec,
        queue: BatchQueue[QueueItem],
        settings: WorkerSettings,
        conf: Mapping[str, Any],
        bolt_cls: type,
    ) -> None:
        self.host = host
        self.spec = spec
        self.queue = queue
        self.component = host.plan.topology.components[spec.component]
        self.conf = conf
        self.policy = settings.error_policy
        self.tick_s = settings.tick_s
        self._batch_limit = settings.executor_batch_size
        self.bolts: dict[int, Any] = {t: bolt_cls() for t in spec.tasks}
        self.stats: dict[int, TaskStats] = {t: TaskStats() for t in spec.tasks}
        self.collectors: dict[int, Any] = {}
        self.emitter = Emitter(host, spec.component, self.stats)
        self.active = threading.Event()
        self._stop = threading.Event()
        self._done = 0  # tuples taken from the queue and fully processed
        self._thread = threading.Thread(target=self._run, name=f"spark-storm-executor-{spec}", daemon=True)
        self.failed_with: BaseException | None = None

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def activate(self) -> None:
        self.active.set()
        self.queue.wake()

    def deactivate(self) -> None:
        self.active.clear()
        self.queue.wake()  # a take under way finishes first; later ones see the gate closed

    def stop(self) -> None:
        """Finish what is queued (when active), clean up and exit."""
        self._stop.set()
        self.queue.wake()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def idle(self) -> bool:
        """Nothing queued, and everything taken from the queue has been processed."""
        q = self.queue
        return len(q) == 0 and q.consumed == self._done

    def _make_collector(self, task: int) -> Any:
        raise NotImplementedError

    def _prepare(self) -> None:
        plan = self.host.plan
        topo = plan.topology
        tasks = tuple(plan.component_tasks[self.component.id])
        for task, bolt in self.bolts.items():
            ctx = TopologyContext(
                topo.name, self.component.id, task, tasks, dict(self.component.outputs), str(self.host.slot), plan
            )
            collector = self._make_collector(task)
            self.collectors[task] = collector
            bolt.prepare(self.conf, ctx, collector)
        self.emitter.flush()

    def _run(self) -> None:
        self.emitter.owner = self.queue.consumer = threading.get_ident()
        try:
            self._prepare()
        except Exception as exc:
            self.failed_with = exc
            logger.exception("executor %s: prepare failed; stopping the worker", self.spec)
            self.host.request_stop(f"executor {self.spec} failed to prepare: {exc!r}")
            return
        next_tick = time.monotonic() + self.tick_s if self.tick_s else None
        queue = self.queue
        limit = self._batch_limit
        try:
            while True:
                if not self.active.is_set():
                    if self._stop.is_set():
                        break
                    self.active.wait(0.05)
                    continue
                wait = 0.05 if next_tick is None else max(0.0, min(0.05, next_tick - time.monotonic()))
                items = queue.take(limit, wait, self.active.is_set)
                if items:
                    weight = self._process(items)
                    self.emitter.flush()
                    self._done += weight
                elif self._stop.is_set() and len(queue) == 0:
                    break
                if next_tick is not None and time.monotonic() >= next_tick:
                    self._tick()
                    self.emitter.flush()
                    next_tick = time.monotonic() + self.tick_s  # type: ignore[operator]
            # Stopping: refuse further publishes (publishers reroute them to the task's new
            # place), then run what slipped in since the last look.
            queue.close()
            leftover = queue.take(1 << 30, 0)
            if leftover:
                self._done += self._process(leftover)
                self.emitter.flush()
        except Exception as exc:
            # The executor's own machinery failed (not a bolt: bolt errors follow the policy).
            self.failed_with = exc
            logger.exception("executor %s died; stopping the worker", self.spec)
            self.host.request_stop(f"executor {self.spec} died: {exc!r}")
        finally:
            for task, bolt in self.bolts.items():
                try:
                    bolt.cleanup()
                except Exception as exc:
                    logger.exception("executor %s: cleanup of task %d raised %r", self.spec, task, exc)

    def _process(self, items: list[QueueItem]) -> int:
        raise NotImplementedError

    def _tick(self) -> None:
        raise NotImplementedError

    def _bolt_error(self, task: int, item: Any, exc: Exception) -> None:
        """Count, log and report a bolt's exception, then apply ``topology.bolt.error.policy``."""
        self.stats[task].errors += 1
        logger.error(
            "bolt %s task %d raised on %r (policy %s)", self.component.id, task, item, self.policy, exc_info=exc
        )
        self.host.report_error(self.component.id, task, f"{type(exc).__name__}: {exc}")
        if self.policy == "fail" or item.anchors:
            # A tracked tuple that raised was not processed: fail it so the sender
            # replays its group now, rather than after the message timeout.
            self.collectors[task].fail(item)
        elif self.policy == "stop":
            self.host.request_stop(f"bolt {self.component.id} task {task} raised {exc!r} (policy stop)")

    def update_rates(self) -> None:
        """Measure every task's rate and capacity over the last period (the worker's timer)."""
        for stats in self.stats.values():
            stats.update_rates()

    def metrics(self) -> dict[str, Any]:
        tasks = {t: s.snapshot() for t, s in self.stats.items()}
        return {
            "component": self.spec.component,
            "source": self.component.source,
            "kind": self.kind,
            "queue": self.queue.metrics(),
            # the tasks share the executor's thread: its busy fraction is their sum
            "capacity": round(min(1.0, sum(t["capacity"] for t in tasks.values())), 4),
            "tasks": tasks,
        }


class TupleExecutor(Executor):
    """Runs :class:`Bolt` tasks, one ``execute`` per tuple."""

    kind = "tuple"

    def _make_collector(self, task: int) -> TaskCollector:
        return TaskCollector(self.host, self.emitter, self.component, task, self.stats[task])

    def _process(self, items: list[QueueItem]) -> int:
        weight = 0
        for task, payload in items:
            tuples = payload if type(payload) is list else self._rows_of(payload)
            weight += len(payload)
            if task == BROADCAST_TASK:
                for each in self.bolts:
                    self._run_tuples(each, tuples)
            else:
                self._run_tuples(task, tuples)
        return weight

    def _run_tuples(self, task: int, tuples: list[Tuple], tick: bool = False) -> None:
        if not tuples:
            return
        execute = self.bolts[task].execute
        stats = self.stats[task]
        start = _now()
        try:
            execute(tuples[0])  # the timed sample
        except Exception as exc:
            self._bolt_error(task, tuples[0], exc)
        sampled = _now()
        if len(tuples) > 1:
            it = iter(tuples)
            next(it)
            tup = tuples[0]
            while True:
                try:
                    for tup in it:
                        execute(tup)
                    break
                except Exception as exc:
                    self._bolt_error(task, tup, exc)
        stats.busy_s += _now() - start
        if tick:  # ticks are not data: counted apart, not in executed
            stats.ticks += 1
            return
        stats.executed += len(tuples)
        stats.batches += 1
        stats.sample(sampled - start)

    def _rows_of(self, batch: ColumnarBatch) -> list[Tuple]:
        """Turn a columnar batch from a batch bolt into one tuple per row (each its own edge)."""
        tuples = [Tuple(values, batch.source) for values in rows_of(batch.data)]
        if batch.anchors and tuples:
            # The batch's edge becomes one edge per row: E ^ e1 ^ ... ^ en, in one update.
            for worker_id, root, edge in batch.anchors:
                update = edge
                for tup in tuples:
                    child = new_edge()
                    update ^= child
                    tup.anchors = [*tup.anchors, (worker_id, root, child)]
                self.emitter.acker_op(worker_id, [ACK_OP, root, update])
        return tuples

    def _tick(self) -> None:
        tick = Tuple([time.time()], TICK_SOURCE)
        for task in self.bolts:
            self._run_tuples(task, [tick], tick=True)


class BatchExecutor(Executor):
    """Runs :class:`BatchBolt` tasks, one ``execute_batch`` per columnar batch."""

    kind = "batch"

    def _make_collector(self, task: int) -> BatchCollector:
        return BatchCollector(self.host, self.emitter, self.component, task, self.stats[task])

    def _process(self, items: list[QueueItem]) -> int:
        weight = 0
        pending_rows: dict[tuple[int, int], list[Tuple]] = {}  # (task, id(source)) -> tuples, per origin
        order: list[tuple[int, Any]] = []
        for task, payload in items:
            weight += len(payload)
            if type(payload) is list:
                if not payload:
                    continue
                key = (task, id(payload[0].source))
                group = pending_rows.get(key)
                if group is None:
                    pending_rows[key] = group = []
                    order.append((task, group))
                group.extend(payload)
            else:
                order.append((task, payload))
        for task, payload in order:
            batch = payload if type(payload) is not list else self._assemble(task, payload)
            if batch is None:
                continue
            if task == BROADCAST_TASK:
                for each in self.bolts:
                    self._run_batch(each, batch)
            else:
                self._run_batch(task, batch)
        return weight

    def _assemble(self, task: int, tuples: list[Tuple]) -> ColumnarBatch | None:
        """Tuples of one origin from tuple bolts upstream, as one record batch (one edge)."""
        source = tuples[0].source
        try:
            data = batch_from_rows([t.values for t in tuples], source.fields)
        except WireFormatError as exc:
            target = task if task != BROADCAST_TASK else next(iter(self.bolts))
            self.stats[target].errors += len(tuples)
            logger.error("executor %s: cannot assemble %d tuples from %r: %s", self.spec, len(tuples), source, exc)
            self.host.report_error(self.component.id, target, str(exc))
            for tup in tuples:
                if tup.anchors:
                    self.collectors[target].fail(tup)
            return None
        batch = ColumnarBatch(data, source)
        roots: dict[tuple[int, int], int] = {}
        for tup in tuples:
            for worker_id, root, edge in tup.anchors:
                key = (worker_id, root)
                roots[key] = roots.get(key, 0) ^ edge
        if roots:
            anchors = []
            for (worker_id, root), acked in roots.items():
                edge = new_edge()  # the batch's edge replaces its tuples' edges, in one update
                anchors.append((worker_id, root, edge))
                self.emitter.acker_op(worker_id, [ACK_OP, root, acked ^ edge])
            batch.anchors = anchors
        return batch

    def _run_batch(self, task: int, batch: ColumnarBatch, tick: bool = False) -> None:
        stats = self.stats[task]
        start = _now()
        try:
            self.bolts[task].execute_batch(batch)
        except Exception as exc:
            self._bolt_error(task, batch, exc)
        elapsed = _now() - start
        stats.busy_s += elapsed
        if tick:
            stats.ticks += 1
            return
        stats.executed += batch.num_rows
        stats.batches += 1
        stats.sample(elapsed)

    def _tick(self) -> None:
        import pyarrow as pa

        tick = ColumnarBatch(pa.record_batch({"ts": [time.time()]}), TICK_SOURCE)
        for task in self.bolts:
            self._run_batch(task, tick, tick=True)


def make_executor(
    host: ExecutorHost,
    spec: ExecutorSpec,
    queue: BatchQueue[QueueItem],
    settings: WorkerSettings,
    worker_conf: Mapping[str, Any],
) -> Executor:
    """Build the executor of ``spec``: its bolt class decides tuple or batch.

    Raises
    ------
    ConfigError
        The component's bolt cannot be imported or is neither a Bolt nor a BatchBolt.
    """
    from spark_storm.worker.adapters import adapt_class
    from spark_storm.worker.spout import Spout, SpoutExecutor

    component = host.plan.topology.components[spec.component]
    conf = {**worker_conf, **host.plan.topology.conf, **component.conf}
    bolt_cls = adapt_class(component, resolve_class(component.bolt, f"component {component.id!r} bolt"))
    if component.spout or (isinstance(bolt_cls, type) and issubclass(bolt_cls, Spout)):
        return SpoutExecutor(host, spec, queue, settings, conf, bolt_cls)
    if isinstance(bolt_cls, type) and issubclass(bolt_cls, BatchBolt):
        return BatchExecutor(host, spec, queue, settings, conf, bolt_cls)
    if isinstance(bolt_cls, type) and issubclass(bolt_cls, Bolt):
        return TupleExecutor(host, spec, queue, settings, conf, bolt_cls)
    msg = f"component {component.id!r}: {component.bolt!r} is neither a Bolt nor a BatchBolt subclass"
    raise ConfigError(msg)
