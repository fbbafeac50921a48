"""The bolt API: Bolt and BatchBolt, their collectors, TopologyContext (Storm's IBolt in Python).

Two kinds of bolt run in the same topology:

* :class:`Bolt` — Storm's API, one :class:`~spark_storm.codec.tuples.Tuple` per
  ``execute`` call, ``collector.emit(values)``;
* :class:`BatchBolt` — columnar: ``execute_batch`` gets a
  :class:`~spark_storm.codec.columnar.ColumnarBatch` (a ``pyarrow.RecordBatch`` of the
  input stream's fields plus its origin) and emits record batches with
  ``collector.emit_batch``; groupings route batches with numpy, and batches cross
  workers as Arrow IPC.  Nothing is turned into Python rows unless a tuple bolt is
  downstream.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_storm.codec.tuples import Tuple
from spark_storm.topology.model import DEFAULT_STREAM

if TYPE_CHECKING:
    from spark_storm.codec.columnar import ColumnarBatch
    from spark_storm.topology.assignment import Plan

__all__ = [
    "BatchBolt",
    "BatchOutputCollector",
    "Bolt",
    "OutputCollector",
    "PassThroughBatchBolt",
    "PassThroughBolt",
    "TopologyContext",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopologyContext:
    """What a bolt task knows about its place in the topology.

    Attributes
    ----------
    topology_id : str
    component_id : str
    task_id : int
    component_tasks : tuple[int, ...]
        Every task of this component (in all workers).
    output_fields : Mapping[str, tuple[str, ...]]
        This component's declared output fields per stream.
    worker : str
        ``host:port`` of the worker running the task.
    plan : Plan, optional
        The whole topology and its tasks (what a multilang child's handshake describes).
    """

    topology_id: str
    component_id: str
    task_id: int
    component_tasks: tuple[int, ...]
    output_fields: Mapping[str, tuple[str, ...]]
    worker: str
    plan: Plan | None = field(default=None, compare=False, repr=False)

    @property
    def task_index(self) -> int:
        """Position of this task among its component's tasks (0-based)."""
        return self.component_tasks.index(self.task_id)


class OutputCollector(abc.ABC):
    """Emits, acks and fails on behalf of one bolt task."""

    @abc.abstractmethod
    def emit(
        self,
        values: Sequence[Any],
        stream: str = DEFAULT_STREAM,
        anchors: Sequence[Tuple] | Tuple | None = None,
    ) -> list[int]:
        """Emit a tuple on ``stream``; return the task ids it was sent to."""

    @abc.abstractmethod
    def emit_direct(
        self,
        task: int,
        values: Sequence[Any],
        stream: str = DEFAULT_STREAM,
        anchors: Sequence[Tuple] | Tuple | None = None,
    ) -> None:
        """Emit to one chosen task of a consumer that subscribed with direct grouping."""

    @abc.abstractmethod
    def ack(self, tup: Tuple) -> None:
        """Mark ``tup`` processed."""

    @abc.abstractmethod
    def fail(self, tup: Tuple) -> None:
        """Mark ``tup`` failed."""

    def report_error(self, error: str) -> None:
        """Report an error that is not an exception of ``execute`` (Storm's ``reportError``): /health, the UI."""
        logger.error("bolt error: %s", error)


class Bolt(abc.ABC):
    """A processing step; one instance per task, called from one executor thread.

    Lifecycle: ``prepare`` once, ``execute`` per tuple (tick tuples included when
    configured: check ``tup.is_tick``), ``cleanup`` at shutdown after the queue drained.
    """

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        """Set up the task; keep the collector to emit from ``execute``."""
        self.conf = conf
        self.context = context
        self.collector = collector

    @abc.abstractmethod
    def execute(self, tup: Tuple) -> None:
        """Process one tuple."""

    def cleanup(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called once at shutdown."""

    def in_flight(self) -> int:
        """Tuples ``execute`` took and this bolt has not finished with yet (called from any thread).

        None for a bolt that finishes each tuple inside ``execute``.  A bolt that hands tuples
        to another process or thread (a multilang child) counts them here: the worker's
        ordered shutdown waits until none is left before it stops the bolts downstream, so
        what they emit last still reaches them.
        """
        return 0


class PassThroughBolt(Bolt):
    """The default bolt of a source: emits each tuple unchanged on the default stream."""

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return  # ticks are for the bolt, not data to pass on
        self.collector.emit(tup.values, anchors=tup)
        self.collector.ack(tup)


class BatchOutputCollector(abc.ABC):
    """Emits, acks and fails columnar batches on behalf of one batch-bolt task."""

    @abc.abstractmethod
    def emit_batch(
        self,
        data: Any,
        stream: str = DEFAULT_STREAM,
        anchors: Sequence[ColumnarBatch] | ColumnarBatch | None = None,
        tasks: Any = None,
    ) -> None:
        """Emit rows on ``stream``.

        Parameters
        ----------
        data : pyarrow.RecordBatch, pyarrow.Table or mapping of field -> array-like
            The rows; columns are matched to the stream's declared fields by name.
        stream : str
        anchors : ColumnarBatch or sequence of them, optional
            Input batches the rows derive from (tuple trees, for ``delivery=processed``).
        tasks : int or array of int, optional
            Direct grouping only: the consumer task of every row (or one for all rows).
        """

    @abc.abstractmethod
    def ack(self, batch: ColumnarBatch) -> None:
        """Mark every row of ``batch`` processed."""

    @abc.abstractmethod
    def fail(self, batch: ColumnarBatch) -> None:
        """Mark ``batch`` failed (its delivery group is replayed)."""


class BatchBolt(abc.ABC):
    """A columnar processing step; one instance per task, called from one executor thread.

    Lifecycle: ``prepare`` once, ``execute_batch`` per batch (tick tuples arrive as a
    one-row batch with ``batch.is_tick``; tuples from tuple bolts arrive assembled into
    one batch per executor batch), ``cleanup`` at shutdown after the queue drained.
    """

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: BatchOutputCollector) -> None:
        """Set up the task; keep the collector to emit from ``execute_batch``."""
        self.conf = conf
        self.context = context
        self.collector = collector

    @abc.abstractmethod
    def execute_batch(self, batch: ColumnarBatch) -> None:
        """Process one batch of rows."""

    def cleanup(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called once at shutdown."""


class PassThroughBatchBolt(BatchBolt):
    """Emits each batch unchanged on the default stream (a columnar source's pass-through)."""

    def execute_batch(self, batch: ColumnarBatch) -> None:
        if batch.is_tick:
            return
        self.collector.emit_batch(batch.data, anchors=batch)
        self.collector.ack(batch)
