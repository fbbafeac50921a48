"""Windows in cluster mode: sliding event-time windows per user, rebalanced 2 -> 3 workers mid-window.

The windowed topology (tests/support/windows.py) is submitted to nimbus (embedded state: the
workers of this host share the state dir), a Spark stream writes into it with
option("zookeeper") at delivery=processed, and a ``rebalance`` moves executors — windowed
ones among them — while windows are open.  Every committed window must equal Spark's
``window()`` count of the same rows, and none may have been emitted twice with other values.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from spark_storm.cluster.state import ClusterState
from spark_storm.topology import plan
from tests.support import wait_until
from tests.support.cluster import FAST as CLUSTER_FAST
from tests.support.cluster import Daemons, checkpoints, cli, health, ports, running_workers, sets, submit
from tests.support.spark import write_json_rows
from tests.support.windows import flush_rows, rows_of, spark_windows, window_results, window_topology

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.spark,
    pytest.mark.timeout(600),
    pytest.mark.usefixtures("driver_sessions"),
]

FILES = 12
SLIDING = {"length": "6s", "sliding": "2s", "timestamp_field": "ts", "lag": "3s", "key": "user"}


def _windows_fired(state: ClusterState, name: str) -> int:
    fired = 0
    for slot in state.read_heartbeats(name):
        for ex in health(state, name, slot)["executors"].values():
            windows = ex.get("windows")
            fired += windows["windows"] if windows is not None else 0
    return fired


def test_windows_are_exact_through_a_rebalance_from_two_to_three_workers(
    spark: Any, daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    name = "windowszk"
    batches = {f: rows_of(f, 300) for f in range(FILES)}
    batches[FILES] = flush_rows(FILES)
    for f, rows in batches.items():
        write_json_rows(
            tmp_path / "src", [{"ts": t, "user": u, "v": v} for t, u, v in rows], files=1, prefix=f"part{f:03d}-"
        )
    # Spark's file source takes the oldest file first: increasing modification times make the
    # micro-batches come in event-time order, as a stream's would (equal ones come in any order)
    for i, path in enumerate(sorted((tmp_path / "src").iterdir())):
        os.utime(path, (1_700_000_000 + i * 10, 1_700_000_000 + i * 10))
    topo = window_topology(tmp_path, SLIDING, name=name)
    daemons.nimbus()
    daemons.supervisor(ports(3)).wait_for("offering")
    submit(zk, topo, 2)
    running_workers(daemons, state, name, 2)
    q = (
        spark.readStream.schema("ts long, user string, v long")
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
        wait_until(lambda: _windows_fired(state, name) > 0, what="the first windows fired", timeout=180)
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
    print(
        f"windows rebalance 2->3: committed epoch {rebalanced_at} at the move, {final} at the end; {rollbacks} rollbacks"
    )
    assert final > rebalanced_at, "the stream ended before the rebalance took effect"
    got, conflicts = window_results(
        tmp_path / "state", name, plan(state.read_topology(name).topology(), assignment.slots)
    )
    rows = [r for f, rs in batches.items() if f < FILES for r in rs]
    want = spark_windows(rows, 6000, 2000)
    wrong = {w: (got.get(w), n) for w, n in want.items() if got.get(w) != n}
    assert not wrong, f"{len(wrong)} of {len(want)} windows wrong (got, want): {dict(list(wrong.items())[:5])}"
    assert set(got) == set(want)
    assert conflicts == 0, "a window was emitted again with other values"
