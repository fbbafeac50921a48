"""Executors: one thread per executor, one bolt instance per task.

An executor consumes its receive queue in batches and calls ``bolt.execute`` for each
tuple (a broadcast tuple goes to every task of the executor).  Emits go through the
task's collector, which routes them with the topology's groupings and hands them to the
worker (local queue or transfer queue).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from spark_storm.errors import ConfigError
from spark_storm.messaging import TaskMessage
from spark_storm.topology.assignment import ExecutorSpec
from spark_storm.topology.grouping import Grouper, make_grouper
from spark_storm.topology.model import DEFAULT_STREAM, Component, resolve_class
from spark_storm.worker.acker import new_edge
from spark_storm.worker.bolt import Bolt, OutputCollector, TopologyContext
from spark_storm.worker.queue import RingQueue
from spark_storm.worker.tuples import BROADCAST_TASK, SYSTEM_COMPONENT, TICK_STREAM, AddressedTuple, Tuple

if TYPE_CHECKING:
    from spark_storm.worker.worker import Worker

__all__ = ["BoltStats", "EmitBuffer", "Executor", "TaskCollector"]

logger = logging.getLogger(__name__)
_new = tuple.__new__
ACK_OP = 1
FAIL_OP = 2


class EmitBuffer:
    """An executor's emits, published once per destination queue at end of batch.

    Storm 2.x batches emits the same way: one lock round-trip per destination and batch
    instead of one per tuple.  Only the owning executor thread adds to it.
    """

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self.owner = threading.get_ident()
        self._local: dict[int, tuple[RingQueue[AddressedTuple], list[AddressedTuple]]] = {}
        self._remote: list[TaskMessage] = []
        self._acks: dict[int, list[list[int]]] = {}

    def add(
        self,
        component: str,
        src_task: int,
        stream: str,
        values: list[Any],
        targets: list[int],
        trees: list[list[tuple[int, int, int]]] | None = None,
    ) -> None:
        """Queue one emitted tuple for ``targets``; ``trees`` gives each copy's acker anchors."""
        worker = self._worker
        payload: bytes | None = None
        tup: Tuple | None = None
        fields = worker.plan.topology.components[component].fields_of(stream)
        for i, task in enumerate(targets):
            anchors = trees[i] if trees else []
            queue = worker.task_queue.get(task)
            if queue is not None:
                if tup is None or anchors:  # each tracked copy is its own tuple in the tree
                    tup = Tuple(values, fields, component, src_task, stream)
                    tup.anchors = anchors
                entry = self._local.get(id(queue))
                if entry is None:
                    entry = self._local[id(queue)] = (queue, [])
                entry[1].append(_new(AddressedTuple, (task, tup)))
            else:
                if anchors:
                    data = worker.serializer.dumps([src_task, stream, values, [list(a) for a in anchors]])
                    self._remote.append(TaskMessage(task, data))
                    continue
                if payload is None:
                    payload = worker.serializer.dumps_tuple(src_task, stream, values)
                self._remote.append(TaskMessage(task, payload))

    def acker_op(self, slot_index: int, op: list[int]) -> None:
        """Queue an acker update (sent with the batch's emits)."""
        self._acks.setdefault(slot_index, []).append(op)

    def flush(self) -> None:
        # Emits first, then acker updates: a child is queued before its parent's ack can
        # complete the tree (the XOR makes the order safe either way; this keeps it tidy).
        if self._local:
            local, self._local = self._local, {}
            for queue, items in local.values():
                queue.publish(items)
        if self._remote:
            remote, self._remote = self._remote, []
            self._worker.transfer_queue.publish(remote)
        if self._acks:
            acks, self._acks = self._acks, {}
            for slot_index, ops in acks.items():
                self._worker.acker_ops(slot_index, ops)


class BoltStats:
    """Counters of one task: executed, emitted, acked, failed, errors, total latency."""

    __slots__ = ("acked", "emitted", "errors", "executed", "failed", "latency_s")

    def __init__(self) -> None:
        self.executed = 0
        self.emitted = 0
        self.acked = 0
        self.failed = 0
        self.errors = 0
        self.latency_s = 0.0


