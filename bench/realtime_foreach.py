"""Latency from a Kafka produce to the bolt's ``execute``: real-time mode vs micro-batches.

A producer thread sends ``--rate`` JSON records per second, each stamped with
``time.time()`` at ``send``, to a 2-partition topic of a local broker (started here).  Spark
(local[2], a fresh session per query) reads the topic with its Kafka source and feeds a
2-worker topology whose source bolt records ``time.time() - stamp`` when it executes the
tuple (same host, same clock).  Queries, one after another:

(0) real-time mode, 5 s batches, a Python ``foreach`` that only records when ``process``
    sees the row (no storm: what Spark itself adds);
(a) real-time mode, ``trigger(realTime="5 seconds")`` (Spark's default minimum batch
    duration), ``foreach(storm_foreach(...))``;
(b) real-time mode, ``realTime="1 second"`` with
    ``spark.sql.streaming.realTimeMode.minBatchDuration`` lowered to 1000 ms;
(c) as (b) with ``spark.buffer.size`` 1024 (Spark's Python runner sends a foreach's rows
    only when this many bytes are buffered or the epoch ends; default 65536);
(d) micro-batches as fast as possible (``processingTime="0 seconds"``), ``storm_foreach``;
(e) micro-batches as fast as possible, ``format("storm")`` (Arrow writer).

Each query runs ``--warmup`` seconds of records that are not counted, then ``--seconds``
seconds that are; the figures are p50 / p99 / p99.9 / max of the counted records.

    python -m bench.realtime_foreach [--seconds 20] [--warmup 8] [--rate 200] [--only 0abcde]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from spark_storm.codec.tuples import Tuple
from spark_storm.worker.bolt import Bolt, OutputCollector, TopologyContext


class LatencyBolt(Bolt):
    """Records (n, seconds since the record's produce stamp) per tuple; writes them at cleanup."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.seen: list[tuple[int, float]] = []

    def execute(self, tup: Tuple) -> None:
        now = time.time()
        if not tup.is_tick:
            n, stamp = tup.values[0], tup.values[1]
            self.seen.append((int(n), now - float(stamp)))
        self.collector.ack(tup)

    def cleanup(self) -> None:
        out = Path(str(self.conf["latency.dir"])) / f"task-{self.context.task_id}.json"
        out.write_text(json.dumps(self.seen))


class ProcessRecorder:
    """A plain Python ``foreach`` writer: records (n, seconds since produce) when ``process`` sees a row."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.seen: list[tuple[int, float]] = []

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self.name = f"p{partition_id}-e{epoch_id}"
        self.seen = []
        return True

    def process(self, row: Any) -> None:
        self.seen.append((int(row["n"]), time.time() - float(row["t"])))

    def close(self, error: BaseException | None) -> None:
        Path(self.directory, f"{self.name}-{time.monotonic_ns()}.json").write_text(json.dumps(self.seen))


def _produce(bootstrap: str, topic: str, rate: float, count: int, first: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks=1)
    start = time.monotonic()
    for i in range(count):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        producer.send(topic, json.dumps({"n": first + i, "t": time.time()}).encode())
    producer.flush()
    producer.close()


def _arrived(cluster: Any, latency_dir: Path) -> int:
    if cluster is None:  # query (0): rows recorded by the foreach itself, files written at each epoch's end
        return sum(len(json.loads(f.read_text())) for f in latency_dir.glob("*.json"))
    total = 0
    for slot in cluster.slots:
        total += int(cluster.health(slot)["counters"]["source_tuples_in"])
    return total


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def run_one(bootstrap: str, tmp: Path, name: str, run: Run, args: Any) -> str:
    """Run one query in a fresh session; return its line of the report."""
    from kafka.admin import KafkaAdminClient, NewTopic

    from spark_storm.cluster.local_cluster import LocalCluster
    from spark_storm.spark import storm_foreach
    from spark_storm.spark.session import connector_jars, local_session

    work = Path(tempfile.mkdtemp(dir=tmp, prefix=name))
    latency_dir = work / "latency"
    latency_dir.mkdir()
    topo = {
        "name": f"lat{name}",
        "conf": {"latency.dir": str(latency_dir)},
        "components": [
            {
                "id": "in",
                "source": True,
                "fields": ["n", "t"],
                "parallelism": 2,
                "bolt": "bench.realtime_foreach:LatencyBolt",
            }
        ],
    }
    path = work / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    topic = f"lat-{name}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 2, 1)])
    admin.close()
    warm = int(args.warmup * args.rate)
    counted = int(args.seconds * args.rate)
    spark = local_session(
        f"bench-realtime-{name}", "local[2]", jars=connector_jars(delta=False), quiet=True, conf=run.conf
    )
    spark.sparkContext.setLogLevel("ERROR")
    cluster_cm: Any = contextlib.nullcontext() if run.sink == "record" else LocalCluster(str(path), 2)
    try:
        with cluster_cm as cluster:
            stream = (
                spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic)
                .option("startingOffsets", "earliest")
                .load()
                .selectExpr("from_json(cast(value as string), 'n BIGINT, t DOUBLE') as r")
                .selectExpr("r.n as n", "r.t as t")
            )
            writer = stream.writeStream.option("checkpointLocation", str(work / "checkpoint"))
            if run.sink != "storm":
                writer = writer.outputMode("update")  # what real-time mode needs; a stateless query's append
            if run.sink == "record":
                writer = writer.foreach(ProcessRecorder(str(latency_dir)))
            elif run.sink == "foreach":
                writer = writer.foreach(
                    storm_foreach(topology=str(path), workers=cluster.workers_arg, delivery="accepted")
                )
            else:
                writer = (
                    writer.format("storm")
                    .option("topology", str(path))
                    .option("workers", cluster.workers_arg)
                    .option("delivery", "accepted")
                )
            query = writer.trigger(**run.trigger).start()
            try:
                producer = threading.Thread(target=_produce, args=(bootstrap, topic, args.rate, warm + counted, 0))
                producer.start()
                producer.join(args.warmup + args.seconds + 60)
                deadline = time.monotonic() + 120
                while _arrived(cluster, latency_dir) < warm + counted and time.monotonic() < deadline:
                    if query.exception() is not None:
                        raise RuntimeError(str(query.exception()))
                    time.sleep(0.2)
            finally:
                query.stop()
    finally:
        spark.stop()
    seen = [lat for f in latency_dir.glob("*.json") for n, lat in json.loads(f.read_text()) if n >= warm]
    label = f"  ({name}) {run.label:44s}"
    if len(seen) < counted:
        return f"{label} only {len(seen)} of {counted} counted records arrived"
    ms = [x * 1000 for x in seen]
    figures = "  ".join(f"{p} {_percentile(ms, float(p[1:])):7.0f}" for p in ("p50", "p99", "p99.9"))
    return f"{label} {len(ms):6d} rows  {figures}  max {max(ms):7.0f}"


@dataclass(frozen=True)
class Run:
    """One query of the bench: its sink, trigger, session conf and report label."""

    sink: str
    trigger: dict[str, str]
    label: str
    conf: dict[str, str] = field(default_factory=dict)


RT1 = {"spark.sql.streaming.realTimeMode.minBatchDuration": "1000"}
RUNS: Final = {
    "0": Run("record", {"realTime": "5 seconds"}, "real-time 5 s, plain Python foreach (no storm)"),
    "a": Run("foreach", {"realTime": "5 seconds"}, "real-time 5 s, storm_foreach"),
    "b": Run("foreach", {"realTime": "1 second"}, "real-time 1 s, storm_foreach", RT1),
    "c": Run(
        "foreach",
        {"realTime": "1 second"},
        "real-time 1 s, storm_foreach, buffer 1 KB",
        {**RT1, "spark.buffer.size": "1024"},
    ),
    "d": Run("foreach", {"processingTime": "0 seconds"}, "micro-batch 0 s, storm_foreach"),
    "e": Run("storm", {"processingTime": "0 seconds"}, "micro-batch 0 s, format(storm)"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--rate", type=float, default=200.0, help="records per second")
    parser.add_argument("--only", default="0abcde", help="which queries to run (their letters)")
    args = parser.parse_args(argv)
    unknown = [q for q in args.only if q not in RUNS]
    if unknown:
        parser.error(f"--only: no queries {unknown}; choose from {''.join(RUNS)}")

    from spark_storm.tools.kafka_broker import KafkaBroker

    tmp = Path(tempfile.mkdtemp(prefix="bench-rtm-"))
    broker = KafkaBroker(tmp / "kafka")
    bootstrap = broker.start()
    lines = []
    try:
        for name in args.only:
            lines.append(run_one(bootstrap, tmp, name, RUNS[name], args))
    finally:
        broker.stop()
    print(
        f"\nKafka produce -> bolt execute (0: -> foreach process), {args.rate:.0f} records/s, 2 partitions, "
        f"local[2], 2 workers; {args.seconds:.0f} s counted after {args.warmup:.0f} s warm-up; ms"
    )
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
