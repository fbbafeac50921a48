"""Supervisors as real processes: they launch real workers, restart a killed one, stop them all."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import msgpack
import pytest

from spark_storm.cluster.state import ClusterState
from spark_storm.messaging import TaskMessage
from spark_storm.topology import load_topology
from spark_storm.transport import make_context
from tests.support import wait_until, wordcount
from tests.support.cluster import (
    FAST,
    Daemons,
    alive,
    cli,
    health,
    ports,
    running_workers,
    sets,
    submit,
    wait_gone,
    worker_pids,
)

pytestmark = pytest.mark.cluster


def test_supervisor_runs_assigned_workers_restarts_a_killed_one_and_stops_them_on_kill(
    daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    daemons.nimbus()
    sup = daemons.supervisor(ports(2))
    sup.wait_for("offering")
    path = wordcount(tmp_path)
    submit(zk, path, 2)
    pids = running_workers(daemons, state, "wordcount", 2)
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
        lambda: health(state, "wordcount", slot)["counters"]["source_tuples_in"] == 50,
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
    new_pids = running_workers(daemons, state, "wordcount", 2)
    # kill the topology: its workers stop (ordered shutdown), the topology is gone
    out = cli("kill", "wordcount", "--wait", "0", "--zookeeper", zk, *sets(FAST))
    assert out.returncode == 0, out.stderr
    wait_gone(list(new_pids.values()), "the killed topology's workers")
    wait_until(lambda: state.topology_names() == [], what="the topology removed")
    assert sup.proc.poll() is None  # the supervisor itself runs on


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_supervisor_leaves_no_worker_behind(
    daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path, signum: int
) -> None:
    daemons.nimbus()
    sup = daemons.supervisor(ports(2))
    sup.wait_for("offering")
    submit(zk, wordcount(tmp_path), 2)
    pids = list(running_workers(daemons, state, "wordcount", 2).values())
    sup.signal(signum)
    assert sup.proc.wait(60) == 0
    assert not [p for p in pids if alive(p)]  # gone by the time the supervisor exits
    assert "stopped worker" in sup.output()
    assert state.supervisors() == {}


def test_a_sigkilled_supervisor_still_takes_its_workers_down(
    daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    daemons.nimbus()
    sup = daemons.supervisor(ports(2))
    sup.wait_for("offering")
    submit(zk, wordcount(tmp_path), 2)
    pids = list(running_workers(daemons, state, "wordcount", 2).values())
    sup.proc.send_signal(signal.SIGKILL)
    sup.proc.wait(10)
    wait_gone(pids, "workers of the SIGKILLed supervisor (parent-death signal)")


def test_when_a_supervisor_dies_its_workers_move_to_another(
    daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    daemons.nimbus()
    a = daemons.supervisor(ports(2), sid="a")
    b = daemons.supervisor(ports(2), sid="b")
    a.wait_for("offering")
    b.wait_for("offering")
    submit(zk, wordcount(tmp_path), 2)
    before = running_workers(daemons, state, "wordcount", 2)
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
    after = running_workers(daemons, state, "wordcount", 2)
    v2 = state.read_assignment("wordcount")
    assert v2 is not None
    assert v2.version > v1.version
    assert set(v2.slots) <= set(sups["b"].slots)
    assert not [p for s, p in before.items() if s in {str(x) for x in a_slots} and alive(p)]
    assert set(after) == {str(s) for s in v2.slots}
