"""A bolt that does nothing but ack: the ceiling of a topology's throughput."""

from __future__ import annotations

from spark_storm.worker.bolt import Bolt
from spark_storm.worker.tuples import Tuple

__all__ = ["NoopBolt"]


class NoopBolt(Bolt):
    """Acks every tuple, emits nothing."""

    def execute(self, tup: Tuple) -> None:
        self.collector.ack(tup)
