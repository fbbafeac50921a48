"""Latency percentiles (p50 / p99 / p99.9), measured with the machine's monotonic clock.

(a) one inter-worker hop, ``emit`` -> ``execute``: a source bolt on worker A stamps every
    tuple as it emits it (``time.monotonic_ns``, one clock for every process of the
    machine) to a bolt on worker B, which records ``now - stamp`` as it executes it.  The
    hop's maximum throughput is measured first (the client sends as fast as it can), then
    the client paces tuples at 10 % and 50 % of it; the first second is a warm-up.
    ``--set key=value`` (repeatable) changes a worker setting, to measure a knob's effect.
(b) with ``--spark``: a Spark micro-batch row, writer ``write()`` -> bolt ``execute``:
    a streaming query (rate source at --spark-rows-per-second, trigger --trigger) writes
    ``format("storm")`` through a wrapper that stamps each Arrow batch as ``write()``
    receives it; a batch bolt records ``now - stamp`` per row.  Printed next to the
    trigger interval, with the latency from the rate source's event time (which includes
    the wait for the trigger) for comparison.

    python -m bench.latency [--seconds 6] [--set storm.messaging.tcp.flush.interval.ms=0] [--spark]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import yaml

from bench.worker import executed
from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.tuples import Tuple
from spark_storm.messaging import TaskMessage
from spark_storm.transport import make_context
from spark_storm.worker.bolt import BatchBolt, BatchOutputCollector, Bolt, OutputCollector, TopologyContext


class StampBolt(Bolt):
    """Emits ``[monotonic_ns at emit, value]`` for every tuple (the start of the hop)."""

    def execute(self, tup: Tuple) -> None:
        self.collector.emit([time.monotonic_ns(), tup.values[1]])
        self.collector.ack(tup)


class _Recorder:
    """Latency samples (ns) written to ``<latency.dir>/<task>.bin`` at cleanup."""

    def _start(self, conf: Mapping[str, Any], context: TopologyContext) -> None:
        self.samples = array("q")
        self.out = Path(str(conf["latency.dir"])) / f"{context.task_id}.bin"

    def _write(self) -> None:
        self.out.write_bytes(self.samples.tobytes())


class LatencyBolt(_Recorder, Bolt):
    """Records ``now - stamp`` per tuple (the end of the hop)."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self._start(conf, context)

    def execute(self, tup: Tuple) -> None:
        self.samples.append(time.monotonic_ns() - tup.values[0])
        self.collector.ack(tup)

    def cleanup(self) -> None:
        self._write()


