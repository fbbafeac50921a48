"""The bolt API: Bolt, TopologyContext, OutputCollector (Storm's IBolt in Python)."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark_storm.topology.model import DEFAULT_STREAM
from spark_storm.worker.tuples import Tuple

__all__ = ["Bolt", "OutputCollector", "PassThroughBolt", "TopologyContext"]


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
    """

    topology_id: str
    component_id: str
    task_id: int
    component_tasks: tuple[int, ...]
    output_fields: Mapping[str, tuple[str, ...]]
    worker: str

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


class PassThroughBolt(Bolt):
    """The default bolt of a source: emits each tuple unchanged on the default stream."""

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return  # ticks are for the bolt, not data to pass on
        self.collector.emit(tup.values, anchors=tup)
        self.collector.ack(tup)
