"""Supervisors as real processes: they launch real workers, restart a killed one, stop them all."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import pytest

from spark_storm.cluster.state import ClusterState
from spark_storm.messaging import TaskMessage
from spark_storm.topology import Slot, load_topology
from spark_storm.transport import make_context
from tests.cluster.conftest import FAST, Daemons, alive, cli, sets, wait_gone, wordcount, worker_pids
from tests.helpers import wait_until

pytestmark = pytest.mark.cluster


def _running(daemons: Daemons, state: ClusterState, topology: str, slots: int) -> dict[str, int]:
    """Wait until ``slots`` workers of ``topology`` heartbeat "running" into ZooKeeper; their pids."""

    def ready() -> bool:
        hbs = state.read_heartbeats(topology)
        a = state.read_assignment(topology)
        return (
            a is not None
            and len(hbs) == slots
            and set(hbs) == set(a.slots)
            and all(hb.record.get("status") == "running" and alive(int(hb.record["pid"])) for hb in hbs.values())
        )

    wait_until(ready, what=f"{slots} running workers of {topology}", timeout=90)
    pids = worker_pids(state, topology)
    daemons.track(pids.values())
    return pids


def _submit(zk: str, path: Path, workers: int) -> None:
    out = cli("submit", str(path), "--workers", str(workers), "--zookeeper", zk, *sets(FAST))
    assert out.returncode == 0, out.stderr


def _health(state: ClusterState, topology: str, slot: Slot) -> dict[str, Any]:
    port = state.read_heartbeats(topology)[slot].record["metrics_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
        data: dict[str, Any] = json.loads(r.read())
        return data


def test_supervisor_runs_assigned_workers_restarts_a_killed_one_and_stops_them_on_kill(
    daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    daemons.nimbus()
    sup = daemons.supervisor(_ports(2))
    sup.wait_for("offering")
    path = wordcount(tmp_path)
    _submit(zk, path, 2)
    pids = _running(daemons, state, "wordcount", 2)
    assignment = state.read_assignment("wordcount")
    assert assignment is not None
    # the workers really run the topology: tuples sent to a source task are processed
    topo = load_topology(path)
    plan = assignment.plan(topo)
    source_task = plan.component_tasks["sentences"].start
    slot = plan.task_slot[source_task]
    ctx = make_context({})
    client = ctx.connect("wordcount", slot.host, slot.port)
    client.send([TaskMessage(source_task, msgpack.packb(["the cat and the hat"])) for _ in range(50)])
    assert client.flush(30)
    ctx.term()
    wait_until(
        lambda: _health(state, "wordcount", slot)["counters"]["source_tuples_in"] == 50,
        what="50 tuples into the source",
    )
    # SIGKILL one worker: the supervisor starts a new one on the same slot
    victim_slot, victim = sorted(pids.items())[0]
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: (p := worker_pids(state, "wordcount").get(victim_slot)) not in (None, victim) and alive(p),
        what="a new worker on the killed one's slot",
        timeout=60,
    )
    assert "exited with -9; restarting it" in sup.output()
    new_pids = _running(daemons, state, "wordcount", 2)
    # kill the topology: its workers stop (ordered shutdown), the topology is gone
    out = cli("kill", "wordcount", "--wait", "0", "--zookeeper", zk, *sets(FAST))
    assert out.returncode == 0, out.stderr
    wait_gone(list(new_pids.values()), "the killed topology's workers")
    wait_until(lambda: state.topology_names() == [], what="the topology removed")
    assert sup.proc.poll() is None  # the supervisor itself runs on


def _ports(n: int) -> list[int]:
    from spark_storm.netutil import free_ports

    return free_ports(n)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_supervisor_leaves_no_worker_behind(
    daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path, signum: int
) -> None:
    daemons.nimbus()
    sup = daemons.supervisor(_ports(2))
    sup.wait_for("offering")
    _submit(zk, wordcount(tmp_path), 2)
    pids = list(_running(daemons, state, "wordcount", 2).values())
    sup.signal(signum)
    assert sup.proc.wait(60) == 0
    assert not [p for p in pids if alive(p)]  # gone by the time the supervisor exits
    assert "stopped worker" in sup.output()
    assert state.supervisors() == {}


def test_a_sigkilled_supervisor_still_takes_its_workers_down(
    daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    daemons.nimbus()
    sup = daemons.supervisor(_ports(2))
    sup.wait_for("offering")
    _submit(zk, wordcount(tmp_path), 2)
    pids = list(_running(daemons, state, "wordcount", 2).values())
    sup.proc.send_signal(signal.SIGKILL)
    sup.proc.wait(10)
    wait_gone(pids, "workers of the SIGKILLed supervisor (parent-death signal)")


def test_when_a_supervisor_dies_its_workers_move_to_another(
    daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    daemons.nimbus()
    a = daemons.supervisor(_ports(2), sid="a")
    b = daemons.supervisor(_ports(2), sid="b")
    a.wait_for("offering")
    b.wait_for("offering")
    _submit(zk, wordcount(tmp_path), 2)
    before = _running(daemons, state, "wordcount", 2)
    v1 = state.read_assignment("wordcount")
    assert v1 is not None
    sups = state.supervisors()
    assert {s.port for s in v1.slots} & {s.port for s in sups["a"].slots}  # spread over both
    assert {s.port for s in v1.slots} & {s.port for s in sups["b"].slots}
    a_slots = set(sups["a"].slots)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    wait_until(
        lambda: (v := state.read_assignment("wordcount")) is not None and not set(v.slots) & a_slots,
        what="a new assignment without supervisor a's slots",
        timeout=30,
    )
    after = _running(daemons, state, "wordcount", 2)
    v2 = state.read_assignment("wordcount")
    assert v2 is not None
    assert v2.version > v1.version
    assert set(v2.slots) <= set(sups["b"].slots)
    assert not [p for s, p in before.items() if s in {str(x) for x in a_slots} and alive(p)]
    assert set(after) == {str(s) for s in v2.slots}
