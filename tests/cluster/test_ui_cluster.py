"""The Storm UI over a real cluster: nimbus serves it, supervisors launch real workers, ZooKeeper is real.

A plain HTTP client reads the REST API of two nimbus processes (the leader and the other
one) and of a standalone ``spark-storm ui --zookeeper``, and presses the topology actions
through it; every answer is checked against ZooKeeper and the workers' own ``/health``.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import msgpack
import pytest

from spark_storm.cluster.state import ClusterState
from spark_storm.messaging import TaskMessage
from spark_storm.topology import Slot, load_topology
from spark_storm.transport import make_context
from tests.support import ROOT, wait_until, wordcount
from tests.support.cluster import (
    UI_FAST,
    Api,
    Daemons,
    cli,
    health,
    nimbus_with_ui,
    ports,
    running_workers,
    sets,
    submit,
    wait_gone,
)

pytestmark = pytest.mark.cluster

COUNTS: tuple[Literal["executed", "emitted", "acked", "failed"], ...] = ("executed", "emitted", "acked", "failed")


def _other_nimbus(state: ClusterState, leader: str) -> str:
    (other,) = [c.id for c in state.nimbus_contenders() if c.id != leader]
    return other


def _health_totals(state: ClusterState, topology: str) -> dict[str, dict[str, int]]:
    """Per component counts summed straight from every worker's own /health."""
    out: dict[str, dict[str, int]] = {}
    for slot in state.read_heartbeats(topology):
        for ex in health(state, topology, slot)["executors"].values():
            acc = out.setdefault(ex["component"], dict.fromkeys(COUNTS, 0))
            for t in ex["tasks"].values():
                for k in COUNTS:
                    acc[k] += t[k]
    return out


def _ui_totals(api: Api, topology: str) -> dict[str, dict[str, int]]:
    return {cid: {k: c[k] for k in COUNTS} for cid, c in api.components(topology).items()}


def _send(state: ClusterState, path: Path, sentences: int) -> Slot:
    """Send ``sentences`` to the first source task's worker; return that worker's slot."""
    assignment = state.read_assignment("wordcount")
    assert assignment is not None
    plan = assignment.plan(load_topology(path))
    task = plan.component_tasks["sentences"].start
    slot = plan.task_slot[task]
    ctx = make_context({})
    try:
        client = ctx.connect("wordcount", slot.host, slot.port)
        client.send([TaskMessage(task, msgpack.packb(["the cat and the hat"])) for _ in range(sentences)])
        assert client.flush(30)
    finally:
        ctx.term()
    return slot


