"""ClusterState against the real ZooKeeper: round trips, watches, chroots, a lost session."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from spark_storm.cluster.records import ACTIVE, INACTIVE, KILLED, Assignment, SupervisorInfo, TopologyRecord
from spark_storm.cluster.state import ClusterState
from spark_storm.errors import ClusterError, TopologyExistsError, UnknownTopologyError, ZooKeeperUnavailableError
from spark_storm.tools.zookeeper_server import ZooKeeperServer
from spark_storm.topology import Slot, load_topology, plan
from tests.support import ROOT, wait_until
from tests.support.cluster import FAST, expire_session, heartbeat_record, send_heartbeat

pytestmark = pytest.mark.cluster
SOURCE = (ROOT / "conf" / "topologies" / "wordcount.yaml").read_text()
TOPO = load_topology(ROOT / "conf" / "topologies" / "wordcount.yaml")


def _assignment(version: int, slots: str = "127.0.0.1:6700,127.0.0.1:6701") -> Assignment:
    return Assignment.from_plan(plan(TOPO, slots), version)


def test_topologies_round_trip_with_status_and_workers(state: ClusterState) -> None:
    state.submit_topology(TopologyRecord("wordcount", SOURCE, ACTIVE, 2, 100.0))
    got = state.read_topology("wordcount")
    assert (got.status, got.workers, got.submitted) == (ACTIVE, 2, 100.0)
    assert got.topology().components.keys() == TOPO.components.keys()
    assert state.topology_names() == ["wordcount"]
    assert state.set_status("wordcount", INACTIVE).status == INACTIVE
    assert state.set_workers("wordcount", 3).workers == 3
    assert state.read_topology("wordcount").status == INACTIVE  # the rebalance kept the status
    killed = state.set_status("wordcount", KILLED, kill_at=123.0)
    assert (killed.status, killed.kill_at) == (KILLED, 123.0)
    with pytest.raises(ClusterError, match="is being killed; it cannot be made active"):
        state.set_status("wordcount", ACTIVE)


def test_a_taken_name_and_an_unknown_name_are_clear_errors(state: ClusterState) -> None:
    state.submit_topology(TopologyRecord("wordcount", SOURCE))
    with pytest.raises(TopologyExistsError, match=r"'wordcount' is already submitted \(active\): kill it first"):
        state.submit_topology(TopologyRecord("wordcount", SOURCE))
    with pytest.raises(UnknownTopologyError, match=r"no topology 'wordcont' .*submitted: wordcount"):
        state.set_status("wordcont", INACTIVE)
    assert state.find_topology("nope") is None


def test_supervisors_are_ephemeral(zk: str, state: ClusterState) -> None:
    other = ClusterState(zk, FAST).start()
    other.register_supervisor(SupervisorInfo("s1", "10.0.0.1", (6700, 6701), 1.0, 42))
    assert state.supervisors()["s1"].slots == (Slot("10.0.0.1", 6700), Slot("10.0.0.1", 6701))
    other.close()  # the session ends: its ephemeral node goes with it
    assert state.supervisors() == {}


def test_assignments_only_move_forward_and_heartbeats_round_trip(state: ClusterState) -> None:
    assert state.read_assignment("wordcount") is None
    assert state.write_assignment(_assignment(1))
    assert state.write_assignment(_assignment(2, "127.0.0.1:6700"))
    assert not state.write_assignment(_assignment(2))  # same version: refused
    assert not state.write_assignment(_assignment(1))  # older: refused
    current = state.read_assignment("wordcount")
    assert current is not None
    assert (current.version, current.slots) == (2, (Slot("127.0.0.1", 6700),))
    slot = Slot("127.0.0.1", 6700)
    first = send_heartbeat(state, "wordcount", slot, time=1.0, pid=7)
    second = send_heartbeat(state, "wordcount", slot, time=2.0, pid=7)
    assert (first.record["time"], second.record["time"]) == (1.0, 2.0)
    assert second.version > first.version
    assert second.record == heartbeat_record("wordcount", slot, time=2.0, pid=7)
    state.submit_topology(TopologyRecord("wordcount", SOURCE))
    state.remove_topology("wordcount")
    assert state.read_assignment("wordcount") is None
    assert state.read_heartbeats("wordcount") == {}
    assert state.topology_names() == []


def test_watches_see_newer_versions_status_changes_and_removal(state: ClusterState) -> None:
    seen: list[int | None] = []
    statuses: list[str | None] = []
    names: list[list[str]] = []
    state.submit_topology(TopologyRecord("wordcount", SOURCE))
    assignment_watch = state.watch_assignment("wordcount", lambda a: seen.append(a.version if a else None))
    state.watch_status("wordcount", statuses.append)
    state.watch_topologies(names.append)
    wait_until(lambda: seen == [None] and statuses == ["active"] and names == [["wordcount"]], what="initial calls")
    for version in (1, 2, 3):
        state.write_assignment(_assignment(version))
    wait_until(lambda: seen[-1] == 3, what="version 3")
    assert seen == sorted(set(seen), key=lambda v: v or 0)  # only newer versions, each once
    state.set_status("wordcount", INACTIVE)
    wait_until(lambda: statuses[-1] == "inactive", what="inactive")
    state.set_workers("wordcount", 5)  # not a status change: no call
    state.remove_topology("wordcount")
    wait_until(lambda: seen[-1] is None and statuses[-1] is None and names[-1] == [], what="removal")
    assert statuses == ["active", "inactive", None]
    assignment_watch.cancel()
    state.write_assignment(_assignment(9))
    state.submit_topology(TopologyRecord("wordcount", SOURCE))
    wait_until(lambda: statuses[-1] == "active", what="resubmitted")
    assert seen[-1] is None  # the cancelled watch said nothing about version 9


def test_a_callback_that_raises_does_not_stop_the_watch(state: ClusterState) -> None:
    calls: list[int] = []

    def bad(a: Assignment | None) -> None:
        calls.append(a.version if a else 0)
        msg = "bolt bug"
        raise RuntimeError(msg)

    state.watch_assignment("wordcount", bad)
    state.write_assignment(_assignment(1))
    state.write_assignment(_assignment(2))
    wait_until(lambda: calls[-1:] == [2], what="the second version despite the error")


def test_chroots_keep_clusters_apart(zookeeper: str) -> None:
    with ClusterState(f"{zookeeper}/iso-a", FAST) as a, ClusterState(f"{zookeeper}/iso-b", FAST) as b:
        a.submit_topology(TopologyRecord("only-in-a", SOURCE))
        assert b.topology_names() == []
        assert a.topology_names() == ["only-in-a"]
        a.remove_topology("only-in-a")


def test_a_lost_session_re_registers_ephemerals_and_re_arms_watches(zk: str, zookeeper: str) -> None:
    with ClusterState(zk, FAST) as observer, ClusterState(zk, FAST) as st:
        changes: list[str] = []
        st.session.add_state_listener(changes.append)
        st.register_supervisor(SupervisorInfo("s1", "127.0.0.1", (6700,)))
        seen: list[int] = []
        st.watch_assignment("wordcount", lambda a: seen.append(a.version if a else 0))
        wait_until(lambda: seen == [0], what="initial call")
        old_session = st.session.session_id()
        expire_session(st, zookeeper)
        wait_until(lambda: "lost" in changes, what="the session loss", timeout=20)
        wait_until(
            lambda: st.session.connected and st.session.session_id() != old_session, what="a new session", timeout=20
        )
        wait_until(lambda: "s1" in observer.supervisors(), what="s1 registered again", timeout=20)
        assert st.session.session_losses == 1
        observer.write_assignment(_assignment(1))
        wait_until(lambda: seen[-1] == 1, what="the watch on the new session")
        send_heartbeat(st, "wordcount", Slot("127.0.0.1", 6700), time=3.0)


def test_zookeeper_down_fails_fast_and_a_restart_is_survived(zookeeper_jars: Path, tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk", zookeeper_jars)
    address = server.start()
    try:
        with ClusterState(f"{address}/restart", FAST) as st, ClusterState(f"{address}/restart", FAST) as writer:
            st.register_supervisor(SupervisorInfo("s1", "127.0.0.1", (6700,)))
            seen: list[int] = []
            st.watch_assignment("wordcount", lambda a: seen.append(a.version if a else 0))
            server.stop()
            wait_until(lambda: not st.session.connected, what="disconnected")
            started = time.monotonic()
            with pytest.raises(ZooKeeperUnavailableError, match=r"did not answer .*spark-storm zookeeper status"):
                st.read_topology("wordcount")
            assert time.monotonic() - started < 5  # bounded by storm.zookeeper.retry.*, not hung
            slot = Slot("127.0.0.1", 6700)
            assert not st.send_heartbeat("wordcount", slot, heartbeat_record("wordcount", slot, time=1.0))
            server.start(port=int(address.rsplit(":", 1)[1]), clean=False)
            assert st.session.wait_connected(30)
            assert writer.session.wait_connected(30)
            writer.write_assignment(_assignment(4))
            wait_until(lambda: seen[-1:] == [4], what="the watch after the restart", timeout=20)
            wait_until(lambda: "s1" in writer.supervisors(), what="s1 still registered", timeout=20)
            send_heartbeat(st, "wordcount", slot, time=2.0)
    finally:
        server.stop()


def test_no_zookeeper_is_a_clear_error(tmp_path: Path) -> None:
    from spark_storm.netutil import free_ports

    port = free_ports(1)[0]
    with pytest.raises(ZooKeeperUnavailableError, match=rf"cannot connect to ZooKeeper at 127.0.0.1:{port} within 1s"):
        ClusterState(f"127.0.0.1:{port}", FAST).start(timeout=1)


def test_state_is_usable_from_many_threads(state: ClusterState) -> None:
    errors: list[BaseException] = []

    def beat(port: int) -> None:
        slot = Slot("127.0.0.1", port)
        try:
            for i in range(20):
                send_heartbeat(state, "wordcount", slot, time=float(i))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=beat, args=(6700 + i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert {hb.record["time"] for hb in state.read_heartbeats("wordcount").values()} == {19.0}
