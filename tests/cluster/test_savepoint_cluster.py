"""The upgrade in cluster mode, with Spark: kill --savepoint mid-stream, a new bolt version, the same query again.

A keyed ledger is submitted to nimbus and fed by a Spark stream (delivery=processed).  While
the stream runs, ``spark-storm kill --savepoint`` commits, writes the savepoint and kills the
topology; the query is stopped (its batch in flight uncommitted in Spark).  The topology is
submitted again ``--from-savepoint`` with the ledger's next version (a new value format,
``migrate_state``), and the *same* query restarts from its checkpoint: it replays the batch it
had not committed (whatever of it the savepoint holds is dropped as a replay) and goes on.
Every key's committed state must equal the answer over all the files, each row once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_storm.cluster.state import ClusterState
from spark_storm.state.files import EmbeddedBackend
from spark_storm.state.savepoint import Savepoint
from spark_storm.topology import plan
from tests.support import wait_until
from tests.support.cluster import FAST as CLUSTER_FAST
from tests.support.cluster import Daemons, checkpoints, cli, health, ports, running_workers, sets, submit
from tests.support.ledger import expected, ledger_topology, rows_for
from tests.support.spark import write_json_rows

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.spark,
    pytest.mark.timeout(600),
    pytest.mark.usefixtures("driver_sessions"),
]

FILES = 12
PER_FILE = 100
NAME = "ledgersp"


def _query(spark: Any, tmp: Path, zk: str) -> Any:
    return (
        spark.readStream.schema("key string, n long")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp / "src"))
        .writeStream.format("storm")
        .option("zookeeper", zk)
        .option("topology", NAME)
        .option("delivery", "processed")
        .option("checkpointLocation", str(tmp / "ck"))
        .trigger(availableNow=True)
        .start()
    )


def _files(tmp: Path) -> dict[int, list[list[Any]]]:
    """The stream's input: FILES json files of PER_FILE ledger rows in ``tmp/src``; returns the rows by file."""
    batches = {f: rows_for(f, PER_FILE) for f in range(FILES)}
    for f, rows in batches.items():
        write_json_rows(tmp / "src", [{"key": k, "n": n} for k, n in rows], files=1, prefix=f"part{f:03d}-")
    return batches


def _running(daemons: Daemons, state: ClusterState, zk: str, topology: Path) -> None:
    """A nimbus, a supervisor of two slots, and ``topology`` submitted and running on both."""
    daemons.nimbus()
    daemons.supervisor(ports(2)).wait_for("offering")
    submit(zk, topology, 2)
    running_workers(daemons, state, NAME, 2)


def _accepted(state: ClusterState) -> int:
    return sum(int(health(state, NAME, slot)["counters"]["source_tuples_in"]) for slot in state.read_heartbeats(NAME))


