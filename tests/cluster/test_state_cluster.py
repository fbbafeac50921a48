"""Exact state in cluster mode: a keyed ledger fed by Spark through ZooKeeper, rebalanced 2 -> 3 mid-stream.

The ledger topology is submitted to nimbus (embedded state: every worker of this host shares
the state dir), a Spark stream writes into it with option("zookeeper") at
delivery=processed, and a ``rebalance`` moves executors between workers (stateful ones and
a source task among them) while the stream runs.  The committed [count, sum] of every key
must equal the answer computed from the files; the test prints the rollbacks and replays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spark_storm.cluster.state import ClusterState
from spark_storm.topology import plan
from tests.support import wait_until
from tests.support.cluster import FAST as CLUSTER_FAST
from tests.support.cluster import Daemons, checkpoints, cli, health, ports, running_workers, sets, submit
from tests.support.ledger import expected, ledger_state, ledger_topology, rows_for
from tests.support.spark import write_json_rows

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.spark,
    pytest.mark.timeout(600),
    pytest.mark.usefixtures("driver_sessions"),
]

FILES = 14
PER_FILE = 120


def _accepted(state: ClusterState, name: str) -> int:
    """Rows the workers' source tasks accepted from Spark so far."""
    return sum(int(health(state, name, slot)["counters"]["source_tuples_in"]) for slot in state.read_heartbeats(name))


def test_ledger_is_exact_through_a_rebalance_from_two_to_three_workers(
    spark: Any, daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    name = "ledgerzk"
    batches = {f: rows_for(f, PER_FILE) for f in range(FILES)}
    for f, rows in batches.items():
        write_json_rows(tmp_path / "src", [{"key": k, "n": n} for k, n in rows], files=1, prefix=f"part{f:03d}-")
    # 3 source tasks: the rebalance moves one of them, and both ledger executors, to other workers
    topo = ledger_topology(
        tmp_path,
        name=name,
        sources=3,
        conf={"ledger.delay.s": 0.01, "topology.message.timeout.secs": 30},  # a batch: ~1 s at the ledger
    )
    daemons.nimbus()
    daemons.supervisor(ports(3)).wait_for("offering")
    submit(zk, topo, 2)
    running_workers(daemons, state, name, 2)
    q = (
        spark.readStream.schema("key string, n long")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "src"))
        .writeStream.format("storm")
        .option("zookeeper", zk)
        .option("topology", name)
        .option("delivery", "processed")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        wait_until(
            lambda: max((c.get("committed", 0) for c in checkpoints(state, name).values()), default=0) >= 3,
            what="three micro-batches committed",
            timeout=180,
        )
        before = _accepted(state, name)
        wait_until(lambda: _accepted(state, name) > before, what="the next micro-batch under way", timeout=60)
        assert cli("rebalance", name, "--workers", "3", "--zookeeper", zk, *sets(CLUSTER_FAST)).returncode == 0
        running_workers(daemons, state, name, 3)
        rebalanced_at = max(c.get("committed", 0) for c in checkpoints(state, name).values())
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
        assert not q.isActive, "the stream did not finish within 300s"
        cps = checkpoints(state, name)
    finally:
        q.stop()
    assignment = state.read_assignment(name)
    assert assignment is not None
    assert assignment.version >= 2
    final = max(c.get("committed", 0) for c in cps.values())
    rollbacks = max(c.get("rollbacks", 0) for c in cps.values())
    replayed = sum(c.get("replayed_records", 0) for c in cps.values())
    print(
        f"rebalance 2->3: committed epoch {rebalanced_at} when the 3 workers ran, {final} at the end; "
        f"{rollbacks} rollback(s), {replayed} input-log records replayed"
    )
    assert final > rebalanced_at, "the stream ended before the rebalance took effect"
    assert rollbacks >= 1  # executors moved: their uncommitted effects were rolled back and replayed
    topology = state.read_topology(name).topology()
    the_plan = plan(topology, assignment.slots)
    got = ledger_state(tmp_path / "state", name, the_plan)
    want = expected(batches)
    wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    assert not wrong, f"{len(wrong)} of {len(want)} keys wrong (got, want): {dict(list(wrong.items())[:5])}"
    assert set(got) == set(want)
