r"""Read a Kafka topic with Spark's Kafka source and stream it into a topology with format("storm").

Spark needs the Kafka connector jars; ``scripts/fetch-jars`` puts them in ``jars/spark``:

    scripts/fetch-jars
    spark-submit --master local[2] \\
        --jars "$(ls jars/spark/*.jar | grep -v delta | paste -sd,)" \\
        jobs/kafka_to_storm.py --bootstrap-servers 127.0.0.1:9092 --topic sentences \\
        --topology conf/topologies/wordcount.yaml --workers 127.0.0.1:6700,127.0.0.1:6701

(a plain ``python jobs/kafka_to_storm.py ...`` adds ``--jars-dir``'s jars itself.)

Values: ``--format text`` gives the value as the source component's first field;
``--format json`` parses each value as a JSON object with ``--schema`` (a Spark DDL string;
default: every field of the source component as STRING) and keeps the source's fields.
A record whose JSON does not parse becomes a row of nulls; ``--drop-malformed`` drops those
instead.  Offsets live in the checkpoint, so a restarted job goes on where it stopped and,
with ``--delivery accepted|processed``, nothing reaches the workers twice.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    """Run the job; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap-servers", required=True, help="Kafka brokers host:port,...")
    parser.add_argument("--topic", required=True, help="topic to read (subscribe)")
    parser.add_argument("--topology", required=True, help="topology YAML")
    parser.add_argument("--workers", required=True, help="worker slots host:port,...")
    parser.add_argument("--component", help="source component to feed (default: the topology's only source)")
    parser.add_argument("--format", default="text", choices=["text", "json"], help="how to parse the record value")
    parser.add_argument("--schema", help="DDL schema of the JSON values (default: the source's fields as STRING)")
    parser.add_argument("--drop-malformed", action="store_true", help="drop records whose JSON does not parse")
    parser.add_argument("--starting-offsets", default="earliest", help="earliest, latest or Spark's JSON form")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=0, help="cap per micro-batch (0 = none)")
    parser.add_argument("--delivery", default="processed", choices=["none", "accepted", "processed"])
    parser.add_argument("--available-now", action="store_true", help="read what is there now, then stop")
    parser.add_argument("--seconds", type=float, default=0.0, help="without --available-now: stop after (0 = never)")
    parser.add_argument("--checkpoint", help="checkpoint dir (default: a temp dir; give one to resume)")
    parser.add_argument("--storm-conf", help="a storm.yaml for the connections (e.g. the auth secret file)")
    parser.add_argument("--jars-dir", default="jars/spark", help="connector jars for a plain python run")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_storm.spark import register
    from spark_storm.topology import load_topology

    topology = load_topology(args.topology)
    sources = sorted(c.id for c in topology.components.values() if c.source)
    component = args.component or (sources[0] if len(sources) == 1 else None)
    if component not in sources:
        print(f"--component must be one of the topology's sources {sources}, got {component!r}", file=sys.stderr)
        return 2
    fields = list(topology.components[component].fields_of())

    builder = SparkSession.builder.appName("kafka_to_storm")
    if "SPARK_SUBMIT" not in os.environ and "PYSPARK_GATEWAY_PORT" not in os.environ:
        jars = sorted(glob.glob(os.path.join(args.jars_dir, "*.jar")))
        if not any("spark-sql-kafka" in j for j in jars):
            print(f"no spark-sql-kafka jar in {args.jars_dir}: run scripts/fetch-jars first", file=sys.stderr)
            return 2
        builder = builder.master("local[*]").config("spark.jars", ",".join(jars))
    spark = builder.getOrCreate()
    register(spark)

    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap_servers)
        .option("subscribe", args.topic)
        .option("startingOffsets", args.starting_offsets)
    )
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", args.max_offsets_per_trigger)
    value = F.col("value").cast("string")
    if args.format == "text":
        df = reader.load().select(value.alias(fields[0]))
    else:
        schema = args.schema or ", ".join(f"`{f}` STRING" for f in fields)
        parsed = reader.load().select(F.from_json(value, schema).alias("v"))
        if args.drop_malformed:
            parsed = parsed.where(F.col("v").isNotNull())
        df = parsed.select(*[F.col("v")[f].alias(f) for f in fields])

    writer = (
        df.writeStream.format("storm")
        .option("topology", args.topology)
        .option("workers", args.workers)
        .option("component", component)
        .option("delivery", args.delivery)
        .options(**({"conf": args.storm_conf} if args.storm_conf else {}))
        .option("checkpointLocation", args.checkpoint or tempfile.mkdtemp(prefix="kafka-to-storm-ck-"))
    )
    query = writer.trigger(availableNow=True).start() if args.available_now else writer.start()
    started = time.monotonic()
    while query.isActive:
        if not args.available_now and args.seconds and time.monotonic() - started > args.seconds:
            while query.status.get("isTriggerActive"):
                time.sleep(0.01)
            query.stop()
            break
        query.awaitTermination(1)
        progress = query.lastProgress
        if progress and progress["numInputRows"]:
            print(f"batch {progress['batchId']}: {progress['numInputRows']} records", flush=True)
    if query.exception() is not None:
        print(f"query failed: {query.exception()}", file=sys.stderr)
        return 1
    sent = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"sent {sent} records from {args.topic} to {args.workers}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
