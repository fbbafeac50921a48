"""Spouts: entry components that make their own tuples (Storm's ISpout), and the executor that runs them.

Most topologies here are fed by Spark (a *source* component).  A *spout* component is fed
by its spout instead: a Python :class:`Spout`, or a multilang child (Storm's ShellSpout,
:class:`~spark_storm.shell.ShellSpout`).  The :class:`SpoutExecutor` calls
``next_tuple`` in a loop on the executor's thread (at most ``topology.max.spout.pending``
tuple trees in flight per task), and when a spout emits with a message id, the tuple
roots a tree in the worker's XOR acker (:class:`~spark_storm.worker.acker.Acker`, the same
roots Spark's delivery groups use, through a :class:`~spark_storm.worker.acker.GroupTracker`).
When the tree completes, fails or times out (``topology.message.timeout.secs``), the
executor calls the spout's ``ack`` or ``fail`` with that message id, on its own thread.
"""

from __future__ import annotations

import abc
import collections
import functools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from spark_storm.codec.tuples import Tuple, TupleSource
from spark_storm.config import Config
from spark_storm.errors import StormError
from spark_storm.messaging.wire import PROCESSED
from spark_storm.topology.assignment import ExecutorSpec
from spark_storm.topology.model import DEFAULT_STREAM
from spark_storm.worker.acker import GroupTracker, ack_ops
from spark_storm.worker.bolt import TopologyContext
from spark_storm.worker.collectors import TaskCollector
from spark_storm.worker.executor import Executor
from spark_storm.worker.queue import BatchQueue, QueueItem
from spark_storm.worker.settings import WorkerSettings

if TYPE_CHECKING:
    from spark_storm.worker.state import WorkerState

__all__ = ["Spout", "SpoutExecutor", "SpoutOutputCollector"]

logger = logging.getLogger(__name__)

#: The origin of the invisible parent that roots a spout tuple's tree.
_ROOT_SOURCE: Final = TupleSource("__spout", -1, DEFAULT_STREAM, ())
_NO_VALUES: Final[list[Any]] = []


class SpoutOutputCollector(abc.ABC):
    """Emits on behalf of one spout task (Storm's SpoutOutputCollector)."""

    @abc.abstractmethod
    def emit(self, values: Sequence[Any], stream: str = DEFAULT_STREAM, message_id: Any = None) -> list[int]:
        """Emit a tuple; with a ``message_id`` it is tracked and the spout's ``ack``/``fail`` hear about it."""

    @abc.abstractmethod
    def emit_direct(
        self, task: int, values: Sequence[Any], stream: str = DEFAULT_STREAM, message_id: Any = None
    ) -> None:
        """Emit to one task of a consumer that subscribed with direct grouping."""

    @abc.abstractmethod
    def report_error(self, error: str) -> None:
        """Report an error (/health, the UI)."""


class Spout(abc.ABC):
    """A component that makes tuples (Storm's ISpout); one instance per task, on its executor's thread.

    Lifecycle: ``open``, ``activate``, then ``next_tuple`` in a loop (emit zero or more
    tuples and return soon: the executor waits ``topology.sleep.spout.wait.strategy.time.ms``
    when nothing was emitted), ``ack`` / ``fail`` with the message ids of tracked tuples,
    ``deactivate`` when the topology is deactivated, ``close`` at shutdown.
    """

    def open(self, conf: Mapping[str, Any], context: TopologyContext, collector: SpoutOutputCollector) -> None:
        """Set up the task; keep the collector to emit from ``next_tuple``."""
        self.conf = conf
        self.context = context
        self.collector = collector

    @abc.abstractmethod
    def next_tuple(self) -> None:
        """Emit the next tuple(s), if any."""

    def ack(self, message_id: Any) -> None:  # noqa: B027 - optional hook
        """Hear that the tuple tree of ``message_id`` completed."""

    def fail(self, message_id: Any) -> None:  # noqa: B027 - optional hook
        """Hear that the tuple tree of ``message_id`` failed or timed out (replay it if you can)."""

    def activate(self) -> None:  # noqa: B027 - optional hook
        """Get ready: the topology was activated, ``next_tuple`` calls follow."""

    def deactivate(self) -> None:  # noqa: B027 - optional hook
        """Pause: the topology was deactivated, no ``next_tuple`` until ``activate``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources at shutdown."""


