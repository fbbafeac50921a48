"""``storm_foreach(**options)``: a ``writeStream.foreach`` writer, the sink Spark's real-time mode admits.

Spark 4.1+ real-time mode (``trigger(realTime="5 seconds")``, output mode ``update``) checks
the sink against an allowlist (``RealTimeModeAllowlist``: console, memory, Kafka and
``foreach``), so ``format("storm")`` (a Python data source) and ``foreachBatch`` are
refused there; a Python ``foreach`` writer runs.  Spark calls ``open(partition, epoch)``
once per partition and epoch (an epoch lasts the trigger's batch duration), ``process(row)``
for every row as the source reads it, and ``close(error)`` at the epoch's end.

This writer buffers rows and sends them in groups, routed exactly as ``format("storm")``
routes (one code path, :func:`spark_storm.spark.writer.route_batch`): a group leaves when
``maxRowsPerMessage`` rows are buffered or the oldest buffered row has waited
``storm.spark.foreach.linger.ms`` (a timer thread), and ``close`` sends the rest and waits
until every group of the epoch is acknowledged at the ``delivery`` level (``accepted`` or
``processed``), or raises so that Spark retries the epoch's task.

Groups are keyed by (query id, epoch, partition, first row's index << 24 | rows): a retry
whose groups split at the same rows is dropped by the workers as a replay; one that splits
differently (the linger timer follows the clock) delivers those rows again.  So delivery
through ``storm_foreach`` is at-least-once across task retries — exactly-once into the
executor queues holds for ``format("storm")`` and ``storm_sink``, whose groups are
deterministic.  Partition 0's ``open`` of epoch N tells every worker that epoch N - 1 is
final (epochs run one after another), so the workers' replay ledgers stay small.

Latency: Spark's ``PythonForeachWriter`` feeds the Python worker through
``SerDeUtil.AutoBatchedPickler``, whose batches double in size (1, 2, 4, ... rows, up to
~1 MB) and each waits until full or the epoch ends.  Within a real-time epoch rows therefore
reach ``process`` in ever larger bursts, and a row can wait up to the batch duration before
Python sees it; the shortest allowed duration is
``spark.sql.streaming.realTimeMode.minBatchDuration`` (5000 ms by default).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pyarrow as pa

from spark_storm.config import SPARK_FOREACH_LINGER_MS
from spark_storm.errors import ConfigError, StormError
from spark_storm.messaging.wire import BatchHeader
from spark_storm.spark.options import DELIVERY, StormOptions
from spark_storm.spark.writer import POOL, DeliveryError, await_acks, route_batch
from spark_storm.topology import Slot
from spark_storm.topology.routing import Router

__all__ = ["StormForeachWriter", "storm_foreach"]

logger = logging.getLogger(__name__)

#: Rows per group fit the low 24 bits of a group's sequence (the first row's index is above them).
_ROWS_BITS = 24


class StormForeachWriter:
    """A picklable ``foreach`` writer: ``open`` / ``process`` / ``close`` per partition and epoch.

    Holds settings only until ``open``; build it with :func:`storm_foreach`.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.options = {k: str(v) for k, v in options.items()}
        lower = {k.lower() for k in self.options}
        if "batchid" in lower:
            msg = "storm_foreach: option 'batchId' does not apply; every epoch's id comes from Spark's open()"
            raise ConfigError(msg)
        if "zookeeper" in lower:
            msg = (
                "storm_foreach: option 'zookeeper' is not supported yet (its plan would be fixed when the writer "
                "is made, and a retry on a new assignment could be taken for a replay); use 'workers', or "
                "format('storm') / storm_sink, which follow the assignment per micro-batch"
            )
            raise ConfigError(msg)
        parsed = StormOptions.parse(self.options)  # a bad option fails here, on the driver
        if parsed.delivery == DELIVERY["none"]:
            msg = (
                "storm_foreach: option 'delivery'='none' is not offered; close() waits for every group's ack, "
                "use accepted (default) or processed"
            )
            raise ConfigError(msg)
        self.parsed = parsed
        self.linger_s = parsed.messaging_conf().get_int(SPARK_FOREACH_LINGER_MS, minimum=0) / 1000
        self.flush_rows = min(parsed.max_rows, (1 << _ROWS_BITS) - 1)
        self._epoch: _Epoch | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_epoch"] = None  # never ship a running epoch (threads, locks)
        return state

    def open(self, partition_id: int, epoch_id: int) -> bool:
        """Start an epoch of one partition (on a Spark executor); always True."""
        from pyspark import TaskContext

        options = self.parsed
        ctx = TaskContext.get()
        query_id = options.query_id or (ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None)
        if not query_id:
            msg = "storm_foreach: no streaming query id on this task; pass queryId=... to storm_foreach"
            raise DeliveryError(msg)
        if partition_id == 0 and epoch_id > 0:
            _commit_previous(options, query_id, epoch_id - 1)
        self._epoch = _Epoch(options, query_id, epoch_id, partition_id, self.linger_s, self.flush_rows)
        return True

    def process(self, row: Any) -> None:
        """Buffer one row (a ``pyspark.sql.Row``); a full buffer is sent at once."""
        epoch = self._epoch
        if epoch is None:
            msg = "storm_foreach: process() before open(); Spark calls open(partition_id, epoch_id) first"
            raise StormError(msg)
        epoch.add(row)

    def close(self, error: BaseException | None) -> None:
        """Send what is buffered and wait for every group's ack (nothing is sent after an error)."""
        epoch, self._epoch = self._epoch, None
        if epoch is not None:
            epoch.finish(error)


