r"""Read a Kafka topic with Spark's Kafka source and stream it into a topology with format("storm").

Spark needs the Kafka connector jars; ``scripts/fetch-jars`` puts them in ``jars/spark``:

    scripts/fetch-jars
    spark-submit --master local[2] \\
        --jars "$(ls jars/spark/*.jar | grep -v delta | paste -sd,)" \\
        jobs/kafka_to_storm.py --bootstrap-servers 127.0.0.1:9092 --topic sentences \\
        --topology conf/topologies/wordcount.yaml --workers 127.0.0.1:6700,127.0.0.1:6701

(a plain ``python jobs/kafka_to_storm.py ...`` runs local[*] with ``--jars-dir``'s jars.)

Values: ``--format text`` gives the value as the source component's first field;
``--format json`` parses each value as a JSON object with ``--schema`` (a Spark DDL string;
default: every field of the source component as STRING) and keeps the source's fields.
A record whose JSON does not parse becomes a row of nulls; ``--drop-malformed`` drops those
instead.  Offsets live in the checkpoint, so a restarted job goes on where it stopped and,
with ``--delivery accepted|processed``, nothing reaches the workers twice.
"""

from __future__ import annotations

import argparse
from typing import Any

from spark_storm.spark.jobs import add_job_arguments, describe_target, job_main


def show_progress(progress: dict[str, Any]) -> None:
    """Print one micro-batch's progress line."""
    print(f"batch {progress['batchId']}: {progress['numInputRows']} rows", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap-servers", required=True, help="Kafka brokers host:port,...")
    parser.add_argument("--topic", required=True, help="topic to read (subscribe)")
    parser.add_argument("--format", default="text", choices=["text", "json"], help="how to parse the record value")
    parser.add_argument("--schema", help="DDL schema of the JSON values (default: the source's fields as STRING)")
    parser.add_argument("--drop-malformed", action="store_true", help="drop records whose JSON does not parse")
    parser.add_argument("--starting-offsets", default="earliest", help="earliest, latest or Spark's JSON form")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=0, help="cap per micro-batch (0 = none)")
    add_job_arguments(parser, storm=True)
    return parser.parse_args(argv)


def run(spark: Any, args: argparse.Namespace) -> int:
    """Start the query on ``spark`` and run it to the end; return the records sent."""
    from pyspark.sql import functions as F

    from spark_storm.spark import register
    from spark_storm.spark.jobs import run_query, source_component, storm_writer

    register(spark)
    component, fields = source_component(args.topology, args.component)
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
    writer = storm_writer(df, args, component, "kafka-to-storm-ck-")
    return run_query(writer, args.available_now, args.seconds, show_progress)


def main(argv: list[str] | None = None) -> int:
    """Run the job; return the exit status (a failure raises, with Spark's error)."""
    args = parse_args(argv)
    rows = job_main("kafka_to_storm", args, run, kafka=True)
    print(f"sent {rows} records from {args.topic} to {describe_target(args)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
