"""The worker runtime: receive path, executor queues, bolts, transfer, lifecycle."""

from __future__ import annotations

from spark_storm.worker.bolt import Bolt, OutputCollector, PassThroughBolt, TopologyContext
from spark_storm.worker.tuples import BROADCAST_TASK, Tuple
from spark_storm.worker.worker import Worker

__all__ = [
    "BROADCAST_TASK",
    "Bolt",
    "OutputCollector",
    "PassThroughBolt",
    "TopologyContext",
    "Tuple",
    "Worker",
]
