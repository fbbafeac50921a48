"""Sustained rows/s of one streaming query into six sinks, measured in the same run.

(a) Spark's ``noop`` sink; (b) a do-nothing ``DataSourceStreamArrowWriter`` that only
counts rows (the ceiling of any Python sink); (c) ``format("storm")`` with
``delivery=accepted`` into 2 workers whose source bolt is a no-op tuple bolt (every row
becomes a Python tuple); (d) ``foreachBatch`` through ``storm_sink`` (same topology);
(e) Spark's own Kafka sink into a local broker (started here, ``acks=all``, one topic
with 2 partitions) -- what a user would pick instead of storm; (f) ``format("storm")``
into 2 workers whose source bolt is a no-op *batch* bolt (Spark's Arrow reaches the bolt
as it was sent).
The Kafka sink needs a string/binary value, so (e) casts the long to a string.
Rate source (``rate-micro-batch``: the same fixed number of rows in every micro-batch, so
each sink gets identical batches whatever its speed), 1 s trigger, local[2].  The figure
is the median ``processedRowsPerSecond`` (rows / batch duration) of the batches after a
warm-up; the sides run interleaved for --rounds rounds and the best round of each counts.

    python -m bench.spark_sink [--seconds 20] [--rows-per-batch 500000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.spark import storm_sink
from spark_storm.spark.session import connector_jars, local_session
from spark_storm.tools.kafka_broker import KafkaBroker


class CountingWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        n = 0
        for batch in iterator:
            n += batch.num_rows
        return WriterCommitMessage()

    def commit(self, messages: list[Any], batchId: int) -> None:
        return None


class CountingSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "counting"

    def streamWriter(self, schema: Any, overwrite: bool) -> CountingWriter:
        return CountingWriter()


def measure(start: Any, seconds: float, warmup: int = 1) -> float:
    query = start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
    rates = [p["processedRowsPerSecond"] for p in query.recentProgress if p["numInputRows"] > 0][warmup:]
    query.stop()
    return statistics.median(rates) if rates else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rows-per-batch", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))

    def topology(name: str, bolt: str) -> Path:
        source = {"id": "in", "source": True, "fields": ["value"], "parallelism": 2, "tasks": 4, "bolt": bolt}
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"name": name, "components": [source]}))
        return path

    topo_path = topology("benchsink", "spark_storm.examples.noop:NoopBolt")
    batch_path = topology("benchsinkbatch", "spark_storm.examples.noop:NoopBatchBolt")
    try:
        jars = connector_jars(delta=False)
    except FileNotFoundError as exc:
        print(f"(e) skipped: {exc}", file=sys.stderr)
        jars = []
    spark = local_session("bench-spark-sink", master="local[2]", jars=jars)
    spark.dataSource.register(CountingSource)

    def stream() -> Any:
        return (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", args.rows_per_batch)
            .load()
            .select("value")
        )

    def start_with(fmt: str, **options: str) -> Any:
        ck = tempfile.mkdtemp(dir=tmp)
        writer = stream().writeStream.format(fmt).options(**options).option("checkpointLocation", ck)
        return writer.trigger(processingTime="1 second").start()

    broker = KafkaBroker(tmp / "kafka") if jars else None
    bootstrap = broker.start() if broker is not None else ""
    if broker is not None:
        from kafka.admin import KafkaAdminClient, NewTopic

        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic("bench", 2, 1)])
        admin.close()
    tuple_cluster = LocalCluster(str(topo_path), 2).start()
    batch_cluster = LocalCluster(str(batch_path), 2).start()
    sink = storm_sink(topology=str(topo_path), workers=tuple_cluster.workers_arg, delivery="accepted")
    sides: dict[str, Any] = {
        "a noop": lambda: start_with("noop"),
        "b counting Arrow writer": lambda: start_with("counting"),
        "c format(storm)": lambda: start_with(
            "storm", topology=str(topo_path), workers=tuple_cluster.workers_arg, delivery="accepted"
        ),
        "d foreachBatch storm_sink": lambda: (
            stream()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", tempfile.mkdtemp(dir=tmp))
            .trigger(processingTime="1 second")
            .start()
        ),
        "f format(storm), batch bolt": lambda: start_with(
            "storm", topology=str(batch_path), workers=batch_cluster.workers_arg, delivery="accepted"
        ),
    }
    if broker is not None:
        sides["e Spark Kafka sink"] = lambda: (
            stream()
            .selectExpr("cast(value as string) as value")
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("kafka.acks", "all")
            .option("topic", "bench")
            .option("checkpointLocation", tempfile.mkdtemp(dir=tmp))
            .trigger(processingTime="1 second")
            .start()
        )
    results: dict[str, float] = {}
    try:
        for r in range(args.rounds):  # interleaved rounds, best of each side: the least disturbed
            for name, start in sides.items():
                rate = measure(start, args.seconds)
                results[name] = max(results.get(name, 0.0), rate)
                print(f"round {r + 1}: {name:28s} {rate:14,.0f} rows/s", file=sys.stderr, flush=True)
    finally:
        tuple_cluster.stop()
        batch_cluster.stop()
        if broker is not None:
            broker.stop()
    spark.stop()
    print(
        f"\nrate-micro-batch, {args.rows_per_batch:,} rows per batch, 1 s trigger, local[2]; "
        f"median after warm-up, best of {args.rounds} rounds"
    )
    for name, rate in sorted(results.items()):
        print(f"  {name:28s} {rate:14,.0f} rows/s")
    b = results["b counting Arrow writer"]
    c, f = results["c format(storm)"], results["f format(storm), batch bolt"]
    ratios = f"  c/b = {c / b:.2f}   c/a = {c / results['a noop']:.2f}   f/b = {f / b:.2f}"
    if "e Spark Kafka sink" in results:
        e = results["e Spark Kafka sink"]
        ratios += f"   c/e = {c / e:.2f}   f/e = {f / e:.2f}"
    print(ratios)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