def test_kill_with_a_savepoint_then_an_upgraded_bolt_and_the_same_query_end_exact(
    spark: Any, daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    batches = _files(tmp_path)
    v1 = ledger_topology(tmp_path, name=NAME, conf={"ledger.delay.s": 0.01})
    source = yaml.safe_load(v1.read_text())
    next(c for c in source["components"] if c["id"] == "ledger")["bolt"] = (
        "tests.integration.savepoint_bolts:LedgerBoltV2"
    )
    v2 = tmp_path / "ledger-v2.yaml"
    v2.write_text(yaml.safe_dump(source))
    _running(daemons, state, zk, v1)

    q = _query(spark, tmp_path, zk)
    try:
        wait_until(
            lambda: max((c.get("committed", 0) for c in checkpoints(state, NAME).values()), default=0) >= 3,
            what="three micro-batches committed",
            timeout=180,
        )
        before = _accepted(state)
        wait_until(lambda: _accepted(state) > before, what="the next micro-batch under way", timeout=60)
        out = cli(
            "kill", NAME, "--savepoint", str(tmp_path / "sp"), "--wait", "0", "--zookeeper", zk, *sets(CLUSTER_FAST)
        )
        assert out.returncode == 0, out.stderr
    finally:
        q.stop()
    print(out.stdout.strip())
    path = re.search(r"at epoch \d+: (\S+)", out.stdout)
    assert path is not None, out.stdout
    saved = Savepoint.open(path.group(1), topology=NAME)
    print(
        f"savepoint: epoch {saved.manifest.epoch}, batches {saved.manifest.batches}, kept {len(saved.manifest.kept.get('in', []))}"
    )
    wait_until(lambda: state.find_topology(NAME) is None, what="the killed topology removed", timeout=60)

    # nothing the savepoint does not fit may start: a topology without the ledger is refused
    gone = yaml.safe_load(v1.read_text())
    gone["components"] = [c for c in gone["components"] if c["id"] != "ledger"]
    bad = tmp_path / "no-ledger.yaml"
    bad.write_text(yaml.safe_dump(gone))
    refused = cli("submit", str(bad), "--zookeeper", zk, "--from-savepoint", path.group(1), *sets(CLUSTER_FAST))
    assert refused.returncode == 2, refused.stderr
    line = next(x for x in refused.stderr.splitlines() if x.startswith("spark-storm: "))
    assert "'ledger'" in line, line
    assert "--allow-unmatched-state" in line, line

    up = cli(
        "submit", str(v2), "--workers", "2", "--zookeeper", zk, "--from-savepoint", path.group(1), *sets(CLUSTER_FAST)
    )
    assert up.returncode == 0, up.stderr
    running_workers(daemons, state, NAME, 2)
    q = _query(spark, tmp_path, zk)  # the same query, from its checkpoint
    try:
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
        assert not q.isActive, "the stream did not finish within 300s"
        cps = checkpoints(state, NAME)
    finally:
        q.stop()
    rollbacks = max(c.get("rollbacks", 0) for c in cps.values())
    replayed = sum(c.get("replayed_records", 0) for c in cps.values())
    print(
        f"after the upgrade: committed {max(c.get('committed', 0) for c in cps.values())}, {rollbacks} rollback(s), {replayed} records replayed"
    )
    assignment = state.read_assignment(NAME)
    assert assignment is not None
    the_plan = plan(state.read_topology(NAME).topology(), assignment.slots)
    backend = EmbeddedBackend(NAME, tmp_path / "state")
    got: dict[str, Any] = {}
    for task in the_plan.component_tasks["ledger"]:
        got.update(backend.task_store(task).restore()[1])
    want = {k: {"count": c, "sum": s} for k, (c, s) in expected(batches).items()}
    wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    assert not wrong, f"{len(wrong)} of {len(want)} keys wrong (got, want): {dict(list(wrong.items())[:5])}"
    assert set(got) == set(want)


def test_rebalance_executors_of_the_stateful_component_mid_stream_stays_exact(
    spark: Any, daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    """``spark-storm rebalance -e ledger=4``: the ledger's 4 tasks go from 2 executors to 4, live, exact."""
    batches = _files(tmp_path)
    topo = ledger_topology(tmp_path, name=NAME, conf={"ledger.delay.s": 0.01})
    _running(daemons, state, zk, topo)
    q = _query(spark, tmp_path, zk)
    try:
        wait_until(
            lambda: max((c.get("committed", 0) for c in checkpoints(state, NAME).values()), default=0) >= 3,
            what="three micro-batches committed",
            timeout=180,
        )
        taken = cli("savepoint", NAME, "--dir", str(tmp_path / "live"), "--zookeeper", zk, *sets(CLUSTER_FAST))
        assert taken.returncode == 0, taken.stderr  # the topology keeps running: a fork point
        found = re.search(r"savepoint of \S+ at epoch (\d+): (\S+)", taken.stdout)
        assert found is not None, taken.stdout
        live = Savepoint.open(found.group(2), topology=NAME)
        assert live.manifest.epoch == int(found.group(1)) >= 3
        assert live.manifest.components["ledger"].tasks == 4
        bad = cli("rebalance", NAME, "-e", "ledger=5", "--zookeeper", zk, *sets(CLUSTER_FAST))
        assert bad.returncode == 2, bad.stderr
        assert "executors must be 1 .. 4" in bad.stderr, bad.stderr
        out = cli("rebalance", NAME, "-e", "ledger=4", "--zookeeper", zk, *sets(CLUSTER_FAST))
        assert out.returncode == 0, out.stderr
        assert "ledger on 4 executors" in out.stdout, out.stdout
        wait_until(
            lambda: (
                (a := state.read_assignment(NAME)) is not None
                and sum(1 for e in a.executors if e.component == "ledger") == 4
            ),
            what="an assignment with 4 ledger executors",
            timeout=60,
        )
        moved_at = max(c.get("committed", 0) for c in checkpoints(state, NAME).values())
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
        assert not q.isActive, "the stream did not finish within 300s"
        cps = checkpoints(state, NAME)
    finally:
        q.stop()
    final = max(c.get("committed", 0) for c in cps.values())
    print(
        f"rebalance -e ledger=4: at epoch {moved_at}, {final} at the end; rollbacks {max(c.get('rollbacks', 0) for c in cps.values())}"
    )
    assert final > moved_at, "the stream ended before the rebalance took effect"
    assignment = state.read_assignment(NAME)
    assert assignment is not None
    the_plan = assignment.plan(state.read_topology(NAME).topology())
    assert len([e for e in the_plan.executors if e.component == "ledger"]) == 4
    backend = EmbeddedBackend(NAME, tmp_path / "state")
    got: dict[str, Any] = {}
    for task in the_plan.component_tasks["ledger"]:
        got.update({k: list(v) for k, v in backend.task_store(task).restore()[1].items()})
    want = expected(batches)
    wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    assert not wrong, f"{len(wrong)} of {len(want)} keys wrong (got, want): {dict(list(wrong.items())[:5])}"


def _committed(state: ClusterState) -> int:
    return max((c.get("committed", 0) for c in checkpoints(state, NAME).values()), default=0)


def _wait_committed(state: ClusterState, epoch: int) -> None:
    wait_until(lambda: _committed(state) >= epoch, what=f"epoch {epoch} committed", timeout=180)


def _ledger_tasks(path: Path, tasks: int, name: str) -> Path:
    """The ledger topology file with ``tasks`` ledger tasks (2 executors), written as ``name``."""
    source = yaml.safe_load(path.read_text())
    ledger = next(c for c in source["components"] if c["id"] == "ledger")
    ledger["tasks"] = tasks
    out = path.parent / name
    out.write_text(yaml.safe_dump(source))
    return out


def test_keyed_state_rescaled_from_4_to_6_to_3_tasks_while_the_same_query_streams_ends_exact(
    spark: Any, daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    """Two kill --savepoint mid-stream, restored at 6 tasks and then at 3; the one query restarts from its checkpoint."""
    batches = _files(tmp_path)
    base = ledger_topology(tmp_path, name=NAME, conf={"ledger.delay.s": 0.01})
    _running(daemons, state, zk, base)
    savepoint: str | None = None
    for step, tasks in enumerate((6, 3)):
        q = _query(spark, tmp_path, zk)
        try:
            _wait_committed(state, _committed(state) + 2)
            args = ["kill", NAME, "--savepoint", str(tmp_path / "sp"), "--wait", "0", "--zookeeper", zk]
            out = cli(*args, *sets(CLUSTER_FAST))
            assert out.returncode == 0, out.stderr
        finally:
            q.stop()
        found = re.search(r"at epoch \d+: (\S+)", out.stdout)
        assert found is not None, out.stdout
        savepoint = found.group(1)
        print(f"step {step}: {out.stdout.strip()}")
        wait_until(lambda: state.find_topology(NAME) is None, what="the killed topology removed", timeout=60)
        path = _ledger_tasks(base, tasks, f"ledger-{tasks}.yaml")
        up = cli(
            "submit", str(path), "--workers", "2", "--zookeeper", zk, "--from-savepoint", savepoint, *sets(CLUSTER_FAST)
        )
        assert up.returncode == 0, up.stderr
        running_workers(daemons, state, NAME, 2)
    q = _query(spark, tmp_path, zk)  # the same query, from its checkpoint, to the end of its files
    try:
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
        assert not q.isActive, "the stream did not finish within 300s"
        cps = checkpoints(state, NAME)
    finally:
        q.stop()
    print(
        f"at 3 tasks: committed {max(c.get('committed', 0) for c in cps.values())}, "
        f"{max(c.get('rollbacks', 0) for c in cps.values())} rollback(s), "
        f"{sum(c.get('replayed_records', 0) for c in cps.values())} records replayed"
    )
    assignment = state.read_assignment(NAME)
    assert assignment is not None
    the_plan = assignment.plan(state.read_topology(NAME).topology())
    assert len(the_plan.component_tasks["ledger"]) == 3
    backend = EmbeddedBackend(NAME, tmp_path / "state")
    got: dict[str, Any] = {}
    for task in the_plan.component_tasks["ledger"]:
        for key, value in backend.task_store(task).restore()[1].items():
            assert key not in got, f"{key} is in two tasks' state"
            got[key] = list(value)
    want = expected(batches)
    wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    assert not wrong, f"{len(wrong)} of {len(want)} keys wrong (got, want): {dict(list(wrong.items())[:5])}"
    assert set(got) == set(want)
