r"""Stream sentences into a running wordcount topology with format("storm").

Runs unchanged with ``python`` (local[*]), ``spark-submit --master local[2]`` or on a
cluster (ship spark-storm to the executors: ``--py-files`` a wheel, or install it).

    spark-submit --master local[2] jobs/wordcount_to_storm.py \\
        --topology conf/topologies/wordcount.yaml --workers 127.0.0.1:6700,127.0.0.1:6701 --seconds 30
    spark-submit --master local[2] jobs/wordcount_to_storm.py \\
        --topology wordcount --zookeeper 127.0.0.1:2181 --seconds 30     # a topology submitted to a cluster

Source: the rate source mapped onto the bundled corpus (``--rows-per-second``), or text
files dropped into ``--input-dir`` (one sentence per line).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from importlib import resources


def main(argv: list[str] | None = None) -> int:
    """Run the job; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--topology", required=True, help="topology YAML (its 'sentences' source is fed); with --zookeeper its name"
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--workers", help="worker slots host:port,... (static mode)")
    target.add_argument("--zookeeper", help="HOST:PORT[/chroot] of the cluster the topology was submitted to")
    parser.add_argument("--seconds", type=float, default=30.0, help="stream this long, then stop (0 = forever)")
    parser.add_argument("--rows-per-second", type=int, default=1000)
    parser.add_argument(
        "--min-batches", type=int, default=0, help="run at least this many micro-batches with data (after --seconds)"
    )
    parser.add_argument("--input-dir", help="read text files from here instead of the rate source")
    parser.add_argument("--delivery", default="accepted", choices=["none", "accepted", "processed"])
    parser.add_argument("--checkpoint", default=None, help="checkpoint dir (default: a temp dir)")
    parser.add_argument("--storm-conf", help="a storm.yaml for the connections (e.g. the auth secret file)")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_storm.spark.jobs import finish_cut_batch, input_rows, stop_between_batches

    # spark-submit sets the master; a plain `python jobs/...` run gets local[*].
    builder = SparkSession.builder.appName("wordcount_to_storm")
    if "SPARK_SUBMIT" not in os.environ and "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master("local[*]")
    spark = builder.getOrCreate()
    if args.input_dir:
        df = spark.readStream.text(args.input_dir).select(F.col("value").alias("sentence"))
    else:
        corpus = resources.files("spark_storm.examples").joinpath("corpus.txt").read_text().splitlines()
        sentences = F.array(*[F.lit(s) for s in corpus])
        df = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", args.rows_per_second)
            .load()
            .select(F.element_at(sentences, (F.col("value") % len(corpus) + 1).cast("int")).alias("sentence"))
        )
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="wordcount-ck-")
    writer = (
        df.writeStream.format("storm")
        .option("topology", args.topology)
        .options(**({"zookeeper": args.zookeeper} if args.zookeeper else {"workers": args.workers}))
        .option("delivery", args.delivery)
        .options(**({"conf": args.storm_conf} if args.storm_conf else {}))
        .option("checkpointLocation", checkpoint)
    )
    query = writer.trigger(processingTime="1 second").start()
    started = time.monotonic()

    def batches_with_data() -> int:
        return sum(1 for p in query.recentProgress if input_rows(p) > 0)

    while args.seconds <= 0 or time.monotonic() - started < args.seconds or batches_with_data() < args.min_batches:
        if query.exception() is not None:
            print(f"query failed: {query.exception()}", file=sys.stderr)
            return 1
        time.sleep(1.0)
        progress = query.lastProgress
        if progress:
            print(f"batch {progress['batchId']}: {input_rows(progress)} rows", flush=True)
    between = stop_between_batches(query, checkpoint=checkpoint)
    sent = sum(input_rows(p) for p in query.recentProgress)
    if not between:  # it cut a batch whose rows may have reached the workers: finish it
        again = finish_cut_batch(lambda: writer.trigger(availableNow=True).start())
        if again is None:
            print("the micro-batch the stop cut did not finish: its rows are not counted", file=sys.stderr)
        else:
            sent += sum(input_rows(p) for p in again.recentProgress)
    print(f"sent {sent} sentences to {args.workers or 'the cluster at ' + args.zookeeper}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
