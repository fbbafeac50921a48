r"""Host a topology's workers in this Spark application, and keep them running until told to stop.

``deploy()`` as a job: the topology's supervisors run as long-running tasks of this application
(one per worker), nimbus on the driver, ZooKeeper on the driver unless ``--zookeeper`` names
one.  It runs until SIGTERM or SIGINT (the driver stops everything it started, then exits 0),
until the topology is killed from outside (``spark-storm kill NAME --zookeeper ZK``: exit 0), or
for ``--seconds``; it exits 1 if the deployment fails (supervisor tasks Spark could not keep
running).  Feed it from another job with ``format("storm").option("zookeeper", ZK)`` (ZK is
printed), or with ``--feed-rows-per-second`` from this one.

    spark-submit --master spark://HOST:7077 jobs/storm_on_spark.py \\
        --topology conf/topologies/wordcount.yaml --workers 3
    python jobs/storm_on_spark.py --topology conf/topologies/wordcount.yaml --workers 1   # local[*]

Secrets (``storm.messaging.auth.secret``, TLS key passwords) go in the ``--conf`` storm.yaml:
they reach the supervisor tasks inside the Spark job and the workers as an owner-only file,
never on a command line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from importlib import resources
from typing import Any


def main(argv: list[str] | None = None) -> int:
    """Run the job; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", required=True, help="topology YAML or Flux file, or a submitted topology's name")
    parser.add_argument("--workers", type=int, required=True, help="worker processes (one Spark task each)")
    parser.add_argument("--zookeeper", help="HOST:PORT[/chroot] every executor reaches (default: one on the driver)")
    parser.add_argument("--conf", help="a storm.yaml for every process (auth secret, state provider, ...)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="a conf override (repeatable)")
    parser.add_argument("--cpus-per-worker", type=int, help="CPUs each worker's task reserves (stage-level scheduling)")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0 = until told)")
    parser.add_argument("--timeout", type=float, help="seconds to wait for every worker to run")
    parser.add_argument("--ui-port", type=int, help="serve the Storm UI from the driver on this port")
    parser.add_argument(
        "--feed-rows-per-second", type=int, default=0, help="also stream the bundled corpus into its only source"
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    logging.getLogger("py4j").setLevel(logging.WARNING)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_storm.errors import StormError
    from spark_storm.spark import deploy, register

    stop = threading.Event()
    why = ["--seconds elapsed"]

    def on_signal(signum: int, _frame: object) -> None:
        why[0] = signal.Signals(signum).name
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    # Only the settings given: the topology's own conf still wins over the defaults.
    conf: dict[str, Any] = {}
    if args.conf:
        import yaml

        with open(args.conf, encoding="utf-8") as text:
            conf.update(yaml.safe_load(text) or {})
    for item in args.set:
        key, _, value = item.partition("=")
        conf[key] = json.loads(value)

    builder = SparkSession.builder.appName("storm_on_spark")
    if "SPARK_SUBMIT" not in os.environ and "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master("local[*]")
    spark = builder.getOrCreate()
    register(spark)
    query = None
    try:
        topo = deploy(
            spark,
            args.topology,
            workers=args.workers,
            zookeeper=args.zookeeper,
            conf=conf,
            cpus_per_worker=args.cpus_per_worker,
            timeout=args.timeout,
            ui_port=args.ui_port,
        )
    except StormError as exc:
        print(f"storm_on_spark: {exc}", file=sys.stderr, flush=True)
        spark.stop()
        return 2
    with topo:
        print(f"deployed {topo.name} zookeeper={topo.zookeeper} workers={','.join(topo.workers())}", flush=True)
        if topo.ui_url:
            print(f"UI: {topo.ui_url}", flush=True)
        if args.feed_rows_per_second:
            query = _feed(spark, topo, args.feed_rows_per_second)
        started = time.monotonic()
        while not stop.wait(0.5):
            if topo.wait_stopped(0):
                why[0] = "the deployment ended" if topo.error is None else f"the deployment failed: {topo.error}"
                break
            if args.seconds and time.monotonic() - started >= args.seconds:
                break
        if query is not None:
            query.stop()
        print(f"stopping {topo.name}: {why[0]}", flush=True)
    print(f"stopped {topo.name} ({topo.state})", flush=True)
    spark.stop()
    return 1 if topo.error is not None else 0


def _feed(spark: Any, topo: Any, rate: int) -> Any:
    """Stream the bundled corpus into the topology's only source (a demonstration feed)."""
    from pyspark.sql import functions as F

    corpus = resources.files("spark_storm.examples").joinpath("corpus.txt").read_text().splitlines()
    sentences = F.array(*[F.lit(s) for s in corpus])
    df = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .load()
        .select(F.element_at(sentences, (F.col("value") % len(corpus) + 1).cast("int")).alias("sentence"))
    )
    return (
        df.writeStream.format("storm")
        .option("topology", topo.name)
        .option("zookeeper", topo.zookeeper)
        .option("delivery", "processed")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="storm-on-spark-ck-"))
        .trigger(processingTime="1 second")
        .start()
    )


if __name__ == "__main__":
    sys.exit(main())