class SpoutCollector(SpoutOutputCollector):
    """Routes a spout's emits with a tuple collector; a message id roots a tree in the acker."""

    def __init__(self, executor: SpoutExecutor, task: int, inner: TaskCollector) -> None:
        self._executor = executor
        self._task = task
        self._inner = inner
        self.emits = 0

    def _check_thread(self) -> None:
        # The executor's emitter, its pending counts and its acker updates belong to its thread
        # (docs/design/threads.md); Storm's spout collector is not thread-safe either.
        if threading.get_ident() != self._executor.emitter.owner:
            msg = (
                f"spout task {self._task} emitted from thread {threading.current_thread().name!r}: a spout emits "
                "from next_tuple/ack/fail on its executor's thread (hand work from your own threads to next_tuple "
                "through a queue)"
            )
            raise StormError(msg)

    def _root(self, message_id: Any) -> Tuple:
        executor = self._executor
        tracker = GroupTracker(functools.partial(executor.completed, self._task, message_id))
        tracker.expect(1)
        root, edge = executor.acker.root(tracker)
        tracker.sealed()
        parent = Tuple(_NO_VALUES, _ROOT_SOURCE)
        parent.anchors = [(executor.host.worker_id, root, edge)]
        executor.pending[self._task] += 1
        return parent

    def emit(self, values: Sequence[Any], stream: str = DEFAULT_STREAM, message_id: Any = None) -> list[int]:
        self._check_thread()
        self.emits += 1
        if message_id is None:
            return self._inner.emit(values, stream)
        parent = self._root(message_id)
        tasks = self._inner.emit(values, stream, anchors=parent)
        ack_ops(parent, self._executor.emitter.acker_op)  # the root's value becomes the XOR of its children's edges
        return tasks

    def emit_direct(
        self, task: int, values: Sequence[Any], stream: str = DEFAULT_STREAM, message_id: Any = None
    ) -> None:
        self._check_thread()
        self.emits += 1
        if message_id is None:
            self._inner.emit_direct(task, values, stream)
            return
        parent = self._root(message_id)
        self._inner.emit_direct(task, values, stream, anchors=parent)
        ack_ops(parent, self._executor.emitter.acker_op)

    def report_error(self, error: str) -> None:
        self._inner.report_error(error)


