"""Bolts that do nothing but ack: the ceiling of a topology's throughput (tuple and columnar)."""

from __future__ import annotations

from spark_storm.bolts import BatchBolt, Bolt, ColumnarBatch, Tuple

__all__ = ["NoopBatchBolt", "NoopBolt"]


class NoopBolt(Bolt):
    """Acks every tuple, emits nothing."""

    def execute(self, tup: Tuple) -> None:
        self.collector.ack(tup)


class NoopBatchBolt(BatchBolt):
    """Acks every batch, emits nothing: the ceiling of a columnar topology."""

    def execute_batch(self, batch: ColumnarBatch) -> None:
        self.collector.ack(batch)