class TaskCollector(OutputCollector):
    """The collector of one task: routes emits by the consumers' groupings."""

    def __init__(self, worker: Worker, component: Component, task: int, stats: BoltStats, buffer: EmitBuffer) -> None:
        self._worker = worker
        self._buffer = buffer
        self._component = component
        self._task = task
        self._stats = stats
        self._routes: dict[str, list[tuple[str, Grouper]]] = {}
        topo = worker.plan.topology
        for stream in component.outputs:
            routes = []
            for consumer, inp in topo.consumers(component.id, stream):
                targets = list(worker.plan.component_tasks[consumer.id])
                grouper = make_grouper(inp, component, targets, local_tasks=worker.local_tasks, load=worker.get_load)
                routes.append((inp.grouping, grouper))
            self._routes[stream] = routes

    def _check(self, stream: str, values: Sequence[Any]) -> None:
        fields = self._component.outputs.get(stream)
        if fields is None:
            msg = (
                f"component {self._component.id!r} emitted on undeclared stream {stream!r}; "
                f"declare it under 'outputs' (declared: {sorted(self._component.outputs)})"
            )
            raise ConfigError(msg)
        if len(values) != len(fields):
            msg = (
                f"component {self._component.id!r} emitted {len(values)} values on {stream!r}, "
                f"which declares {len(fields)} fields {list(fields)}"
            )
            raise ConfigError(msg)

    def emit(
        self,
        values: Sequence[Any],
        stream: str = DEFAULT_STREAM,
        anchors: Sequence[Tuple] | Tuple | None = None,
    ) -> list[int]:
        self._check(stream, values)
        targets: list[int] = []
        for grouping, grouper in self._routes.get(stream, ()):
            if grouping != "direct":
                targets.extend(grouper.choose(values))
        if targets:
            self._send(stream, list(values), targets, anchors)
            self._stats.emitted += len(targets)
        return targets

    def _send(
        self, stream: str, values: list[Any], targets: list[int], anchors: Sequence[Tuple] | Tuple | None
    ) -> None:
        trees = _child_anchors(anchors, len(targets))
        if threading.get_ident() == self._buffer.owner:
            self._buffer.add(self._component.id, self._task, stream, values, targets, trees)
        else:  # a bolt emitting from a thread of its own: no batching, send now
            buffer = EmitBuffer(self._worker)
            buffer.add(self._component.id, self._task, stream, values, targets, trees)
            buffer.flush()

    def emit_direct(
        self,
        task: int,
        values: Sequence[Any],
        stream: str = DEFAULT_STREAM,
        anchors: Sequence[Tuple] | Tuple | None = None,
    ) -> None:
        self._check(stream, values)
        for grouping, grouper in self._routes.get(stream, ()):
            if grouping == "direct" and task in grouper.targets:
                self._send(stream, list(values), [task], anchors)
                self._stats.emitted += 1
                return
        msg = (
            f"emit_direct to task {task} on {self._component.id!r} stream {stream!r}: no consumer "
            "subscribed with direct grouping owns that task"
        )
        raise ConfigError(msg)

    def ack(self, tup: Tuple) -> None:
        self._stats.acked += 1
        if tup.anchors:
            anchors, tup.anchors = tup.anchors, []  # acking twice must not count twice
            pending = tup.pending or {}
            for slot_index, root, edge in anchors:
                self._acker_op(slot_index, [ACK_OP, root, edge ^ pending.get((slot_index, root), 0)])

    def fail(self, tup: Tuple) -> None:
        self._stats.failed += 1
        if tup.anchors:
            anchors, tup.anchors = tup.anchors, []
            for slot_index, root, _edge in anchors:
                self._acker_op(slot_index, [FAIL_OP, root, 0])

    def _acker_op(self, slot_index: int, op: list[int]) -> None:
        if threading.get_ident() == self._buffer.owner:
            self._buffer.acker_op(slot_index, op)
        else:
            self._worker.acker_ops(slot_index, [op])


def _child_anchors(anchors: Sequence[Tuple] | Tuple | None, copies: int) -> list[list[tuple[int, int, int]]] | None:
    """Give each emitted copy a fresh edge in every tree its anchors belong to (Storm's acker)."""
    if anchors is None:
        return None
    parents = [anchors] if isinstance(anchors, Tuple) else list(anchors)
    if not any(p.anchors for p in parents):
        return None
    trees = []
    for _ in range(copies):
        edge = new_edge()
        child: dict[tuple[int, int], int] = {}
        for parent in parents:
            for slot_index, root, _e in parent.anchors:
                key = (slot_index, root)
                if parent.pending is None:
                    parent.pending = {}
                parent.pending[key] = parent.pending.get(key, 0) ^ edge
                child[key] = child.get(key, 0) ^ edge
        trees.append([(s, r, e) for (s, r), e in child.items()])
    return trees


