"""deploy() on a Spark standalone cluster (the project's tool: master + worker, 3 executors of 2 cores).

A stateful keyed ledger with Redis state (the project's Redis) runs as 2 workers hosted by
Spark tasks; a stream feeds it through ZooKeeper at delivery=processed, and the executor JVM
hosting a worker is SIGKILLed mid-stream.  Spark runs the supervisor task again, nimbus
reassigns, and every key's committed [count, sum] must equal the answer computed from the
files; the seconds from the kill to the stream flowing again are printed (``pytest -s``).
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from spark_storm.cluster.state import ClusterState
from spark_storm.errors import DeployError
from spark_storm.spark import deploy, register
from spark_storm.state.redis import RedisBackend
from spark_storm.tools.redis_server import RedisServer
from spark_storm.tools.spark_standalone import SparkStandalone
from spark_storm.topology import load_topology, plan
from tests.support import ROOT, wait_until, wordcount
from tests.support.cluster import alive
from tests.support.ledger import expected, ledger_topology, rows_for
from tests.support.on_spark import FAST_DEPLOY, executor_of, kill, processes, wait_all_gone
from tests.support.spark import write_json_rows

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(1200)]

FILES = 24
PER_FILE = 100


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone master and worker with 6 cores: 3 executors of 2 cores each for this module's application."""
    cluster = SparkStandalone(tmp_path_factory.mktemp("standalone-3x2"))
    master = cluster.start(cores=6, memory="4g")
    yield master
    cluster.stop()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    assert server.url is not None
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def spark(standalone: str) -> Iterator[Any]:
    """This module's one SparkSession: the standalone cluster, 3 executors of 2 cores."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master(standalone)
        .appName("spark-storm-on-spark-standalone")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.cores", "2")
        .config("spark.cores.max", "6")
        .config("spark.executor.memory", "512m")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        # The pytest process's one JVM starts here in a full run (tests/cluster sorts first): every
        # module's session asks for the same connector jars, or Kafka and Delta are missing in
        # the later modules' sessions (tests/support/spark.py).
        .config("spark.jars", ",".join(sorted(str(p) for p in (ROOT / "jars" / "spark").glob("*.jar"))))
        .getOrCreate()
    )
    register(session)
    jsc = session.sparkContext._jsc.sc()
    wait_until(lambda: len(jsc.statusTracker().getExecutorInfos()) >= 4, what="3 executors registered", timeout=180)
    yield session
    session.stop()


def _flowing_again(progress: list[dict[str, Any]], killed_at: float) -> tuple[float, float]:
    """(seconds from the kill until the first micro-batch that started after it completed, the longest stall).

    Spark's progress says when each micro-batch started (``timestamp``) and how long it took.
    """
    spans = sorted(
        (start, start + p["durationMs"].get("triggerExecution", 0) / 1000)
        for p in progress
        if int(p.get("numInputRows") or 0) > 0
        for start in [datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()]
    )
    after = [end for start, end in spans if start > killed_at]
    assert after, "no micro-batch started and ended after the kill"
    ends = sorted(end for _, end in spans)
    stall = max((b - a for a, b in itertools.pairwise(ends) if b > killed_at), default=0.0)
    return round(min(after) - killed_at, 1), round(stall, 1)


def test_an_executor_sigkilled_mid_stream_loses_nothing_and_the_redis_ledger_is_exact(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    name = "ledgeronspark"
    batches = {f: rows_for(f, PER_FILE) for f in range(FILES)}
    for f, rows in batches.items():
        write_json_rows(tmp_path / "src", [{"key": k, "n": n} for k, n in rows], files=1, prefix=f"part{f:03d}-")
    path = ledger_topology(
        tmp_path,
        name=name,
        sources=2,
        conf={
            "topology.state.provider": "redis",
            "topology.state.provider.config": {"url": redis_url},
            "ledger.delay.s": 0.002,
            "topology.message.timeout.secs": 30,
        },
    )
    started = time.monotonic()
    with deploy(spark, str(path), workers=2, conf=FAST_DEPLOY) as topo:
        print(f"\ndeploy() to 2 workers running on 3 executors: {time.monotonic() - started:.1f}s")
        v1 = topo.status()
        query = (
            spark.readStream.schema("key string, n long")
            .option("maxFilesPerTrigger", 1)
            .json(str(tmp_path / "src"))
            .writeStream.format("storm")
            .option("zookeeper", topo.zookeeper)
            .option("topology", name)
            .option("delivery", "processed")
            .option("ackTimeoutMs", "20000")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            wait_until(
                lambda: sum(1 for p in query.recentProgress if int(p.get("numInputRows") or 0) > 0) >= 4,
                what="4 micro-batches through the ledger",
                timeout=300,
                interval=0.2,
            )
            before = processes(topo)
            with ClusterState(topo.zookeeper, topo.settings) as state:
                assignment = state.read_assignment(name)
                assert assignment is not None
                the_plan = assignment.plan(load_topology(path))
            source_slot = str(the_plan.task_slot[the_plan.component_tasks["in"][0]])
            victim_worker = before.workers[source_slot]
            executor = executor_of(victim_worker)
            killed_at = time.time()
            kill(executor)
            wait_until(lambda: not alive(executor), what="the executor JVM to die", timeout=30)
            query.awaitTermination(600)
            assert query.exception() is None, query.exception()
            assert not query.isActive, "the stream did not finish within 600s"
            progress = [dict(p) for p in query.recentProgress]
        finally:
            query.stop()
        after = topo.status()
        flowing, stall = _flowing_again(progress, killed_at)
        print(
            f"executor SIGKILL -> stream flowing again: {flowing}s (longest stall {stall}s); "
            f"assignment v{v1.version} -> v{after.version}; task retries {after.task_retries}; "
            f"resubmits {after.resubmits}"
        )
        assert after.task_retries >= 1, after  # Spark ran the killed supervisor task again
        assert after.version > v1.version, after  # nimbus reassigned
        assert after.workers == 2
        sent = sum(int(p.get("numInputRows") or 0) for p in progress)
        assert sent >= FILES * PER_FILE  # every file went through (a replayed batch counts twice here)
        last = processes(topo)
    wait_all_gone(last, "after stop()")
    wait_all_gone(before, "the killed executor's worker")
    topology = load_topology(path)
    tasks = list(plan(topology, "127.0.0.1:1").component_tasks["ledger"])
    backend = RedisBackend(name, redis_url)
    got: dict[str, list[int]] = {}
    try:
        for task in tasks:
            _, data = backend.task_store(task).restore()
            for key, value in data.items():
                assert key not in got, f"key {key} is in two tasks' state"
                got[str(key)] = list(value)
    finally:
        backend.close()
    want = expected(batches)
    wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    assert not wrong, f"{len(wrong)} of {len(want)} keys wrong (got, want): {dict(list(wrong.items())[:5])}"
    assert set(got) == set(want)


def test_too_few_task_slots_on_a_cluster_is_refused(spark: Any, tmp_path: Path) -> None:
    msg = (
        r"^deploy\(workers=6\): this Spark application has 6 task slot\(s\) on 3 executor\(s\); the 6 worker\(s\) "
        r"and the stream's tasks \(storm.spark.deploy.reserve.slots=1\) need 7: give it more "
        r"\(spark.executor.instances or --total-executor-cores / spark.cores.max, spark.executor.cores\) or ask for "
        r"fewer workers$"
    )
    with pytest.raises(DeployError, match=msg):
        deploy(spark, str(wordcount(tmp_path, "toomany")), workers=6, conf={"storm.spark.deploy.slots.wait.secs": 1})


def test_rebalance_starts_and_retires_supervisor_tasks(spark: Any, tmp_path: Path) -> None:
    with deploy(spark, str(wordcount(tmp_path, "wcrebalance")), workers=1, conf=FAST_DEPLOY) as topo:
        topo.rebalance(3)
        grown = topo.status()
        assert (grown.workers, grown.requested, grown.tasks) == (3, 3, 3), grown
        assert len({slot.rsplit(":", 1)[1] for slot in topo.workers()}) == 3
        topo.rebalance(2)
        wait_until(lambda: topo.status().tasks == 2, what="the retired supervisor task to end", timeout=120)
        shrunk = topo.status()
        assert (shrunk.workers, shrunk.requested, shrunk.tasks, shrunk.resubmits) == (2, 2, 2, 0), shrunk
        assert [j.detail for j in topo._jobs.values() if not j.running] == [
            "retired (the deployment has fewer workers now)"
        ]
        last = processes(topo)
    wait_all_gone(last, "after stop()")


def test_cpus_per_worker_gives_each_worker_a_whole_executor(spark: Any, tmp_path: Path) -> None:
    """A task resource profile of 2 CPUs (an executor's cores): Spark places the two worker tasks on two executors.

    Without it both may land on one 2-core executor, and losing that executor loses both workers.
    """
    with deploy(spark, str(wordcount(tmp_path, "wcprofile")), workers=2, cpus_per_worker=2, conf=FAST_DEPLOY) as topo:
        procs = processes(topo)
        executors = {executor_of(pid) for pid in procs.supervisors.values()}
        assert len(executors) == 2, procs
    wait_all_gone(procs, "after stop()")
    msg = (
        r"^deploy\(cpus_per_worker=4\): an executor has 2 cores \(spark.executor.cores\), so no executor could run a "
        r"worker's task: raise spark.executor.cores or lower cpus_per_worker$"
    )
    with pytest.raises(DeployError, match=msg):
        deploy(spark, str(wordcount(tmp_path, "wcprofile")), workers=1, cpus_per_worker=4)