class SpoutExecutor(Executor):
    """Runs the :class:`Spout` tasks of one executor: ``next_tuple`` in a loop, ``ack``/``fail`` as trees end."""

    kind = "spout"

    def __init__(
        self,
        host: WorkerState,
        spec: ExecutorSpec,
        queue: BatchQueue[QueueItem],
        settings: WorkerSettings,
        conf: Mapping[str, Any],
        bolt_cls: type,
    ) -> None:
        super().__init__(host, spec, queue, settings, conf, bolt_cls)
        self.acker = host.acker
        c = conf if isinstance(conf, Config) else Config.of(conf)  # the defaults are defaults.yaml's
        self._max_pending = (
            c.get_int("topology.max.spout.pending", minimum=0) if c.get("topology.max.spout.pending") else 0
        )
        self._wait_s = c.get_float("topology.sleep.spout.wait.strategy.time.ms", minimum=0) / 1000
        self.pending: dict[int, int] = dict.fromkeys(spec.tasks, 0)
        self._ended: collections.deque[tuple[int, Any, bool]] = collections.deque()
        self._wake = threading.Event()

    def _make_collector(self, task: int) -> SpoutCollector:
        inner = TaskCollector(self.host, self.emitter, self.component, task, self.stats[task])
        return SpoutCollector(self, task, inner)

    def completed(self, task: int, message_id: Any, status: int) -> None:
        """Queue the ``ack``/``fail`` of a tree rooted by ``task`` that ended (any thread) for the executor's thread."""
        self._ended.append((task, message_id, status == PROCESSED))
        self._wake.set()

    @property
    def idle(self) -> bool:
        return True  # a spout's work shows in its consumers' queues; the worker stops spouts first

    def _prepare(self) -> None:
        plan = self.host.plan
        topo = plan.topology
        tasks = tuple(plan.component_tasks[self.component.id])
        for task, spout in self.bolts.items():
            ctx = TopologyContext(
                topo.name, self.component.id, task, tasks, dict(self.component.outputs), str(self.host.slot), plan
            )
            collector = self._make_collector(task)
            self.collectors[task] = collector
            spout.open(self.conf, ctx, collector)
        self.emitter.flush()

    def _call(self, task: int, what: str, fn: Any, *args: Any) -> bool:
        """Call a spout method; an exception is counted, reported and handled by ``topology.bolt.error.policy``."""
        try:
            fn(*args)
        except Exception as exc:
            self.stats[task].errors += 1
            name = self.component.id
            logger.error("spout %s task %d: %s raised (policy %s)", name, task, what, self.policy, exc_info=exc)
            self.host.report_error(self.component.id, task, f"{what}: {type(exc).__name__}: {exc}")
            if self.policy == "stop":
                self.host.request_stop(f"spout {self.component.id} task {task} raised {exc!r} in {what} (policy stop)")
            return False
        return True

    def _completions(self) -> int:
        n = 0
        done = self._ended
        while done:
            task, message_id, ok = done.popleft()
            self.pending[task] = max(0, self.pending[task] - 1)
            stats = self.stats[task]
            if ok:
                stats.acked += 1
                self._call(task, "ack", self.bolts[task].ack, message_id)
            else:
                stats.failed += 1
                self._call(task, "fail", self.bolts[task].fail, message_id)
            n += 1
        return n

    def _run(self) -> None:
        self.emitter.owner = self.queue.consumer = threading.get_ident()
        try:
            self._prepare()
        except Exception as exc:
            logger.exception("executor %s: open failed; stopping the worker", self.spec)
            self.host.request_stop(f"executor {self.spec} failed to open: {exc!r}")
            return
        active = False
        try:
            while not self._stop.is_set():
                if self.active.is_set() != active:
                    active = not active
                    for task, spout in self.bolts.items():
                        hook = spout.activate if active else spout.deactivate
                        self._call(task, "activate" if active else "deactivate", hook)
                    self.emitter.flush()
                if len(self.queue):
                    dropped = self.queue.take(1 << 20, 0)  # spouts take no input; never let a sender block on it
                    logger.warning("spout %s: dropped %d items sent to it", self.component.id, len(dropped))
                worked = self._completions()
                if not active:
                    self.emitter.flush()
                    self.active.wait(0.05)
                    continue
                emitted = 0
                for task, spout in self.bolts.items():
                    if self._max_pending and self.pending[task] >= self._max_pending:
                        continue
                    collector = self.collectors[task]
                    before = collector.emits
                    start = time.perf_counter()
                    self._call(task, "next_tuple", spout.next_tuple)
                    self.stats[task].busy_s += time.perf_counter() - start
                    emitted += collector.emits - before
                self.emitter.flush()
                if not emitted and not worked:
                    self._wake.wait(self._wait_s)
                    self._wake.clear()
        except Exception as exc:
            logger.exception("executor %s died; stopping the worker", self.spec)
            self.host.request_stop(f"executor {self.spec} died: {exc!r}")
        finally:
            self._completions()
            for task, spout in self.bolts.items():
                self._call(task, "close", spout.close)
            self.emitter.flush()
