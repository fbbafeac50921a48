"""The collectors bolts emit, ack and fail through: one per task.

* :class:`TaskCollector` — a tuple bolt's ``OutputCollector``: routes each emit with the
  consumers' groupers (:mod:`spark_storm.topology.grouping`) into the executor's
  :class:`~spark_storm.worker.emitter.Emitter`;
* :class:`BatchCollector` — a batch bolt's ``BatchOutputCollector``: routes record
  batches with numpy (:mod:`spark_storm.topology.routing`).

Both ack and fail tuples and batches alike, in the trees they belong to
(:mod:`spark_storm.worker.acker` holds the algebra).  A bolt that emits from a thread of
its own gets its emits sent at once instead of at the end of the executor's batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any

from spark_storm.codec.columnar import ColumnarBatch, as_record_batch
from spark_storm.codec.tuples import NO_ANCHORS, Tuple
from spark_storm.errors import ConfigError, WireFormatError
from spark_storm.topology.grouping import Grouper, make_grouper
from spark_storm.topology.model import DEFAULT_STREAM, Component
from spark_storm.worker.acker import ack_ops, child_anchors, fail_ops, one_child
from spark_storm.worker.bolt import BatchOutputCollector, OutputCollector
from spark_storm.worker.emitter import Emitter
from spark_storm.worker.stats import TaskStats

if TYPE_CHECKING:
    import pyarrow as pa

    from spark_storm.worker.state import WorkerState

__all__ = ["BatchCollector", "TaskCollector"]


def _parents(anchors: Any) -> list[Any]:
    if anchors is None:
        return []
    if isinstance(anchors, (list, tuple)):
        return list(anchors)
    return [anchors]


def _undeclared(component: Component, stream: str) -> ConfigError:
    msg = (
        f"component {component.id!r} emitted on undeclared stream {stream!r}; "
        f"declare it under 'outputs' (declared: {sorted(component.outputs)})"
    )
    return ConfigError(msg)


class _AckingCollector:
    """Acks and fails for tuples and batches alike: both carry anchors and pending edges."""

    def __init__(self, host: WorkerState, emitter: Emitter, component: Component, task: int, stats: TaskStats) -> None:
        self._host = host
        self._emitter = emitter
        self._component = component
        self._task = task
        self._stats = stats

    def _acker_op(self, worker_id: int, op: list[Any]) -> None:
        if threading.get_ident() == self._emitter.owner:
            self._emitter.acker_op(worker_id, op)
        else:
            self._host.acker_ops(worker_id, [op])

    def _emitter_here(self) -> tuple[Emitter, bool]:
        """Return the emitter to use on this thread, and whether it is the executor's own."""
        emitter = self._emitter
        if threading.get_ident() == emitter.owner:
            return emitter, True
        return emitter.fork(), False


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

    def __init__(self, host: WorkerState, emitter: Emitter, component: Component, task: int, stats: TaskStats) -> None:
        super().__init__(host, emitter, component, task, stats)
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
            return _undeclared(self._component, stream)
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
        own = get_ident() == emitter.owner  # what _emitter_here does, without a call per emit
        if not own:
            emitter = emitter.fork()
        if anchors is None or (type(anchors) is Tuple and not anchors.anchors):
            trees = None  # untracked: the common case, no tree bookkeeping at all
        elif type(anchors) is Tuple and len(targets) == 1 and len(anchors.anchors) == 1:
            trees = [one_child(anchors, self._host.remote_worker_of(targets[0]))]  # tracked: the common case
        else:
            remote = self._host.remote_worker_of
            trees = child_anchors(_parents(anchors), [remote(dest) for dest in targets])
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
        if not own:
            emitter.flush()

    def forward(self, tuples: list[Tuple]) -> int:
        """Emit each tuple's values on the default stream and ack it, as :class:`PassThroughBolt` does.

        The executor's path for the built-in pass-through (every source without a bolt of its
        own runs one): the emits go straight into the executor's emitter, with no call per
        tuple.  It stops at the first tuple it does not take (tracked, a tick, values of
        another arity, or off the executor's thread) and returns how many it took, in order;
        the caller runs the rest through ``execute``.
        """
        route = self._routes.get(DEFAULT_STREAM)
        if route is None or threading.get_ident() != self._emitter.owner:
            return 0
        arity = route.arity
        choose = route.choose
        task = self._task
        rows = self._emitter.rows
        outs: dict[int, list[list[Any]]] = {}  # destination -> its rows in ``rows``
        taken = 0
        for tup in tuples:
            values = tup.values
            if tup.anchors or type(values) is not list or len(values) != arity or tup.source.is_tick:
                break
            for dest in choose(values):
                out = outs.get(dest)
                if out is None:
                    key = (task, DEFAULT_STREAM, dest)
                    out = rows.get(key)
                    if out is None:
                        out = rows[key] = []
                    outs[dest] = out
                out.append(values)
            taken += 1
        self._stats.acked += taken
        return taken

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
            ack_ops(tup, self._acker_op)

    def fail(self, tup: Tuple) -> None:
        self._stats.failed += 1
        if tup.anchors:
            fail_ops(tup, self._acker_op)

    def report_error(self, error: str) -> None:
        self._host.report_error(self._component.id, self._task, error)

    def for_thread(self) -> TaskCollector:
        """Return a collector for the calling thread of the bolt's own: its emits batch until :meth:`flush`."""
        emitter = self._emitter.fork()
        emitter.owner = threading.get_ident()
        return TaskCollector(self._host, emitter, self._component, self._task, self._stats)

    def flush(self) -> None:
        """Send what this collector's thread emitted (see :meth:`for_thread`)."""
        if threading.get_ident() == self._emitter.owner:
            self._emitter.flush()


class BatchCollector(_AckingCollector, BatchOutputCollector):
    """The collector of one batch-bolt task: routes record batches with numpy."""

    def __init__(self, host: WorkerState, emitter: Emitter, component: Component, task: int, stats: TaskStats) -> None:
        from spark_storm.topology.routing import make_batch_router

        super().__init__(host, emitter, component, task, stats)
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
            raise _undeclared(self._component, stream)
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
        emitter, own = self._emitter_here()
        remote = self._host.remote_worker_of
        trees = child_anchors(_parents(anchors), [remote(d) for d, _ in pieces]) if anchors is not None else None
        for i, (dest, piece) in enumerate(pieces):
            emitter.batches.append((self._task, stream, dest, piece, trees[i] if trees else NO_ANCHORS))
        if not own:
            emitter.flush()

    def ack(self, batch: ColumnarBatch) -> None:
        self._stats.acked += batch.num_rows
        if batch.anchors:
            ack_ops(batch, self._acker_op)

    def fail(self, batch: ColumnarBatch) -> None:
        self._stats.failed += batch.num_rows
        if batch.anchors:
            fail_ops(batch, self._acker_op)
