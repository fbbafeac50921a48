"""The worker in cluster mode: plan, status and heartbeats from ZooKeeper, followed while it runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml

from spark_storm.cluster.records import ACTIVE, INACTIVE, KILLED, Assignment, TopologyRecord
from spark_storm.cluster.state import ClusterState
from spark_storm.config import load_config
from spark_storm.messaging import TaskMessage
from spark_storm.netutil import free_ports
from spark_storm.topology import Slot, plan, topology_from_dict
from spark_storm.transport import make_context
from spark_storm.worker.zk_worker import ZooKeeperWorker
from tests.support import wait_until, wordcount
from tests.support.cluster import (
    FAST,
    Daemons,
    alive,
    cli,
    expire_session,
    health,
    ports,
    running_workers,
    sets,
    submit,
    wait_gone,
    worker_pids,
)

pytestmark = pytest.mark.cluster

NAME = "cw"


def _topology_dict(record_dir: Path) -> dict[str, Any]:
    return {
        "name": NAME,
        "conf": {"record.dir": str(record_dir), "record.per.instance": True},
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": 2, "tasks": 2},
            {
                "id": "out",
                "bolt": "tests.integration.bolts:RecordingBolt",
                "parallelism": 2,
                "inputs": [{"from": "in"}],
            },
        ],
    }


def _executed(worker: ZooKeeperWorker, component: str) -> int:
    assert worker.worker is not None
    total = 0
    for m in worker.worker.metrics()["executors"].values():
        if m["component"] == component:
            total += sum(t["executed"] for t in m["tasks"].values())
    return total


@pytest.fixture
def submitted(state: ClusterState, tmp_path: Path) -> tuple[ClusterState, Any]:
    """The topology in ZooKeeper (no nimbus: the tests write the assignments themselves)."""
    (tmp_path / "records").mkdir()
    source = _topology_dict(tmp_path / "records")
    state.submit_topology(TopologyRecord(NAME, yaml.safe_dump(source), ACTIVE, 1))
    return state, topology_from_dict(source)


def _conf(tmp_path: Path) -> Any:
    return load_config(
        None,
        {
            **FAST,
            "topology.worker.metrics.port": -1,
            "worker.heartbeat.dir": str(tmp_path),
            "worker.heartbeat.frequency.secs": 0.2,
            "storm.messaging.tcp.min_wait_ms": 20,
        },
    )


def test_a_cluster_worker_follows_assignments_status_and_survives_a_lost_session(
    submitted: tuple[ClusterState, Any], zk: str, zookeeper: str, tmp_path: Path
) -> None:
    state, topo = submitted
    a, b = (Slot("127.0.0.1", p) for p in sorted(free_ports(2)))
    state.write_assignment(Assignment.from_plan(plan(topo, [a]), 1))
    wa = ZooKeeperWorker(zk, NAME, a, _conf(tmp_path))
    wb = ZooKeeperWorker(zk, NAME, b, _conf(tmp_path))
    ctx = make_context({"storm.messaging.tcp.min_wait_ms": 20})
    try:
        wa.start()
        assert wa.worker is not None
        assert sorted(map(str, wa.worker.executors)) == ["in[1-1]", "in[2-2]", "out[3-3]", "out[4-4]"]
        wait_until(lambda: wa.worker is not None and wa.worker.active, what="A active")
        # its own heartbeats, in ZooKeeper, with the assignment version it runs
        wait_until(
            lambda: (hb := state.read_heartbeats(NAME).get(a)) is not None and hb.record["status"] == "running",
            what="A's ZooKeeper heartbeat saying running",
        )
        hb = state.read_heartbeats(NAME)[a]
        assert hb.record["assignment_version"] == 1
        assert hb.record["pid"] == os.getpid()
        conn = ctx.connect(NAME, a.host, a.port)

        def send(n: int, start: int) -> None:
            conn.send([TaskMessage(1, msgpack.packb([f"k{i}", i])) for i in range(start, start + n)])
            assert conn.flush(30)

        send(50, 0)
        wait_until(lambda: _executed(wa, "out") == 50, what="50 tuples through in -> out")

        # RefreshActive: inactive pauses the executors, active resumes them (same worker)
        state.set_status(NAME, INACTIVE)
        wait_until(lambda: not wa.worker.active, what="A paused by the status watch")  # type: ignore[union-attr]
        send(20, 50)
        wait_until(lambda: wa.worker.counters["source_tuples_in"] == 70, what="20 more queued")  # type: ignore[union-attr]
        assert _executed(wa, "in") == 50  # queued, not run while inactive
        state.set_status(NAME, ACTIVE)
        wait_until(lambda: _executed(wa, "out") == 70, what="the 20 run once active again")

        # a lost ZooKeeper session: reconnected, heartbeats resume, the bolts never stopped
        old_session = wa.state.session.session_id()
        expire_session(wa.state, zookeeper)
        wait_until(
            lambda: wa.state.session.connected and wa.state.session.session_id() not in (None, old_session),
            what="A's new ZooKeeper session",
            timeout=30,
        )
        assert wa.state.session.session_losses == 1
        assert not wa.stopping.is_set()
        version_after = state.read_heartbeats(NAME)[a].version
        wait_until(lambda: state.read_heartbeats(NAME)[a].version > version_after + 2, what="heartbeats resumed")
        send(10, 70)
        wait_until(lambda: _executed(wa, "out") == 80, what="tuples still processed after the loss")

        # RefreshConnections on the new session: v2 moves half the executors to B
        v2 = plan(topo, [a, b])
        state.write_assignment(Assignment.from_plan(v2, 2))
        wb.start()
        assert wb.worker is not None
        wait_until(lambda: wa.version == 2 and wa.worker is not None, what="A following v2")
        assert sorted(map(str, wa.worker.executors)) == sorted(map(str, v2.executors_of(a)))
        assert sorted(map(str, wb.worker.executors)) == sorted(map(str, v2.executors_of(b)))
        wait_until(lambda: state.read_heartbeats(NAME)[a].record["assignment_version"] == 2, what="A's hb says v2")
        send(40, 80)

        # v3 leaves A out: A runs its ordered shutdown by itself, not as a failure
        state.write_assignment(Assignment.from_plan(plan(topo, [b]), 3))
        wait_until(lambda: wa.stopping.is_set(), what="A stopping once v3 leaves it out")
        assert not wa.failed
        assert wa.stop(30)
        wait_until(lambda: wb.version == 3 and wb.worker is not None and len(wb.worker.executors) == 4, what="B on v3")

        # killed: B stops too
        state.set_status(NAME, KILLED, kill_at=0.0)
        wait_until(lambda: wb.stopping.is_set(), what="B stopping on kill")
        assert not wb.failed
        assert wb.stop(30)
    finally:
        ctx.term()
        for w in (wa, wb):
            w.stop(30)
    # every tuple reached a RecordingBolt of 'out' (records written at each cleanup, moves included)
    records = [json.loads(f.read_text()) for f in (tmp_path / "records").glob("out-*.json")]
    assert sum(r["count"] for r in records) == 120


def test_worker_command_errors_are_one_clear_line(submitted: tuple[ClusterState, Any], zk: str) -> None:
    state, topo = submitted
    port = free_ports(1)[0]
    out = cli("worker", "--zookeeper", zk, "--topology-id", "nope", "--port", str(port), *sets(FAST))
    assert out.returncode == 2
    assert f"no topology 'nope' in ZooKeeper {zk}" in out.stderr
    other = Slot("127.0.0.1", free_ports(1)[0])
    state.write_assignment(Assignment.from_plan(plan(topo, [other]), 1))
    out = cli(
        "worker",
        *("--zookeeper", zk, "--topology-id", NAME, "--port", str(port)),
        *sets({**FAST, "worker.assignment.timeout.secs": 0.5}),
    )
    assert out.returncode == 2
    assert f"worker 127.0.0.1:{port}: no assignment of topology '{NAME}'" in out.stderr
    assert f"assignment v1 has slots {other}" in out.stderr
    out = cli("worker", "--zookeeper", zk, "--topology", "x.yaml", "--port", str(port))
    assert out.returncode == 2
    assert "exclude each other" in out.stderr
    out = cli("worker", "--port", str(port))
    assert out.returncode == 2
    assert "give --topology FILE (static mode) or --zookeeper ZK --topology-id NAME" in out.stderr


def test_supervised_workers_pause_resume_rebalance_in_place_and_stop_on_kill(
    daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    daemons.nimbus()
    sup = daemons.supervisor(ports(3))
    sup.wait_for("offering")
    submit(zk, wordcount(tmp_path), 2)
    first = running_workers(daemons, state, "wordcount", 2)
    v1 = state.read_assignment("wordcount")
    assert v1 is not None
    # deactivate / activate reach the running workers (no restart)
    assert cli("deactivate", "wordcount", "--zookeeper", zk, *sets(FAST)).returncode == 0
    wait_until(lambda: all(not health(state, "wordcount", s)["active"] for s in v1.slots), what="both workers paused")
    assert cli("activate", "wordcount", "--zookeeper", zk, *sets(FAST)).returncode == 0
    wait_until(lambda: all(health(state, "wordcount", s)["active"] for s in v1.slots), what="both workers active")
    # rebalance to 3: the two running workers follow v2 in place, a third starts
    assert cli("rebalance", "wordcount", "--workers", "3", "--zookeeper", zk, *sets(FAST)).returncode == 0
    wait_until(
        lambda: (a := state.read_assignment("wordcount")) is not None and len(a.slots) == 3,
        what="v2 with 3 slots",
        timeout=30,
    )
    v2 = state.read_assignment("wordcount")
    assert v2 is not None
    second = running_workers(daemons, state, "wordcount", 3)
    wait_until(
        lambda: all(
            hb.record.get("assignment_version") == v2.version for hb in state.read_heartbeats("wordcount").values()
        ),
        what="every worker on v2",
        timeout=30,
    )
    for name, pid in first.items():
        assert second[name] == pid  # not restarted
    for slot, hb in state.read_heartbeats("wordcount").items():
        assert sorted(hb.record["executors"]) == sorted(map(str, v2.executors_of(slot)))
    # kill with a long wait: the workers stop now, the name stays until the wait ends
    out = cli("kill", "wordcount", "--wait", "120", "--zookeeper", zk, *sets(FAST))
    assert out.returncode == 0, out.stderr
    assert "its workers stop now" in out.stdout
    wait_gone(list(second.values()), "the killed topology's workers")
    record = state.find_topology("wordcount")
    assert record is not None
    assert record.status == KILLED
    assert sup.output().count("started worker") == 3  # nothing restarted after the kill
    assert not [p for p in worker_pids(state, "wordcount").values() if alive(p)]
