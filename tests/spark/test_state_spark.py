"""Exact state through failures with real Spark: a keyed ledger fed by format("storm") from files.

Every run ends with each key's committed [count, sum] equal to the answer computed from the
files, and prints the rollbacks and replays it took.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spark_storm.cluster.local_cluster import LocalCluster
from tests.support import wait_until
from tests.support.ledger import expected, ledger_state, ledger_topology, rows_for
from tests.support.spark import health, write_json_rows

pytestmark = pytest.mark.spark

FILES = 4
PER_FILE = 150


def _rows() -> dict[int, list[list[Any]]]:
    return {f: rows_for(f, PER_FILE) for f in range(FILES)}


def _write(src: Path, batches: dict[int, list[list[Any]]]) -> None:
    for f, rows in batches.items():
        write_json_rows(src, [{"key": k, "n": n} for k, n in rows], files=1, prefix=f"part{f}-")


def _start(spark: Any, src: Path, topo: Path, cluster: LocalCluster, ck: Path) -> Any:
    stream = spark.readStream.schema("key string, n long").option("maxFilesPerTrigger", 1).json(str(src))
    return (
        stream.writeStream.format("storm")
        .option("topology", str(topo))
        .option("workers", cluster.workers_arg)
        .option("delivery", "processed")  # and the default ackTimeoutMs
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )


def _cp(cluster: LocalCluster, index: int) -> Any:
    try:
        return health(cluster, cluster.slots[index]).get("checkpoint") or {}
    except (OSError, AssertionError):
        return {}


def _with_source(cluster: LocalCluster) -> int:
    plan = cluster.plan
    hosting = {plan.task_slot[t] for t in plan.component_tasks["in"]}
    return next(i for i, s in enumerate(cluster.slots) if s in hosting)


def _report(what: str, cluster: LocalCluster) -> None:
    rollbacks = max((_cp(cluster, i).get("rollbacks", 0) for i in range(len(cluster.slots))), default=0)
    replayed = sum(_cp(cluster, i).get("replayed_records", 0) for i in range(len(cluster.slots)))
    print(f"{what}: {rollbacks} rollback(s), {replayed} input-log records replayed")


def _finish(q: Any) -> None:
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()


def test_ledger_is_exact_after_a_worker_sigkilled_mid_batch(spark: Any, tmp_path: Path) -> None:
    batches = _rows()
    _write(tmp_path / "in", batches)
    topo = ledger_topology(tmp_path)
    with LocalCluster(str(topo), 2) as cluster:
        q = _start(spark, tmp_path / "in", topo, cluster, tmp_path / "ck")
        victim = _with_source(cluster)
        wait_until(lambda: _cp(cluster, victim).get("committed", 0) >= 1, what="a first batch committed", timeout=120)
        before = health(cluster, cluster.slots[victim])["counters"]["source_tuples_in"]
        wait_until(
            lambda: health(cluster, cluster.slots[victim])["counters"]["source_tuples_in"] > before,
            what="the victim accepting the next batch",
            timeout=120,
        )
        cluster.kill(cluster.slots[victim])
        cluster.start_worker(cluster.slots[victim])
        _finish(q)
        _report("SIGKILL mid-batch", cluster)
        state = ledger_state(tmp_path / "state", cluster.topology.name, cluster.plan)
    assert state == expected(batches)


def test_ledger_is_exact_after_a_worker_sigkilled_during_a_commit(spark: Any, tmp_path: Path) -> None:
    batches = _rows()
    _write(tmp_path / "in", batches)
    topo = ledger_topology(tmp_path, conf={"ledger.prepare.delay.s": 1.0})
    with LocalCluster(str(topo), 2) as cluster:
        q = _start(spark, tmp_path / "in", topo, cluster, tmp_path / "ck")
        wait_until(
            lambda: (cp := _cp(cluster, 1)).get("epoch", 0) > cp.get("committed", 0) >= 1,
            what="a commit under way on worker 1 (its barrier is out, the epoch not committed)",
            timeout=120,
        )
        cluster.kill(cluster.slots[1])
        cluster.start_worker(cluster.slots[1])
        _finish(q)
        _report("SIGKILL during a commit", cluster)
        state = ledger_state(tmp_path / "state", cluster.topology.name, cluster.plan)
    assert state == expected(batches)


def test_ledger_is_exact_after_two_workers_sigkilled_one_after_the_other(spark: Any, tmp_path: Path) -> None:
    batches = _rows()
    _write(tmp_path / "in", batches)
    topo = ledger_topology(tmp_path)
    with LocalCluster(str(topo), 3) as cluster:
        q = _start(spark, tmp_path / "in", topo, cluster, tmp_path / "ck")
        first = _with_source(cluster)
        wait_until(lambda: _cp(cluster, first).get("committed", 0) >= 1, what="a first batch committed", timeout=120)
        cluster.kill(cluster.slots[first])
        cluster.start_worker(cluster.slots[first])
        cluster.wait_running(60, [cluster.slots[first]])
        second = next(i for i in range(3) if i != first)
        cluster.kill(cluster.slots[second])
        cluster.start_worker(cluster.slots[second])
        _finish(q)
        _report("two SIGKILLs", cluster)
        state = ledger_state(tmp_path / "state", cluster.topology.name, cluster.plan)
    assert state == expected(batches)


def test_ledger_is_exact_after_the_query_stopped_mid_batch_and_restarted(spark: Any, tmp_path: Path) -> None:
    batches = _rows()
    _write(tmp_path / "in", batches)
    topo = ledger_topology(tmp_path, conf={"ledger.delay.s": 0.01})  # a batch takes 1.5 s at the ledger
    with LocalCluster(str(topo), 2) as cluster:
        q = _start(spark, tmp_path / "in", topo, cluster, tmp_path / "ck")
        wait_until(lambda: _cp(cluster, 0).get("committed", 0) >= 1, what="a first batch committed", timeout=120)
        wait_until(
            lambda: sum(health(cluster, s)["counters"]["source_tuples_in"] for s in cluster.slots) > PER_FILE,
            what="the next batch under way",
            timeout=120,
        )
        q.stop()  # mid-batch: Spark has not committed it, and replays it with the same id
        assert not (tmp_path / "ck" / "commits" / "1").exists()
        q = _start(spark, tmp_path / "in", topo, cluster, tmp_path / "ck")
        _finish(q)
        _report("query restarted", cluster)
        state = ledger_state(tmp_path / "state", cluster.topology.name, cluster.plan)
        replays = sum(health(cluster, s)["server"]["replayed_groups"] for s in cluster.slots)
    print(f"groups of the replayed batch the workers already had: {replays}")
    assert replays > 0
    assert state == expected(batches)
    assert json.dumps(state)  # the committed state is plain data
