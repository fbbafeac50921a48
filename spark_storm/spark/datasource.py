"""The PySpark Python Data Source ``storm``: ``writeStream.format("storm")`` and ``write.format("storm")``."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from spark_storm.spark.options import StormOptions, new_write_id
from spark_storm.spark.writer import StormCommitMessage, commit_batch, rows_of, write_partition

__all__ = ["StormDataSource"]


class _Commit(StormCommitMessage, WriterCommitMessage):
    """A StormCommitMessage that Spark accepts as a WriterCommitMessage."""


def _wrap(message: StormCommitMessage) -> _Commit:
    return _Commit(**vars(message))


class StormStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer: one Spark task per partition per micro-batch (Arrow batches in).

    Spark builds it on the driver for every micro-batch (``streamWriter``), so in cluster
    mode each micro-batch's tasks get the assignment current when the batch was planned.
    """

    def __init__(self, options: StormOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _wrap(write_partition(self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_batch(self.options, [m for m in messages if m is not None], batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        import logging

        done = [m for m in messages if m is not None]
        logging.getLogger(__name__).warning(
            "storm: micro-batch %d aborted after %d of its tasks wrote %d rows; Spark will replay it and "
            "the workers drop the groups they already accepted",
            batchId,
            len(done),
            rows_of(done),
        )


class StormBatchWriter(DataSourceArrowWriter):
    """``df.write.format("storm").save()``: the same code, under one id made on the driver."""

    def __init__(self, options: StormOptions) -> None:
        self.options = options.with_ids(options.query_id or new_write_id(), options.batch_id or 0)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _wrap(write_partition(self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        assert self.options.batch_id is not None
        commit_batch(self.options, [m for m in messages if m is not None], self.options.batch_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        import logging

        logging.getLogger(__name__).warning("storm: batch write %s aborted", self.options.query_id)


class StormDataSource(DataSource):
    """``format("storm")``: routes rows to a topology's source tasks over the configured transport.

    Options (case-insensitive): ``topology`` (YAML path, required), ``workers``
    (``host:port,...``; default the topology's) or ``zookeeper`` (``HOST:PORT[/chroot]`` of
    a cluster the topology was submitted to; ``topology`` is then its name, and the driver
    reads the current assignment for every micro-batch), ``component`` (the source to feed;
    default the only source), ``taskColumn`` (explicit task ids), ``fields`` (columns
    sent; default all but the task column), ``serializer`` (arrow | msgpack),
    ``transport`` (tcp | zmq | dotted path), ``delivery`` (none | accepted | processed),
    ``ackTimeoutMs``, ``maxRowsPerMessage``, ``conf`` (a storm.yaml), and ``storm.*`` keys.
    """

    @classmethod
    def name(cls) -> str:
        return "storm"

    def _options(self, schema: StructType) -> StormOptions:
        return StormOptions.parse(dict(self.options), [f.name for f in schema.fields])

    def streamWriter(self, schema: StructType, overwrite: bool) -> StormStreamWriter:
        return StormStreamWriter(self._options(schema))

    def writer(self, schema: StructType, overwrite: bool) -> StormBatchWriter:
        return StormBatchWriter(self._options(schema))

    def schema(self) -> str:
        return "value string"  # a sink only; Spark asks data sources for a default schema
