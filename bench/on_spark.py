"""A topology hosted by Spark (``deploy()``) against the same workers run by ``local-cluster``, in one run.

On a Spark standalone cluster from the project's tool (one master, one worker offering 6 cores;
the application gets 3 executors of 2 cores), with one SparkSession:

1. **deploy() to running**: seconds from ``deploy(spark, topology, workers=2)`` to its return
   (every worker running its assignment), ZooKeeper's start on the driver included; once per
   round.  Target: <= 20 s.
2. **Throughput, hosted / local-cluster**: the same topology (a source of 4 no-op tuple tasks on
   2 workers), fed the same way (``rate-micro-batch``, ``--rows-per-batch`` rows per 1 s trigger,
   ``format("storm")`` with ``delivery=processed`` and the workers' slots), by the same session:
   the median ``processedRowsPerSecond`` after a warm-up, interleaved rounds, best of each side.
   The hosted workers are also fed through ZooKeeper (``option("zookeeper")``, as users do), shown
   beside.  Target: hosted / local >= 0.9.
3. **Executor SIGKILL to flowing**: with default settings, a stream into the hosted topology,
   the executor JVM hosting a source task's worker SIGKILLed; seconds from the kill until a
   micro-batch completes after the stall.  Target: <= 30 s.

    python -m bench.on_spark [--rows-per-batch 100000] [--seconds 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.cluster.state import ClusterState
from spark_storm.spark import deploy, register
from spark_storm.tools.spark_standalone import SparkStandalone

WORKERS = 2


def measure(query: Any, seconds: float, warmup: int = 1, batches: int = 5) -> float:
    """Median processedRowsPerSecond of ``query``'s micro-batches after ``warmup``.

    Runs ``seconds``, and on until ``batches`` micro-batches with rows followed the warm-up (at most
    three times ``seconds``): a query's first batch waits for Spark's Python workers to start.
    """
    started = time.monotonic()
    while True:
        time.sleep(0.5)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        done = sum(1 for p in query.recentProgress if p["numInputRows"] > 0)
        elapsed = time.monotonic() - started
        if (elapsed >= seconds and done >= warmup + batches) or elapsed >= 3 * seconds:
            break
    rates = [p["processedRowsPerSecond"] for p in query.recentProgress if p["numInputRows"] > 0][warmup:]
    query.stop()
    return statistics.median(rates) if rates else 0.0


def executor_of(pid: int) -> int:
    """The nearest ``java`` ancestor of ``pid`` (the Spark executor that hosts it)."""
    current = pid
    while current > 1:
        parent = int(Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if Path(f"/proc/{parent}/comm").read_text().strip() == "java":
            return parent
        current = parent
    msg = f"process {pid} does not descend from a java process"
    raise RuntimeError(msg)


def batch_spans(progress: list[Any]) -> list[tuple[float, float]]:
    """(start, end) of each micro-batch with rows, from Spark's progress (``timestamp`` is when it started)."""
    spans = []
    for p in progress:
        if int(p["numInputRows"] or 0) > 0:
            start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            spans.append((start, start + p["durationMs"].get("triggerExecution", 0) / 1000))
    return sorted(spans)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="each throughput measurement")
    parser.add_argument("--rows-per-batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    tmp = Path(tempfile.mkdtemp(prefix="bench-on-spark-"))
    path = tmp / "benchhosted.yaml"
    source = {
        "id": "in",
        "source": True,
        "fields": ["value"],
        "parallelism": 2,
        "tasks": 4,
        "bolt": "spark_storm.examples.noop:NoopBolt",
    }
    path.write_text(yaml.safe_dump({"name": "benchhosted", "components": [source]}))

    from pyspark.sql import SparkSession

    cluster = SparkStandalone(tmp / "standalone")
    master = cluster.start(cores=6, memory="4g")
    spark = (
        SparkSession.builder.master(master)
        .appName("bench-on-spark")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.cores", "2")
        .config("spark.cores.max", "6")
        .config("spark.executor.memory", "512m")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    register(spark)
    jsc = spark.sparkContext._jsc.sc()
    while len(jsc.statusTracker().getExecutorInfos()) < 4:  # the driver and 3 executors
        time.sleep(0.5)

    def feed(**target: str) -> Any:
        return (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", args.rows_per_batch)
            .load()
            .select("value")
            .writeStream.format("storm")
            .options(**target)
            .option("delivery", "processed")
            .option("checkpointLocation", tempfile.mkdtemp(dir=tmp))
            .trigger(processingTime="1 second")
            .start()
        )

    figures: dict[str, Any] = {"deploy_s": [], "hosted": 0.0, "hosted_zookeeper": 0.0, "local": 0.0}
    try:
        # Warm the session first (Spark's Python workers on every executor), so that no side pays for it.
        spark.range(6, numPartitions=6).mapInArrow(lambda batches: batches, "id long").collect()
        for r in range(args.rounds):
            started = time.monotonic()
            with deploy(spark, str(path), workers=WORKERS) as topo:
                took = time.monotonic() - started
                figures["deploy_s"].append(round(took, 1))
                slots = ",".join(sorted(topo.workers()))
                hosted = measure(feed(topology=str(path), workers=slots), args.seconds)
                via_zk = measure(feed(topology=topo.name, zookeeper=topo.zookeeper), args.seconds)
            with LocalCluster(str(path), WORKERS) as local_cluster:
                local = measure(feed(topology=str(path), workers=local_cluster.workers_arg), args.seconds)
            figures["hosted"] = max(figures["hosted"], hosted)
            figures["hosted_zookeeper"] = max(figures["hosted_zookeeper"], via_zk)
            figures["local"] = max(figures["local"], local)
            print(
                f"round {r + 1}: deploy() {took:.1f}s; rows/s hosted {hosted:,.0f} (through ZooKeeper {via_zk:,.0f}), "
                f"local-cluster {local:,.0f}",
                file=sys.stderr,
                flush=True,
            )
        figures.update(kill_to_flowing(spark, path, feed))
    finally:
        spark.stop()
        cluster.stop()
    ratio = figures["hosted"] / figures["local"] if figures["local"] else 0.0
    ratio_zk = figures["hosted_zookeeper"] / figures["local"] if figures["local"] else 0.0
    figures["ratio"] = round(ratio, 3)
    figures["ratio_zookeeper"] = round(ratio_zk, 3)
    print(
        f"\nSpark standalone (3 executors x 2 cores), {WORKERS} hosted workers, a no-op source of 4 tasks, "
        f"rate-micro-batch {args.rows_per_batch:,} rows per 1 s trigger, delivery=processed; "
        f"best of {args.rounds} rounds"
    )
    print(f"  deploy() to all workers running (ZooKeeper start included): {figures['deploy_s']} s   target <= 20 s")
    print(
        f"  throughput hosted {figures['hosted']:,.0f} rows/s, local-cluster {figures['local']:,.0f} rows/s: "
        f"ratio {ratio:.2f}   target >= 0.9   (hosted fed through ZooKeeper: {figures['hosted_zookeeper']:,.0f}, "
        f"ratio {ratio_zk:.2f})"
    )
    print(
        f"  executor SIGKILL to flowing again: {figures['kill_to_flowing_s']} s (longest stall "
        f"{figures['longest_stall_s']} s; new assignment after {figures['reassigned_after_s']} s)   target <= 30 s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


def kill_to_flowing(spark: Any, path: Path, feed: Any) -> dict[str, Any]:
    """Default settings: SIGKILL the executor hosting a source task's worker mid-stream; when does it flow again."""
    with deploy(spark, str(path), workers=WORKERS) as topo:
        query = feed(topology=topo.name, zookeeper=topo.zookeeper)
        try:
            while sum(1 for p in query.recentProgress if p["numInputRows"] > 0) < 3:
                time.sleep(0.2)
            plan = topo.plan()
            assert plan is not None
            victim = str(plan.task_slot[plan.component_tasks["in"][0]])
            with ClusterState(topo.zookeeper, topo.settings) as state:
                before = state.read_assignment(topo.name)
                assert before is not None
                pid = int(state.read_heartbeats(topo.name)[plan.task_slot[plan.component_tasks["in"][0]]].record["pid"])
                killed_at = time.time()
                os.kill(executor_of(pid), signal.SIGKILL)
                reassigned = None
                deadline = time.monotonic() + 180
                while time.monotonic() < deadline:
                    now = state.read_assignment(topo.name)
                    if reassigned is None and now is not None and now.version > before.version:
                        reassigned = time.time() - killed_at
                    after = [e for s, e in batch_spans(list(query.recentProgress)) if s > killed_at]
                    if len(after) >= 3 and reassigned is not None:
                        break
                    if query.exception() is not None:
                        raise RuntimeError(str(query.exception()))
                    time.sleep(0.2)
            spans = batch_spans(list(query.recentProgress))
        finally:
            query.stop()
    # flowing again: the first micro-batch that started after the kill has completed
    resumed = min((e for s, e in spans if s > killed_at), default=float("nan"))
    ends = sorted(e for _, e in spans)
    stall = max((b - a for a, b in itertools.pairwise(ends) if b > killed_at), default=float("nan"))
    print(f"killed worker {victim}'s executor: flowing again after {resumed - killed_at:.1f}s", file=sys.stderr)
    return {
        "kill_to_flowing_s": round(resumed - killed_at, 1),
        "longest_stall_s": round(stall, 1),
        "reassigned_after_s": None if reassigned is None else round(reassigned, 1),
    }


if __name__ == "__main__":
    raise SystemExit(main())