class Executor:
    """Runs the bolts of one executor's task range on its own thread."""

    def __init__(self, worker: Worker, spec: ExecutorSpec, queue: RingQueue[AddressedTuple]) -> None:
        self.worker = worker
        self.spec = spec
        self.queue = queue
        self.component = worker.plan.topology.components[spec.component]
        self.conf: Mapping[str, Any] = {**worker.conf, **worker.plan.topology.conf, **self.component.conf}
        self.policy = str(self.conf.get("topology.bolt.error.policy", "log"))
        if self.policy not in ("log", "fail", "stop"):
            msg = f"topology.bolt.error.policy must be log, fail or stop, got {self.policy!r}"
            raise ConfigError(msg)
        tick = self.conf.get("topology.tick.tuple.freq.secs")
        self.tick_s = float(tick) if tick else None
        bolt_cls = resolve_class(self.component.bolt, f"component {self.component.id!r} bolt")
        if not (isinstance(bolt_cls, type) and issubclass(bolt_cls, Bolt)):
            msg = f"component {self.component.id!r}: {self.component.bolt!r} is not a Bolt subclass"
            raise ConfigError(msg)
        self.bolts: dict[int, Bolt] = {t: bolt_cls() for t in spec.tasks}
        self.stats: dict[int, BoltStats] = {t: BoltStats() for t in spec.tasks}
        self.collectors: dict[int, TaskCollector] = {}
        self.active = threading.Event()
        self.busy = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"spark-storm-executor-{spec}", daemon=True)
        self._prepared = threading.Event()
        self._batch_limit = 1024  # bounds the emit buffer and the latency of one batch
        self.failed_with: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def _prepare(self) -> None:
        topo = self.worker.plan.topology
        tasks = tuple(self.worker.plan.component_tasks[self.component.id])
        for task, bolt in self.bolts.items():
            ctx = TopologyContext(
                topo.name, self.component.id, task, tasks, dict(self.component.outputs), str(self.worker.slot)
            )
            collector = TaskCollector(self.worker, self.component, task, self.stats[task], self._emits)
            self.collectors[task] = collector
            bolt.prepare(self.conf, ctx, collector)
        self._emits.flush()

    def _run(self) -> None:
        self._emits = EmitBuffer(self.worker)
        try:
            self._prepare()
        except Exception as exc:
            self.failed_with = exc
            logger.exception("executor %s: prepare failed; stopping the worker", self.spec)
            self._prepared.set()
            self.worker.request_stop(f"executor {self.spec} failed to prepare: {exc}")
            return
        self._prepared.set()
        next_tick = time.monotonic() + self.tick_s if self.tick_s else None
        try:
            while True:
                if not self.active.is_set():
                    if self._stop.is_set():
                        break
                    self.active.wait(0.05)
                    continue
                if self.queue.wait_for_items(0.05):
                    if not self.active.is_set():
                        continue  # deactivated while waiting: leave the tuples queued
                    self.busy = True
                    try:
                        self.queue.consume_batch(self._handle, self._batch_limit)
                        self._emits.flush()
                    finally:
                        self.busy = False
                elif self._stop.is_set():
                    break
                if next_tick is not None and time.monotonic() >= next_tick:
                    self._tick()
                    self._emits.flush()
                    next_tick = time.monotonic() + (self.tick_s or 0)
        finally:
            for task, bolt in self.bolts.items():
                try:
                    bolt.cleanup()
                except Exception as exc:
                    logger.exception("executor %s: cleanup of task %d raised %r", self.spec, task, exc)

    def _tick(self) -> None:
        tick = Tuple([time.time()], ("ts",), SYSTEM_COMPONENT, -1, TICK_STREAM)
        for task in self.bolts:
            self._execute(task, tick)

    def _handle(self, item: AddressedTuple, end_of_batch: bool) -> None:
        task, tup = item
        if task == BROADCAST_TASK:
            for each in self.bolts:
                self._execute(each, tup)
        else:
            self._execute(task, tup)

    def _execute(self, task: int, tup: Tuple) -> None:
        stats = self.stats[task]
        started = time.perf_counter()
        try:
            self.bolts[task].execute(tup)
        except Exception as exc:
            stats.errors += 1
            logger.exception("bolt %s task %d raised on %r (policy %s)", self.component.id, task, tup, self.policy)
            if self.policy == "fail" or tup.anchors:
                # A tracked tuple that raised was not processed: fail it so the sender
                # replays its group now, rather than after the redelivery timeout.
                self.collectors[task].fail(tup)
            elif self.policy == "stop":
                self.worker.request_stop(f"bolt {self.component.id} task {task} raised {exc!r} (policy stop)")
        finally:
            stats.executed += 1
            stats.latency_s += time.perf_counter() - started

    def wait_prepared(self, timeout: float) -> bool:
        return self._prepared.wait(timeout)

    def stop(self) -> None:
        """Finish what is queued (when active), clean up and exit."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def metrics(self) -> dict[str, Any]:
        return {"queue": self.queue.metrics(), "tasks": {t: vars_of(s) for t, s in self.stats.items()}}


def vars_of(stats: BoltStats) -> dict[str, Any]:
    """Return a task's counters as a dict (latency as mean ms)."""
    mean = stats.latency_s / stats.executed * 1000 if stats.executed else 0.0
    return {
        "executed": stats.executed,
        "emitted": stats.emitted,
        "acked": stats.acked,
        "failed": stats.failed,
        "errors": stats.errors,
        "latency_ms": round(mean, 4),
    }
