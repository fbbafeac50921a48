"""The worker runtime: receive path, executor queues, tuple and batch bolts, transfer, lifecycle."""

from __future__ import annotations

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.tuples import BROADCAST_TASK, Tuple
from spark_storm.worker.bolt import (
    BatchBolt,
    BatchOutputCollector,
    Bolt,
    OutputCollector,
    PassThroughBatchBolt,
    PassThroughBolt,
    TopologyContext,
)
from spark_storm.worker.stateful import KeyValueState, StatefulBatchBolt, StatefulBolt
from spark_storm.worker.windows import BatchWindow, TupleWindow, WindowedBatchBolt, WindowedBolt
from spark_storm.worker.worker import Worker

__all__ = [
    "BROADCAST_TASK",
    "BatchBolt",
    "BatchOutputCollector",
    "BatchWindow",
    "Bolt",
    "ColumnarBatch",
    "KeyValueState",
    "OutputCollector",
    "PassThroughBatchBolt",
    "PassThroughBolt",
    "StatefulBatchBolt",
    "StatefulBolt",
    "TopologyContext",
    "Tuple",
    "TupleWindow",
    "WindowedBatchBolt",
    "WindowedBolt",
    "Worker",
]