def test_nimbus_serves_the_ui_and_its_actions_change_the_cluster(
    daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    leader_daemon, ui = nimbus_with_ui(daemons)
    leader_daemon.wait_for("is the leader")
    other_daemon, other = nimbus_with_ui(daemons)  # not the leader: serves the same state
    sup = daemons.supervisor(ports(3), sid="sup-a")
    sup.wait_for("offering")
    path = wordcount(tmp_path)
    submit(zk, path, 2)
    pids = running_workers(daemons, state, "wordcount", 2)
    assignment = state.read_assignment("wordcount")
    assert assignment is not None
    leader = state.nimbus_leader()
    assert leader is not None
    assert leader.endswith(f":{leader_daemon.pid}")

    # ---- summaries, from both nimbus processes
    def summarised(api: Api) -> bool:
        """Both workers listed and read (a worker's first heartbeat may precede its HTTP endpoint)."""
        row = api.topology_row("wordcount")
        if row is None or row["workersTotal"] != 2 or api.get("cluster/summary")["slotsUsed"] != 2:
            return False
        return {w["status"] for w in api.get("topology/wordcount")["workers"]} == {"active"}

    for api in (ui, other):
        wait_until(functools.partial(summarised, api), what="the UI to see both workers", timeout=30)
        summary = api.get("cluster/summary")
        assert summary["clusterKind"] == "cluster"
        assert zk in summary["source"]
        assert summary["nimbusLeader"] == leader
        assert (summary["supervisors"], summary["topologies"]) == (1, 1)
        assert (summary["slotsTotal"], summary["slotsUsed"], summary["slotsFree"]) == (3, 2, 1)
        # sentences 2 executors/2 tasks, split 2/4, count 2/4, report 1/1
        assert (summary["executorsTotal"], summary["tasksTotal"]) == (7, 11)
        nimbuses = api.get("nimbus/summary")["nimbuses"]
        assert [(n["id"], n["status"]) for n in nimbuses] == [
            (leader, "Leader"),
            (_other_nimbus(state, leader), "Not a Leader"),
        ]
        assert [n["pid"] for n in nimbuses] == [leader_daemon.pid, other_daemon.pid]
        assert all(n["nimbusUpTimeSeconds"] >= 0 for n in nimbuses)
        sups = api.get("supervisor/summary")
        assert [(s["id"], s["host"], s["slotsTotal"], s["slotsUsed"], s["slotsFree"]) for s in sups["supervisors"]] == [
            ("sup-a", "127.0.0.1", 3, 2, 1)
        ]
        assert sorted(w["id"] for w in sups["workers"]) == sorted(map(str, assignment.slots))
        assert {w["supervisorId"] for w in sups["workers"]} == {"sup-a"}
        row = api.topology_row("wordcount")
        assert row is not None
        assert (row["status"], row["assignmentVersion"], row["workersRequested"]) == ("ACTIVE", 1, 2)
        assert isinstance(row["uptimeSeconds"], int)
        workers = api.get("topology/wordcount")["workers"]
        assert {w["id"]: w["pid"] for w in workers} == pids

    # ---- a standalone `spark-storm ui --zookeeper` reads the same cluster
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_storm.cli", "ui", "--zookeeper", zk, "--port", "0", *sets(UI_FAST)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("spark-storm UI on http://"), line
        assert f"cluster: ZooKeeper {zk}" in line
        standalone = Api(line.split("UI on ")[1].split(" ")[0])
        assert standalone.get("cluster/summary")["nimbusLeader"] == leader
        wait_until(lambda: summarised(standalone), what="the standalone UI to see both workers", timeout=30)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 0

    # ---- a topology's components: the same counts as the workers' own /health
    _send(state, path, 50)
    wait_until(
        lambda: _ui_totals(ui, "wordcount").get("count", {}).get("executed") == 250,
        what="250 words counted per the UI",
        timeout=30,
    )
    wait_until(
        lambda: _ui_totals(ui, "wordcount") == _health_totals(state, "wordcount"),
        what="the UI's counts to equal the workers' /health",
        timeout=15,
    )
    comps = ui.components("wordcount")
    assert [c for c, v in comps.items() if v["type"] == "source"] == ["sentences"]
    assert (comps["sentences"]["executed"], comps["split"]["executed"], comps["report"]["executed"]) == (50, 50, 250)

    # ---- deactivate through the API: the status in ZooKeeper, the bolts pause
    assert ui.post("topology/wordcount/deactivate") == (
        200,
        {"topologyOperation": "deactivate", "topologyId": "wordcount", "status": "success"},
    )
    record = state.find_topology("wordcount")
    assert record is not None
    assert record.status == "inactive"
    assert ui.status("wordcount") == "INACTIVE"
    wait_until(
        lambda: all(not health(state, "wordcount", s)["active"] for s in assignment.slots), what="both workers paused"
    )
    _send(state, path, 30)  # accepted into the source's queue, not executed
    wait_until(
        lambda: ui.components("wordcount")["sentences"]["queuePopulation"] == 30,
        what="30 sentences queued at the paused source",
        timeout=15,
    )
    assert {c: v["executed"] for c, v in ui.components("wordcount").items()} == {
        "sentences": 50,
        "split": 50,
        "count": 250,
        "report": 250,
    }

    # ---- activate: the status back, the queued sentences go through
    status, body = ui.post("topology/wordcount/activate")
    assert (status, body["topologyOperation"]) == (200, "activate")
    record = state.find_topology("wordcount")
    assert record is not None
    assert record.status == "active"
    wait_until(
        lambda: _ui_totals(ui, "wordcount").get("report", {}).get("executed") == 400,
        what="the 30 held sentences through to the report bolt",
        timeout=30,
    )
    assert ui.status("wordcount") == "ACTIVE"

    # ---- rebalance through the API (Storm's rebalanceOptions.numWorkers): a new assignment version
    assert ui.post("topology/wordcount/rebalance/0", {"rebalanceOptions": {"numWorkers": 0}})[0] == 400
    status, body = ui.post("topology/wordcount/rebalance/0")
    assert status == 400
    assert "numWorkers" in body["errorMessage"]
    status, body = ui.post("topology/wordcount/rebalance/0", {"rebalanceOptions": {"executors": {"split": 99}}})
    assert status == 400  # Storm's rebalanceOptions.executors: within the component's task count
    assert "executors must be 1 .." in body["errorMessage"]
    assert ui.post("topology/nope/rebalance/0", {"rebalanceOptions": {"numWorkers": 2}})[0] == 404
    current = state.read_assignment("wordcount")
    assert current is not None
    assert current.version == 1  # none of the refused requests changed anything
    status, body = ui.post("topology/wordcount/rebalance/0", {"rebalanceOptions": {"numWorkers": 3}})
    assert (status, body["topologyOperation"]) == (200, "rebalance")
    wait_until(
        lambda: (a := state.read_assignment("wordcount")) is not None and a.version == 2 and len(a.slots) == 3,
        what="assignment v2 with 3 slots",
        timeout=30,
    )
    third = running_workers(daemons, state, "wordcount", 3)
    wait_until(
        lambda: (
            (row := ui.topology_row("wordcount")) is not None
            and (row["assignmentVersion"], row["workersRequested"], row["workersTotal"]) == (2, 3, 3)
        ),
        what="the UI to show v2 with 3 workers",
        timeout=30,
    )
    summary = ui.get("cluster/summary")
    assert (summary["slotsUsed"], summary["slotsFree"]) == (3, 0)

    # ---- kill through the API: killed in ZooKeeper at once, the workers stop, removed after the wait
    status, body = ui.post("topology/wordcount/kill/6")
    assert (status, body["topologyOperation"]) == (200, "kill")
    record = state.find_topology("wordcount")
    assert record is not None
    assert record.status == "killed"
    assert record.kill_at is not None
    assert record.kill_at - time.time() > 2
    assert ui.status("wordcount") == "KILLED"
    status, body = ui.post("topology/wordcount/activate")
    assert status == 502
    assert "being killed" in body["errorMessage"]
    wait_gone(list(third.values()), "the killed topology's workers")
    wait_until(lambda: ui.topology_row("wordcount") is None, what="the topology removed after its wait", timeout=30)
    assert state.topology_names() == []
    assert ui.get("cluster/summary")["slotsUsed"] == 0


def test_ui_command_errors_are_one_clear_line(zk: str, tmp_path: Path) -> None:
    out = cli("ui", "--zookeeper", zk, "--heartbeat-dir", str(tmp_path), "--port", "0")
    assert out.returncode == 2
    assert "--zookeeper and --heartbeat-dir exclude each other" in out.stderr
    assert "Traceback" not in out.stderr
    nobody = f"127.0.0.1:{ports(1)[0]}"
    out = cli("ui", "--zookeeper", nobody, "--port", "0", "--set", "storm.zookeeper.connection.timeout=1000")
    assert out.returncode == 2
    assert f"spark-storm: cannot connect to ZooKeeper at {nobody} within 1s" in out.stderr
    assert "Traceback" not in out.stderr
