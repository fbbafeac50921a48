r"""Stream a Delta table into a topology with format("storm").

    scripts/fetch-jars
    spark-submit --master local[2] --jars "$(ls jars/spark/delta-*.jar | paste -sd,)" \\
        jobs/delta_to_storm.py --table /data/sentences --topology conf/topologies/wordcount.yaml \\
        --workers 127.0.0.1:6700,127.0.0.1:6701

The table's columns named like the source component's fields are sent (a missing one is an
error naming it).  The stream's offsets (Delta versions) live in the checkpoint: a rerun
on the same checkpoint sends only rows committed to the table since, and with
``--delivery accepted|processed`` nothing reaches the workers twice.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from typing import Any


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", required=True, help="Delta table path to read as a stream")
    parser.add_argument("--topology", required=True, help="topology YAML")
    parser.add_argument("--workers", required=True, help="worker slots host:port,...")
    parser.add_argument("--component", help="source component to feed (default: the topology's only source)")
    parser.add_argument("--max-files-per-trigger", type=int, default=0, help="cap per micro-batch (0 = Delta's)")
    parser.add_argument("--delivery", default="processed", choices=["none", "accepted", "processed"])
    parser.add_argument("--available-now", action="store_true", help="send what the table holds now, then stop")
    parser.add_argument("--seconds", type=float, default=0.0, help="without --available-now: stop after (0 = never)")
    parser.add_argument("--checkpoint", help="checkpoint dir (default: a temp dir; give one to resume)")
    parser.add_argument("--storm-conf", help="a storm.yaml for the connections (e.g. the auth secret file)")
    parser.add_argument("--jars-dir", default="jars/spark", help="connector jars for a plain python run")
    return parser.parse_args(argv)


def run(spark: Any, args: argparse.Namespace) -> int:
    """Start the query on ``spark`` and run it to the end; return the rows sent."""
    from spark_storm.spark import register
    from spark_storm.spark.jobs import run_query, source_component

    register(spark)
    component, fields = source_component(args.topology, args.component)
    reader = spark.readStream.format("delta")
    if args.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
    df = reader.load(args.table)
    missing = [f for f in fields if f not in df.columns]
    if missing:
        msg = f"table {args.table} has no column {', '.join(missing)} (source {component!r} needs {fields})"
        raise ValueError(msg)
    writer = (
        df.select(*fields)
        .writeStream.format("storm")
        .option("topology", args.topology)
        .option("workers", args.workers)
        .option("component", component)
        .option("delivery", args.delivery)
        .options(**({"conf": args.storm_conf} if args.storm_conf else {}))
        .option("checkpointLocation", args.checkpoint or tempfile.mkdtemp(prefix="delta-to-storm-ck-"))
    )
    return run_query(writer, args.available_now, args.seconds)


def main(argv: list[str] | None = None) -> int:
    """Run the job; return the exit status."""
    args = parse_args(argv)
    from spark_storm.spark.session import job_session

    spark = job_session("delta_to_storm", args.jars_dir, delta=True)
    try:
        sent = run(spark, args)
    except Exception as exc:
        print(f"delta_to_storm failed: {exc}", file=sys.stderr)
        return 1
    print(f"sent {sent} rows from {args.table} to {args.workers}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
