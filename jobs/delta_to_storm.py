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
from typing import Any

from spark_storm.spark.jobs import add_job_arguments, describe_target, job_main


def show_progress(progress: dict[str, Any]) -> None:
    """Print one micro-batch's progress line."""
    print(f"batch {progress['batchId']}: {progress['numInputRows']} rows", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", required=True, help="Delta table path to read as a stream")
    parser.add_argument("--max-files-per-trigger", type=int, default=0, help="cap per micro-batch (0 = Delta's)")
    add_job_arguments(parser, storm=True)
    return parser.parse_args(argv)


def run(spark: Any, args: argparse.Namespace) -> int:
    """Start the query on ``spark`` and run it to the end; return the rows sent."""
    from spark_storm.errors import ConfigError
    from spark_storm.spark import register
    from spark_storm.spark.jobs import run_query, source_component, storm_writer

    register(spark)
    component, fields = source_component(args.topology, args.component)
    reader = spark.readStream.format("delta")
    if args.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
    df = reader.load(args.table)
    missing = [f for f in fields if f not in df.columns]
    if missing:
        msg = f"table {args.table} has no column {', '.join(missing)} (source {component!r} needs {fields})"
        raise ConfigError(msg)
    writer = storm_writer(df.select(*fields), args, component, "delta-to-storm-ck-")
    return run_query(writer, args.available_now, args.seconds, show_progress)


def main(argv: list[str] | None = None) -> int:
    """Run the job; return the exit status (a failure raises, with Spark's error)."""
    args = parse_args(argv)
    rows = job_main("delta_to_storm", args, run, delta=True)
    print(f"sent {rows} rows from {args.table} to {describe_target(args)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
