"""Nimbus against the real ZooKeeper: assignment, reassignment, rebalance, kill, election and takeover.

Supervisors here are registrations in their own ZooKeeper sessions (closing the session is a
supervisor dying) and heartbeats are written as a worker writes them; test_supervisor.py runs
the same paths with real supervisor and worker processes.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_storm.cluster import admin
from spark_storm.cluster.nimbus import Nimbus
from spark_storm.cluster.records import Assignment, SupervisorInfo
from spark_storm.cluster.state import ClusterState
from spark_storm.topology import Slot, load_topology, plan
from tests.support import wait_until, wordcount
from tests.support.cluster import FAST, Daemons, expire_session, heartbeat_record

pytestmark = pytest.mark.cluster


def _supervisor(zk: str, sid: str, host: str, ports: tuple[int, ...]) -> ClusterState:
    st = ClusterState(zk, FAST).start()
    st.register_supervisor(SupervisorInfo(sid, host, ports))
    return st


@pytest.fixture
def nimbus(zk: str) -> Iterator[Nimbus]:
    n = Nimbus(zk, FAST).start()
    assert n.wait_leader(20)
    yield n
    n.stop()


@pytest.fixture
def two_supervisors(zk: str) -> Iterator[dict[str, ClusterState]]:
    sups = {
        "A": _supervisor(zk, "A", "10.0.0.1", (6700, 6701)),
        "B": _supervisor(zk, "B", "10.0.0.2", (6700, 6701)),
    }
    yield sups
    for st in sups.values():
        st.close()


def _wait_version(state: ClusterState, name: str, version: int, timeout: float = 20.0) -> Assignment:
    box: list[Assignment] = []

    def ready() -> bool:
        a = state.read_assignment(name)
        if a is not None and a.version >= version:
            box.append(a)
            return True
        return False

    wait_until(ready, what=f"assignment v{version} of {name}", timeout=timeout)
    return box[-1]


class Beats:
    """Write heartbeats for some slots every 0.3 s, as workers do, until told to stop per slot."""

    def __init__(self, zk: str, topology: str, slots: list[Slot]) -> None:
        self.state = ClusterState(zk, FAST).start()
        self.topology = topology
        self.slots = set(slots)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.3):
            for slot in list(self.slots):
                self.state.send_heartbeat(self.topology, slot, heartbeat_record(self.topology, slot))

    def close(self) -> None:
        self.done.set()
        self.thread.join(10)
        self.state.close()


def test_submit_is_assigned_over_supervisors_with_plan(
    nimbus: Nimbus, state: ClusterState, two_supervisors: dict[str, ClusterState], tmp_path: Path
) -> None:
    path = wordcount(tmp_path)
    admin.submit(state, path, workers=2)
    a = _wait_version(state, "wordcount", 1)
    assert a.slots == (Slot("10.0.0.1", 6700), Slot("10.0.0.2", 6700))  # one per supervisor
    assert dict(a.executors) == plan(load_topology(path), list(a.slots)).executor_slot
    assert a.requested == 2
    # counted just after the write the test saw: wait for it, not race it
    wait_until(lambda: nimbus.counters["assignments"] == 1, what="the assignment counted")


def test_a_lost_supervisor_moves_only_its_workers(
    nimbus: Nimbus, state: ClusterState, two_supervisors: dict[str, ClusterState], tmp_path: Path
) -> None:
    admin.submit(state, wordcount(tmp_path), workers=2)
    _wait_version(state, "wordcount", 1)
    two_supervisors["B"].close()  # B's ephemeral node goes
    a = _wait_version(state, "wordcount", 2)
    assert a.slots == (Slot("10.0.0.1", 6700), Slot("10.0.0.1", 6701))
    wait_until(lambda: nimbus.counters["reassignments"] == 1, what="the reassignment counted")


def test_a_stale_heartbeat_moves_that_worker(
    zk: str, nimbus: Nimbus, state: ClusterState, two_supervisors: dict[str, ClusterState], tmp_path: Path
) -> None:
    admin.submit(state, wordcount(tmp_path), workers=2)
    v1 = _wait_version(state, "wordcount", 1)
    beats = Beats(zk, "wordcount", list(v1.slots))
    try:
        wait_until(
            lambda: all(nimbus.liveness.heard_from("wordcount", s) for s in v1.slots), what="nimbus saw both heartbeats"
        )
        assert state.read_assignment("wordcount") == v1
        hung = Slot("10.0.0.2", 6700)
        beats.slots.discard(hung)  # that worker stops beating (hung or dead)
        stopped = time.monotonic()
        v2 = _wait_version(state, "wordcount", 2, timeout=FAST["nimbus.task.timeout.secs"] + 10)
        took = time.monotonic() - stopped
    finally:
        beats.close()
    assert hung not in v2.slots
    assert Slot("10.0.0.1", 6700) in v2.slots  # the live worker stays
    assert len(v2.slots) == 2
    assert took >= FAST["nimbus.task.timeout.secs"]  # not before the timeout
    # its old heartbeat is cleaned up, right after nimbus writes the assignment that moved it
    wait_until(lambda: state.read_heartbeats("wordcount").get(hung) is None, what="the stale heartbeat removed")


def test_a_worker_that_never_starts_is_replaced(zk: str, state: ClusterState, tmp_path: Path) -> None:
    sup = _supervisor(zk, "A", "10.0.0.1", (6700, 6701))
    n = Nimbus(zk, {**FAST, "nimbus.task.launch.secs": 2}).start()
    try:
        assert n.wait_leader(20)
        admin.submit(state, wordcount(tmp_path), workers=1)
        v1 = _wait_version(state, "wordcount", 1)
        v2 = _wait_version(state, "wordcount", 2, timeout=15)
        assert v2.slots != v1.slots
    finally:
        n.stop()
        sup.close()


def test_rebalance_grows_and_kill_removes(
    nimbus: Nimbus, state: ClusterState, two_supervisors: dict[str, ClusterState], tmp_path: Path
) -> None:
    admin.submit(state, wordcount(tmp_path), workers=2)
    _wait_version(state, "wordcount", 1)
    admin.rebalance(state, "wordcount", 3)
    v2 = _wait_version(state, "wordcount", 2)
    assert len(v2.slots) == 3
    assert {s.host for s in v2.slots} == {"10.0.0.1", "10.0.0.2"}
    admin.kill(state, "wordcount", wait_secs=0)
    wait_until(lambda: state.topology_names() == [], what="the killed topology removed")
    assert state.read_assignment("wordcount") is None


def test_short_of_slots_it_takes_what_there_is_then_grows(
    zk: str, nimbus: Nimbus, state: ClusterState, tmp_path: Path
) -> None:
    a = _supervisor(zk, "A", "10.0.0.1", (6700, 6701))
    try:
        admin.submit(state, wordcount(tmp_path), workers=3)
        v1 = _wait_version(state, "wordcount", 1)
        assert len(v1.slots) == 2
        assert [r.workers for r in admin.list_topologies(state)] == [2]
        c = _supervisor(zk, "C", "10.0.0.3", (6700,))
        try:
            v2 = _wait_version(state, "wordcount", 2)
            assert len(v2.slots) == 3
            assert Slot("10.0.0.3", 6700) in v2.slots
        finally:
            c.close()
    finally:
        a.close()


def test_two_nimbus_processes_elect_one_and_the_other_takes_over(
    daemons: Daemons, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    first, second = daemons.nimbus(), daemons.nimbus()
    wait_until(lambda: state.nimbus_leader() is not None and len(state.nimbus_contenders()) == 2, what="both contend")
    leader_id = state.nimbus_leader()
    assert leader_id is not None
    leader, other = (first, second) if leader_id.endswith(f":{first.pid}") else (second, first)
    leader.wait_for("is the leader")
    assert "is the leader" not in other.output()
    leader.proc.send_signal(signal.SIGKILL)  # no goodbye: its session has to time out
    leader.proc.wait(10)
    killed = time.monotonic()
    other.wait_for("is the leader", timeout=30)
    takeover = time.monotonic() - killed
    assert state.nimbus_leader() == f"{leader_id.rsplit(':', 1)[0]}:{other.pid}"
    assert takeover < FAST["storm.zookeeper.session.timeout"] / 1000 + 10
    # the new leader works: a topology submitted now is assigned
    sup = _supervisor(zk, "A", "127.0.0.1", (6700,))
    try:
        admin.submit(state, wordcount(tmp_path), workers=1)
        assert _wait_version(state, "wordcount", 1).slots == (Slot("127.0.0.1", 6700),)
    finally:
        sup.close()


def test_a_nimbus_that_loses_its_session_stops_leading_and_contends_again(zk: str, zookeeper: str) -> None:
    n = Nimbus(zk, FAST).start()
    try:
        assert n.wait_leader(20)
        expire_session(n.state, zookeeper)
        wait_until(lambda: n.counters["terms"] == 2 and n.is_leader, what="a second term", timeout=30)
    finally:
        n.stop()


def test_rebalance_and_a_timed_kill_act_without_waiting_for_the_monitor_tick(
    zk: str, state: ClusterState, two_supervisors: dict[str, ClusterState], tmp_path: Path
) -> None:
    n = Nimbus(zk, {**FAST, "nimbus.monitor.freq.secs": 600}).start()
    try:
        assert n.wait_leader(20)
        admin.submit(state, wordcount(tmp_path), workers=1)
        _wait_version(state, "wordcount", 1, timeout=5)
        admin.rebalance(state, "wordcount", 2)  # a data change of /topologies/wordcount
        assert len(_wait_version(state, "wordcount", 2, timeout=5).slots) == 2
        admin.kill(state, "wordcount", wait_secs=1.0)
        killed = time.monotonic()
        wait_until(lambda: state.topology_names() == [], what="removal when the wait is over", timeout=5)
        assert time.monotonic() - killed >= 0.9
    finally:
        n.stop()


def test_a_flux_file_is_submitted_as_what_it_became(
    nimbus: Nimbus, state: ClusterState, two_supervisors: dict[str, ClusterState], tmp_path: Path
) -> None:
    """Includes and ${...} are resolved at submit: workers on other hosts need neither the files nor the properties."""
    flux = Path(__file__).resolve().parents[1] / "data" / "flux" / "multilang.yaml"
    text = flux.read_text().replace('name: "shell-topology"', 'name: "${topology.name}"')
    (tmp_path / "flux.yaml").write_text(text)
    (tmp_path / "dev.properties").write_text("topology.name = flux-submitted\n")
    admin.submit(state, tmp_path / "flux.yaml", workers=1, properties=tmp_path / "dev.properties")
    record = state.read_topology("flux-submitted")
    assert "${" not in record.source
    assert record.topology() == load_topology(tmp_path / "flux.yaml", tmp_path / "dev.properties")
    assert _wait_version(state, "flux-submitted", 1).executors  # nimbus planned the stored topology
