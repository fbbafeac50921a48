r"""Write a topology's results from Kafka into a Delta table, idempotently.

The results path of the wordcount-style examples: bolts hand tuples to Kafka
(``spark_storm.examples.kafka_bolt:KafkaResultBolt``, one JSON record per tuple) and this job
appends them to a Delta table.  Each micro-batch is written with Delta's ``txnAppId`` /
``txnVersion`` (the app id and the batch id), so a batch Spark runs again after a crash --
written to Delta but not yet marked done in the checkpoint -- is skipped by Delta instead
of appended twice.

    spark-submit --master local[2] --jars "$(ls jars/spark/*.jar | paste -sd,)" \\
        jobs/results_to_delta.py --bootstrap-servers 127.0.0.1:9092 --topic wordcount-results \\
        --schema "word STRING, count BIGINT" --table /data/wordcount --checkpoint /data/wordcount-ck

Rows get the record's ``topic``, ``partition`` and ``offset`` too (``--no-source-columns``
leaves them out), so every result row can be traced to its Kafka record.

``--merge-key FIELD`` (e.g. ``_id``, which ``KafkaExactResultBolt`` gives every record)
merges instead of appending: a row whose key the table holds already is not written
again, so records written to Kafka more than once (the at-least-once hand-off after a
crash) end up in the table once, and the table is exact.
"""

from __future__ import annotations

import argparse
from typing import Any

from spark_storm.spark.jobs import add_job_arguments, job_main


def show_progress(progress: dict[str, Any]) -> None:
    """Print one micro-batch's progress line."""
    print(f"batch {progress['batchId']}: {progress['numInputRows']} rows", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap-servers", required=True, help="Kafka brokers host:port,...")
    parser.add_argument("--topic", required=True, help="results topic (JSON values)")
    parser.add_argument("--schema", required=True, help='DDL schema of the JSON values, e.g. "word STRING, n BIGINT"')
    parser.add_argument("--table", required=True, help="Delta table path to append to")
    parser.add_argument("--app-id", help="Delta txnAppId (default: derived from table and topic; keep it stable)")
    parser.add_argument("--no-source-columns", action="store_true", help="leave out topic/partition/offset")
    parser.add_argument(
        "--merge-key", help="a field naming each record (e.g. _id): rows already in the table are skipped"
    )
    parser.add_argument("--starting-offsets", default="earliest")
    add_job_arguments(parser, storm=False, checkpoint_required=True)
    return parser.parse_args(argv)


def delta_writer(table: str, app_id: str) -> Any:
    """Return a foreachBatch function appending each batch once (Delta skips an (app id, batch id) it has)."""

    def write(batch: Any, batch_id: int) -> None:
        (
            batch.write.format("delta")
            .mode("append")
            .option("txnAppId", app_id)
            .option("txnVersion", batch_id)
            .save(table)
        )

    return write


def merge_writer(table: str, key: str, app_id: str) -> Any:
    """Return a foreachBatch function that inserts the rows whose ``key`` the table does not hold yet."""

    def write(batch: Any, batch_id: int) -> None:
        from delta.tables import DeltaTable

        rows = batch.dropDuplicates([key])
        if not DeltaTable.isDeltaTable(batch.sparkSession, table):
            rows.limit(0).write.format("delta").mode("append").save(table)
        (
            DeltaTable.forPath(batch.sparkSession, table)
            .alias("t")
            .merge(rows.alias("s"), f"t.`{key}` = s.`{key}`")
            .whenNotMatchedInsertAll()
            .execute()
        )

    return write


def run(spark: Any, args: argparse.Namespace) -> int:
    """Start the query on ``spark`` and run it to the end; return the records read."""
    from pyspark.sql import functions as F

    from spark_storm.spark.jobs import run_query

    app_id = args.app_id or f"results_to_delta:{args.topic}->{args.table}"
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap_servers)
        .option("subscribe", args.topic)
        .option("startingOffsets", args.starting_offsets)
        .load()
    )
    parsed = source.select(
        F.from_json(F.col("value").cast("string"), args.schema).alias("v"), "topic", "partition", "offset"
    )
    columns = [F.col("v.*")] + ([] if args.no_source_columns else [F.col("topic"), F.col("partition"), F.col("offset")])
    writer = (
        parsed.select(*columns)
        .writeStream.foreachBatch(
            merge_writer(args.table, args.merge_key, app_id) if args.merge_key else delta_writer(args.table, app_id)
        )
        .option("checkpointLocation", args.checkpoint)
    )
    return run_query(writer, args.available_now, args.seconds, show_progress)


def main(argv: list[str] | None = None) -> int:
    """Run the job; return the exit status (a failure raises, with Spark's error)."""
    args = parse_args(argv)
    rows = job_main("results_to_delta", args, run, kafka=True, delta=True)
    print(f"wrote {rows} records from {args.topic} to {args.table}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