class _Epoch:
    """One partition's rows of one epoch: buffer, linger timer, groups sent and awaited."""

    def __init__(
        self, options: StormOptions, query_id: str, epoch_id: int, partition: int, linger_s: float, flush_rows: int
    ) -> None:
        self.options = options
        self.query_id = query_id
        self.epoch_id = epoch_id
        self.partition = partition
        self.linger_s = linger_s
        self.flush_rows = 1 if linger_s == 0 else flush_rows
        self.router = Router(options.tasks, options.grouping, options.key_columns, options.task_column, partition)
        self.names: list[str] = []
        self.index: list[int] = []
        self.rows: list[tuple[Any, ...]] = []
        self.first_at = 0.0
        self.sent_rows = 0
        self.groups = 0
        self.pending: dict[Slot, list[tuple[str, int, int, int]]] = {}
        self.error: BaseException | None = None
        self.closing = False
        self.started = time.monotonic()
        self.cond = threading.Condition()
        self.timer: threading.Thread | None = None
        if linger_s > 0:
            self.timer = threading.Thread(target=self._linger, name=f"storm-foreach-p{partition}", daemon=True)
            self.timer.start()

    def _columns(self, row: Any) -> None:
        fields = list(getattr(row, "__fields__", None) or [])
        wanted = list(self.options.columns)
        for extra in (*self.options.key_columns, self.options.task_column):
            if extra and extra not in wanted:
                wanted.append(extra)
        missing = [c for c in wanted if c not in fields]
        if missing:
            msg = (
                f"storm_foreach: rows lack columns {missing} (a row has {fields}); component "
                f"{self.options.component!r} needs {list(self.options.columns)}: select or alias them"
            )
            raise ConfigError(msg)
        self.names = wanted
        self.index = [fields.index(c) for c in wanted]

    def add(self, row: Any) -> None:
        with self.cond:
            if self.error is not None:
                raise self.error
            if not self.index:
                self._columns(row)
            self.rows.append(tuple(row[i] for i in self.index))
            if len(self.rows) == 1:
                self.first_at = time.monotonic()
                self.cond.notify()
            if len(self.rows) >= self.flush_rows:
                self._flush()

    def _linger(self) -> None:
        with self.cond:
            while not self.closing:
                if not self.rows:
                    self.cond.wait()
                    continue
                due = self.first_at + self.linger_s - time.monotonic()
                if due > 0:
                    self.cond.wait(due)
                    continue
                try:
                    self._flush()
                except BaseException as exc:  # surfaces in the next process() or in close()
                    self.error = exc
                    return

    def _flush(self) -> None:
        # Caller holds self.cond: groups leave in row order, one flush at a time.
        rows, self.rows = self.rows, []
        if not rows:
            return
        columns = list(zip(*rows, strict=True))
        batch = pa.RecordBatch.from_arrays([pa.array(c) for c in columns], names=self.names)
        sequence = (self.sent_rows << _ROWS_BITS) | len(rows)
        self.sent_rows += len(rows)
        for slot, messages in sorted(route_batch(self.options, self.router, batch).items()):
            header = BatchHeader(
                self.query_id, self.epoch_id, self.partition, sequence, len(messages), self.options.delivery
            )
            POOL.connection(self.options, slot).send_group(header, messages)
            self.pending.setdefault(slot, []).append(header.key)
            self.groups += 1

    def finish(self, error: BaseException | None) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify()
        if self.timer is not None:
            self.timer.join()
        if error is not None:
            logger.warning(
                "storm_foreach: query %s epoch %d partition %d ends with %r after %d rows; Spark retries it",
                self.query_id,
                self.epoch_id,
                self.partition,
                error,
                self.sent_rows,
            )
            return
        if self.error is not None:
            raise self.error
        self._flush()
        await_acks(self.options, self.pending, self.query_id, self.epoch_id, self.partition)
        logger.info(
            "storm_foreach: query %s epoch %d partition %d sent %d rows in %d groups in %.3fs",
            self.query_id,
            self.epoch_id,
            self.partition,
            self.sent_rows,
            self.groups,
            time.monotonic() - self.started,
        )


def _commit_previous(options: StormOptions, query_id: str, epoch_id: int) -> None:
    """Tell every worker that ``epoch_id`` is final (best effort, like the driver's commit)."""
    for slot in options.plan.slots:
        try:
            POOL.connection(options, slot).send_commit(query_id, epoch_id)
        except StormError as exc:
            logger.warning(
                "storm_foreach: commit of %s/%d to %s failed (%s); the worker keeps its state longer",
                query_id,
                epoch_id,
                slot,
                exc,
            )


def storm_foreach(**options: Any) -> StormForeachWriter:
    """Return a ``writeStream.foreach`` writer that sends each row to a topology.

    It takes the options of ``format("storm")`` (``delivery`` ``accepted`` or ``processed``;
    no ``batchId``) and ``storm.spark.foreach.linger.ms``.  Works under any trigger; it is
    the storm sink that Spark's real-time mode (``trigger(realTime=...)``) accepts::

        (df.writeStream.outputMode("update")
           .foreach(storm_foreach(topology="conf/topologies/wordcount.yaml", workers="h:6700"))
           .trigger(realTime="5 seconds").start())

    Raises
    ------
    ConfigError
        A bad option, named with its fix (on the driver, before the query starts).
    """
    return StormForeachWriter({k: str(v) for k, v in options.items()})
