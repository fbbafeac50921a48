"""Executors: one thread per executor running its tasks' bolts.

An executor takes whatever its queue holds (up to ``topology.executor.batch.size``
tuples), runs it through its bolts, then flushes everything the bolts emitted in one
go through its :class:`~spark_storm.worker.emitter.Emitter` (Storm 2.x batches emits the
same way):

* a **tuple executor** runs :class:`~spark_storm.worker.bolt.Bolt` tasks: ``execute``
  per tuple; a columnar batch from a batch bolt upstream becomes one tuple per row;
* a **batch executor** runs :class:`~spark_storm.worker.bolt.BatchBolt` tasks:
  ``execute_batch`` per batch; tuples from tuple bolts upstream become one record batch
  per origin and executor batch.

Where a batch becomes tuples or tuples a batch, their tuple-tree edges are converted in
one acker update (:func:`~spark_storm.worker.acker.row_edges`,
:func:`~spark_storm.worker.acker.batch_edge`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from spark_storm.codec.columnar import ColumnarBatch, batch_from_rows, rows_of
from spark_storm.codec.tuples import BROADCAST_TASK, TICK_SOURCE, Tuple
from spark_storm.errors import WireFormatError
from spark_storm.reports import ExecutorMetrics, WindowMetrics
from spark_storm.topology.assignment import ExecutorSpec
from spark_storm.topology.windows import window_spec
from spark_storm.worker.acker import batch_edge, row_edges
from spark_storm.worker.bolt import Bolt, PassThroughBolt, TopologyContext
from spark_storm.worker.checkpoint import ExecutorCheckpoints, NoAlignment
from spark_storm.worker.collectors import BatchCollector, TaskCollector
from spark_storm.worker.emitter import Emitter
from spark_storm.worker.queue import BatchQueue, QueueItem
from spark_storm.worker.settings import WorkerSettings
from spark_storm.worker.stats import TaskStats
from spark_storm.worker.windows import WindowedBatchBolt, WindowedBolt, WindowEngine, window_engine

if TYPE_CHECKING:
    from spark_storm.worker.state import WorkerState

__all__ = ["BatchExecutor", "Executor", "TupleExecutor"]

logger = logging.getLogger(__name__)
_now = time.perf_counter


class Executor:
    """Runs the bolts of one executor's task range on its own thread.

    Subclasses say how a batch of queue items reaches the bolts (:meth:`process`).
    """

    kind = "tuple"

    def __init__(
        self,
        host: WorkerState,
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
        window = window_spec(self.component.conf, f"component {self.component.id!r}", conf)
        if window is not None:  # windows are looked at every watermark interval
            interval = window.watermark_interval_ms / 1000
            self.tick_s = interval if self.tick_s is None else min(self.tick_s, interval)
        self._batch_limit = settings.executor_batch_size
        self.bolts: dict[int, Any] = {t: bolt_cls() for t in spec.tasks}
        self.stats: dict[int, TaskStats] = {t: TaskStats() for t in spec.tasks}
        self.collectors: dict[int, Any] = {}
        #: Tasks running the built-in PassThroughBolt: their collector's ``forward`` takes a whole list.
        self._forward: dict[int, Callable[[list[Tuple]], int]] = {}
        #: The window engines of windowed tasks (Storm's WindowedBoltExecutor): they take the
        #: task's input and call the bolt's execute_window.  Set whole once prepared.
        self.windows: dict[int, WindowEngine[Any]] = {}
        self.emitter = Emitter(host, spec.component, self.stats)
        self.active = threading.Event()
        self._stop = threading.Event()
        self._done = 0  # tuples taken from the queue and fully processed
        self._busy = False  # inside a batch (processing or flushing)
        #: Barrier alignment and checkpointed state (stateful topologies only).
        self.checkpoints: ExecutorCheckpoints | NoAlignment = host.checkpoints.for_executor(self)
        self._thread = threading.Thread(target=self._run, name=f"spark-storm-executor-{spec}", daemon=True)

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
        if self._thread.ident is None:  # never started: a worker stopped because its start failed
            return
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def idle(self) -> bool:
        """Nothing queued, everything taken from the queue processed, and no bolt still working on a tuple.

        The last: a multilang bolt's child may hold tuples its ``execute`` queued (``Bolt.in_flight``).
        """
        q = self.queue
        return (
            len(q) == 0
            and q.consumed == self._done
            and not any(b.in_flight() for b in self.bolts.values() if isinstance(b, Bolt))
        )

    @property
    def busy(self) -> bool:
        """Inside a batch (its thread alive)."""
        return self._busy and self._thread.is_alive()

    def drop_queued(self) -> None:
        """Drop what is queued and held for alignment (a rollback; the executor is quiesced)."""
        self.queue.clear()  # never taken: neither consumed nor done
        self._done += self.checkpoints.reset()  # taken, and now done with

    def _make_collector(self, task: int) -> Any:
        raise NotImplementedError

    def _prepare(self) -> None:
        plan = self.host.plan
        topo = plan.topology
        tasks = tuple(plan.component_tasks[self.component.id])
        windows: dict[int, WindowEngine[Any]] = {}
        for task, bolt in self.bolts.items():
            ctx = TopologyContext(
                topo.name, self.component.id, task, tasks, dict(self.component.outputs), str(self.host.slot), plan
            )
            collector = self._make_collector(task)
            self.collectors[task] = collector
            if type(bolt) is PassThroughBolt and isinstance(collector, TaskCollector):
                self._forward[task] = collector.forward
            if isinstance(bolt, (WindowedBolt, WindowedBatchBolt)):
                windows[task] = engine = window_engine(bolt, self.conf, ctx, collector)
                collector = engine.anchoring
            bolt.prepare(self.conf, ctx, collector)
        self.windows = windows
        self.checkpoints.restore_all()
        self.emitter.flush()

    def _run(self) -> None:
        self.emitter.owner = self.queue.consumer = threading.get_ident()
        try:
            self._prepare()
        except Exception as exc:  # a bolt's prepare, whatever it raised: the worker must not half-run
            logger.exception("executor %s: prepare failed; stopping the worker", self.spec)
            self.host.request_stop(f"executor {self.spec} failed to prepare: {exc!r}")
            return
        next_tick = time.monotonic() + self.tick_s if self.tick_s else None
        queue = self.queue
        limit = self._batch_limit
        checkpoints = self.checkpoints
        process = checkpoints.process  # the bolts' own, or through barrier alignment
        try:
            while True:
                # Busy before the active check: a PAUSE clears ``active`` and then waits while
                # ``busy``, so either it sees this iteration or this iteration sees it (no tick,
                # no pre_commit after a PAUSE found the executor idle).
                self._busy = True
                if not self.active.is_set():
                    self._busy = False
                    if self._stop.is_set():
                        break
                    self.active.wait(0.05)
                    continue
                wait = 0.05 if next_tick is None else max(0.0, min(0.05, next_tick - time.monotonic()))
                # Read before the take: a rollback's PAUSE stops the executors (the take's gate)
                # before it raises the generation, so what this batch emits carries the
                # generation its input arrived in, and a rollback that starts mid-batch voids it.
                self.emitter.generation = self.host.generation
                items = queue.take(limit, wait, self.active.is_set)
                if items:
                    weight = process(items)
                    self.emitter.flush()
                    self._done += weight
                elif self._stop.is_set() and len(queue) == 0:
                    self._busy = False
                    break
                if next_tick is not None and time.monotonic() >= next_tick:
                    self._tick()
                    self.emitter.flush()
                    next_tick = time.monotonic() + self.tick_s  # type: ignore[operator]
                checkpoints.check_commits()
                self._busy = False
            # Stopping: refuse further publishes (publishers reroute them to the task's new
            # place), then run what slipped in since the last look.
            queue.close()
            leftover = queue.take(1 << 30, 0)
            if leftover:
                self._done += process(leftover)
                self.emitter.flush()
        except Exception as exc:
            # The executor's own machinery failed (not a bolt: bolt errors follow the policy).
            logger.exception("executor %s died; stopping the worker", self.spec)
            self.host.request_stop(f"executor {self.spec} died: {exc!r}")
        finally:
            for task, bolt in self.bolts.items():
                try:
                    bolt.cleanup()
                except Exception as exc:
                    logger.exception("executor %s: cleanup of task %d raised %r", self.spec, task, exc)

    def process(self, items: list[QueueItem]) -> int:
        """Run a batch of queue items through the bolts (the executor's thread); return their weight in tuples."""
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

    def metrics(self) -> ExecutorMetrics:
        tasks = {str(t): s.snapshot() for t, s in self.stats.items()}
        return {
            "component": self.spec.component,
            "source": self.component.source,
            "kind": self.kind,
            "queue": self.queue.metrics(),
            # the tasks share the executor's thread: its busy fraction is their sum
            "capacity": round(min(1.0, sum(t["capacity"] for t in tasks.values())), 4),
            "tasks": tasks,
            "state": self.checkpoints.metrics() if self.checkpoints.stateful else None,
            "windows": self._window_metrics(),
        }

    def _window_metrics(self) -> WindowMetrics | None:
        """Return the windowed tasks' counters summed, with the lowest watermark (None: not windowed)."""
        per = [engine.metrics() for engine in self.windows.values()]
        if not per:
            return None
        marks = [m["watermark_ms"] for m in per]
        return {
            "spec": per[0]["spec"],
            "watermark_ms": None if None in marks else min(m for m in marks if m is not None),
            "windows": sum(m["windows"] for m in per),
            "late": sum(m["late"] for m in per),
            "bad_times": sum(m["bad_times"] for m in per),
            "held": sum(m["held"] for m in per),
        }


class TupleExecutor(Executor):
    """Runs :class:`Bolt` tasks, one ``execute`` per tuple."""

    kind = "tuple"

    def _make_collector(self, task: int) -> TaskCollector:
        return TaskCollector(self.host, self.emitter, self.component, task, self.stats[task])

    def process(self, items: list[QueueItem]) -> int:
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
        forward = self._forward.get(task)
        if forward is not None and not tick:
            start = _now()
            taken = forward(tuples)
            if taken:
                stats = self.stats[task]
                spent = _now() - start
                stats.busy_s += spent
                stats.executed += taken
                stats.batches += 1
                stats.sample(spent / taken)
                if taken == len(tuples):
                    return
                tuples = tuples[taken:]
        engine = self.windows.get(task)
        execute = self.bolts[task].execute if engine is None else engine.execute
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
            for tup, anchors in zip(tuples, row_edges(batch.anchors, len(tuples), self.emitter.acker_op), strict=True):
                tup.anchors = anchors
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

    def process(self, items: list[QueueItem]) -> int:
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
        if any(tup.anchors for tup in tuples):  # the batch's edge replaces its tuples' edges, in one update
            batch.anchors = batch_edge(tuples, self.emitter.acker_op)
        return batch

    def _run_batch(self, task: int, batch: ColumnarBatch, tick: bool = False) -> None:
        stats = self.stats[task]
        engine = self.windows.get(task)
        start = _now()
        try:
            (self.bolts[task].execute_batch if engine is None else engine.execute)(batch)
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