class LatencyBatchBolt(_Recorder, BatchBolt):
    """Records ``now - stamp`` for every row of a batch, and the event-time latency."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: BatchOutputCollector) -> None:
        super().prepare(conf, context, collector)
        self._start(conf, context)
        self.event = array("q")

    def execute_batch(self, batch: ColumnarBatch) -> None:
        if batch.is_tick:
            return
        now, wall = time.monotonic_ns(), time.time_ns()
        self.samples.extend((now - batch.column("stamp").to_numpy()).tolist())
        event_ns = batch.column("timestamp").cast("int64").to_numpy() * 1000  # micros -> ns
        self.event.extend((wall - event_ns).tolist())
        self.collector.ack(batch)

    def cleanup(self) -> None:
        self._write()
        self.out.with_suffix(".event").write_bytes(self.event.tobytes())


def _percentiles(samples_ns: Any) -> str:
    if len(samples_ns) == 0:
        return "no samples"
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    p50, p99, p999 = np.percentile(ms, [50, 99, 99.9])
    return f"p50 {p50:8.3f} ms   p99 {p99:8.3f} ms   p99.9 {p999:8.3f} ms   ({len(ms):,} samples)"


def hop(
    overrides: dict[str, Any],
    rate: float | None,
    seconds: float,
    n_max: int,
    *,
    sink: str = "bench.latency:LatencyBolt",
    conf: Mapping[str, Any] | None = None,
) -> tuple[float, Any]:
    """Run the two-worker hop; with ``rate`` None send ``n_max`` as fast as possible (returns rows/s).

    ``sink`` is the recording bolt (bench.state passes a stateful one) and ``conf`` adds to the topology's conf.
    """
    tmp = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    lat_dir = tmp / "latency"
    lat_dir.mkdir()
    topo = {
        "name": "latency",
        "conf": {"latency.dir": str(lat_dir), **(conf or {})},
        "components": [
            # clients send [0, v]; the source bolt re-stamps field 0 as it emits
            {"id": "in", "source": True, "bolt": "bench.latency:StampBolt", "fields": ["stamp", "v"]},
            {"id": "sink", "bolt": sink, "inputs": [{"from": "in", "grouping": "shuffle"}]},
        ],
    }
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    cluster = LocalCluster(str(path), 2, overrides=overrides).start()
    ctx = make_context({"storm.messaging.transport": "tcp"})
    payload = msgpack.packb([0, "x" * 90])
    try:
        source_slot = cluster.plan.task_slot[1]
        assert cluster.plan.task_slot[2] != source_slot  # the hop crosses workers
        conn = ctx.connect("latency", source_slot.host, source_slot.port)
        conn.wait_ready(30)
        if rate is None:
            batch = [TaskMessage(1, payload)] * 1000
            t0 = time.perf_counter()
            for _ in range(n_max // 1000):
                conn.send(batch)
            while executed(cluster, "sink") < n_max:
                time.sleep(0.01)
            return n_max / (time.perf_counter() - t0), None
        tick = 0.001 if rate >= 1000 else 1 / rate
        per_tick = max(1, round(rate * tick))
        chunk = [TaskMessage(1, payload)] * per_tick
        start = time.perf_counter()
        sent = 0
        next_at = start
        while (now := time.perf_counter()) - start < seconds:
            if now < next_at:
                time.sleep(min(next_at - now, 0.0005))
                continue
            conn.send(chunk)
            sent += per_tick
            next_at += tick
        conn.flush(30)
        while executed(cluster, "sink") < sent:
            time.sleep(0.01)
    finally:
        ctx.term()
        cluster.stop()
    samples = np.frombuffer((lat_dir / "2.bin").read_bytes(), dtype=np.int64)
    warm = int(len(samples) * min(1.0, 1.0 / seconds))  # drop the first second
    return sent / seconds, samples[warm:]


def spark_rows(seconds: float, rows_per_second: int, trigger: str, overrides: dict[str, Any]) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.datasource import WriterCommitMessage

    from spark_storm.spark.datasource import StormDataSource, StormStreamWriter
    from spark_storm.spark.session import local_session

    class StampingWriter(StormStreamWriter):
        """The storm writer, stamping each Arrow batch as ``write()`` receives it."""

        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            import pyarrow as pa

            def stamped() -> Iterator[Any]:
                for rb in iterator:
                    index = rb.schema.get_field_index("stamp")
                    stamp = pa.array(np.full(rb.num_rows, time.monotonic_ns(), dtype=np.int64))
                    yield rb.set_column(index, "stamp", stamp)

            return super().write(stamped())

    class StampingSource(StormDataSource):
        @classmethod
        def name(cls) -> str:
            return "stormstamp"

        def streamWriter(self, schema: Any, overwrite: bool) -> StampingWriter:
            return StampingWriter(self._options(schema))

    tmp = Path(tempfile.mkdtemp(prefix="bench-latency-spark-"))
    lat_dir = tmp / "latency"
    lat_dir.mkdir()
    topo = {
        "name": "latencyspark",
        "conf": {"latency.dir": str(lat_dir)},
        "components": [
            {"id": "in", "source": True, "bolt": "bench.latency:LatencyBatchBolt", "fields": ["timestamp", "stamp"]},
        ],
    }
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    spark = local_session("bench-latency", master="local[2]")
    spark.dataSource.register(StampingSource)
    with LocalCluster(str(path), 1, overrides=overrides) as cluster:
        df = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", rows_per_second)
            .load()
            .select("timestamp", F.lit(0).cast("long").alias("stamp"))
        )
        writer = (
            df.writeStream.format("stormstamp").option("topology", str(path)).option("workers", cluster.workers_arg)
        )
        writer = writer.option("checkpointLocation", str(tmp / "ck"))
        query = writer.trigger(processingTime=trigger).start()
        time.sleep(seconds)
        query.stop()
    spark.stop()
    write_to_execute = np.frombuffer((lat_dir / "1.bin").read_bytes(), dtype=np.int64)
    event_to_execute = np.frombuffer((lat_dir / "1.event").read_bytes(), dtype=np.int64)
    skip = len(write_to_execute) // 5  # the first batches wait for Spark's Python workers to start
    print(f"\n(b) Spark micro-batch row, rate source {rows_per_second:,} rows/s, trigger {trigger}, local[2]:")
    print(f"  write() -> execute       {_percentiles(write_to_execute[skip:])}")
    print(f"  event time -> execute    {_percentiles(event_to_execute[skip:])}   (includes the trigger wait)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--max-tuples", type=int, default=300_000)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a worker setting")
    parser.add_argument("--spark", action="store_true", help="also (b), a Spark micro-batch row")
    parser.add_argument("--spark-rows-per-second", type=int, default=10_000)
    parser.add_argument("--trigger", default="1 second")
    args = parser.parse_args(argv)
    overrides = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.set)}
    shown = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "defaults"
    top, _ = hop(overrides, None, 0, args.max_tuples)
    print(f"(a) one inter-worker hop (emit on worker A -> execute on worker B), tcp on loopback, {shown}")
    print(f"  maximum throughput {top:12,.0f} tuples/s", flush=True)
    for fraction in (0.1, 0.5):
        rate, samples = hop(overrides, top * fraction, args.seconds, 0)
        print(f"  at {fraction:4.0%} ({rate:10,.0f}/s)  {_percentiles(samples)}", flush=True)
    if args.spark:
        spark_rows(args.seconds + 10, args.spark_rows_per_second, args.trigger, overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
