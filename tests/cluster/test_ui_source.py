"""ZooKeeperSource against the real ZooKeeper and an in-process nimbus: what it reads, how it judges workers.

Supervisors are registrations in their own sessions and heartbeats are written as workers
write them (tests/cluster/test_ui_cluster.py runs the same source over real processes).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_storm.cluster import admin
from spark_storm.cluster.liveness import WorkerLiveness
from spark_storm.cluster.nimbus import Nimbus
from spark_storm.cluster.records import Assignment, SupervisorInfo
from spark_storm.cluster.state import ClusterState
from spark_storm.errors import ConfigError, TopologyActionError, UnknownTopologyError
from spark_storm.topology import Slot
from spark_storm.ui import ZooKeeperSource
from spark_storm.ui.source import TopologyRef
from tests.support import wait_until, wordcount
from tests.support.cluster import FAST, send_heartbeat

pytestmark = pytest.mark.cluster


@pytest.fixture
def cluster(zk: str, state: ClusterState, tmp_path: Path) -> Iterator[tuple[Nimbus, Assignment]]:
    """A leading nimbus, supervisor ``A`` (10.0.0.1, 3 slots), and wordcount assigned to 2 of them."""
    nimbus = Nimbus(zk, FAST, identifier="nimbus-host:111").start()
    sup = ClusterState(zk, FAST).start()
    try:
        assert nimbus.wait_leader(20)
        sup.register_supervisor(SupervisorInfo("A", "10.0.0.1", (6700, 6701, 6702), time.time() - 30))
        admin.submit(state, wordcount(tmp_path), 2)
        wait_until(lambda: state.read_assignment("wordcount") is not None, what="the first assignment")
        assignment = state.read_assignment("wordcount")
        assert assignment is not None
        yield nimbus, assignment
    finally:
        sup.close()
        nimbus.stop()


def _beat(state: ClusterState, slot: Slot, **record: object) -> None:
    send_heartbeat(state, "wordcount", slot, **{"pid": 4242, "uptime_s": 3.5, "metrics_port": 9999, **record})


def _topology(source: ZooKeeperSource) -> TopologyRef:
    topo = source.state().topology("wordcount")
    assert topo is not None
    return topo


def test_reads_topologies_workers_supervisors_and_nimbus(
    cluster: tuple[Nimbus, Assignment], state: ClusterState, zk: str
) -> None:
    nimbus, assignment = cluster
    first, second = assignment.slots
    source = ZooKeeperSource(state, WorkerLiveness(task_timeout_s=0.5, launch_timeout_s=60))
    other = Nimbus(zk, FAST, identifier="other-host:222").start()
    try:
        wait_until(lambda: len(state.nimbus_contenders()) == 2, what="the second nimbus contending")
        _beat(state, first, metrics_host="0.0.0.0")
        reading = source.state()
        assert (reading.kind, reading.rebalance_supported) == ("cluster", True)
        assert zk in reading.description
        assert [(n.id, n.host, n.pid, n.status) for n in reading.nimbus] == [
            ("nimbus-host:111", "nimbus-host", 111, "Leader"),
            ("other-host:222", "other-host", 222, "Not a Leader"),
        ]
        assert all(n.uptime_s is not None and 0 <= n.uptime_s < 60 for n in reading.nimbus)
        (sup,) = reading.supervisors
        assert (sup.id, sup.host, sup.slots_total, sup.slots_used, sup.ports) == (
            "A",
            "10.0.0.1",
            3,
            2,
            (6700, 6701, 6702),
        )
        assert sup.uptime_s is not None
        assert sup.uptime_s >= 30
        topo = reading.topology("wordcount")
        assert topo is not None
        assert (topo.status, topo.assignment_version, topo.workers_requested) == ("ACTIVE", 1, 2)
        assert topo.uptime_s is not None
        assert 0 <= topo.uptime_s < 60
        w1, w2 = topo.workers
        # a wildcard metrics host means "on the worker's own host"
        assert (w1.id, w1.status, w1.pid, w1.uptime_s, w1.supervisor) == (str(first), "running", 4242, 3.5, "A")
        assert w1.endpoint == "http://10.0.0.1:9999"
        assert sorted(w1.executors) == sorted(map(str, assignment.executors_of(first)))
        # assigned, no heartbeat yet: starting (not alive: the sampler does not read it)
        assert (w2.id, w2.status, w2.alive, w2.endpoint) == (str(second), "starting", False, None)
        _beat(state, second, metrics_host="127.0.0.1", status="inactive")
        w1, w2 = _topology(source).workers
        assert (w2.status, w2.endpoint) == ("inactive", "http://127.0.0.1:9999")
        # a heartbeat that stops changing is dead after the timeout (nimbus's rule), on this process's clock
        wait_until(
            lambda: [w.status for w in _topology(source).workers] == ["dead", "dead"], what="both stale", timeout=5
        )
        _beat(state, first)
        assert [w.status for w in _topology(source).workers] == ["running", "dead"]
        # nimbus gone: the other one leads, and the reading says so
        nimbus.stop()
        wait_until(lambda: other.is_leader, what="the other nimbus to lead", timeout=20)
        assert [(n.id, n.status) for n in source.state().nimbus] == [("other-host:222", "Leader")]
    finally:
        other.stop()


def test_workers_that_never_heartbeat_turn_dead_when_nimbus_would_move_them(
    cluster: tuple[Nimbus, Assignment], state: ClusterState
) -> None:
    source = ZooKeeperSource(state, WorkerLiveness(task_timeout_s=60, launch_timeout_s=0.3))
    assert [w.status for w in _topology(source).workers] == ["starting", "starting"]
    wait_until(
        lambda: [w.status for w in _topology(source).workers] == ["dead", "dead"],
        what="nimbus.task.launch.secs to pass with no heartbeat",
        timeout=10,
    )


def test_actions_go_through_zookeeper_and_the_errors_are_the_protocols(
    cluster: tuple[Nimbus, Assignment], state: ClusterState
) -> None:
    source = ZooKeeperSource(state)
    source.deactivate("wordcount")
    assert state.read_topology("wordcount").status == "inactive"
    assert _topology(source).status == "INACTIVE"
    source.activate("wordcount")
    assert _topology(source).status == "ACTIVE"
    with pytest.raises(UnknownTopologyError, match="no topology 'nope'"):
        source.activate("nope")
    with pytest.raises(ConfigError, match="numWorkers must be a whole number >= 1, got 0"):
        source.rebalance("wordcount", 0, {"numWorkers": 0})
    with pytest.raises(ConfigError, match="unknown rebalanceOptions 'numWorker'"):
        source.rebalance("wordcount", 0, {"numWorker": 3})
    # a delayed rebalance: REBALANCING during the wait, then the new count (and nimbus's new version)
    source.rebalance("wordcount", 1, {"numWorkers": 3})
    assert _topology(source).status == "REBALANCING"
    assert state.read_topology("wordcount").workers == 2
    wait_until(lambda: state.read_topology("wordcount").workers == 3, what="the rebalance after its wait")
    wait_until(lambda: _topology(source).assignment_version == 2, what="assignment v2")
    assert _topology(source).status == "ACTIVE"
    assert len(_topology(source).workers) == 3
    # a pending rebalance is dropped by a kill; a killed topology refuses the others
    source.rebalance("wordcount", 30, {"numWorkers": 1})
    source.kill("wordcount", 30)
    assert _topology(source).status == "KILLED"
    assert state.read_topology("wordcount").workers == 3
    with pytest.raises(TopologyActionError, match="being killed"):
        source.deactivate("wordcount")
    with pytest.raises(TopologyActionError, match="being killed; it cannot be rebalanced"):
        source.rebalance("wordcount", 0, {"numWorkers": 2})
    source.close()
    assert state.session.connected  # a shared session stays open


def test_no_nimbus_is_a_refused_action_and_a_lost_zookeeper_keeps_the_last_reading(
    zk: str, state: ClusterState, tmp_path: Path
) -> None:
    nimbus = Nimbus(zk, FAST).start()
    try:
        assert nimbus.wait_leader(20)
        admin.submit(state, wordcount(tmp_path), 1)
    finally:
        nimbus.stop()
    wait_until(lambda: state.nimbus_leader() is None, what="the nimbus gone")
    own = ClusterState(zk, FAST).start()
    source = ZooKeeperSource(own, close_state=True)
    with pytest.raises(TopologyActionError, match="no nimbus is running"):
        source.kill("wordcount", 0)
    assert state.read_topology("wordcount").status == "active"  # refused means nothing written
    source.deactivate("wordcount")  # status changes need no nimbus: the workers follow them
    before = source.state()
    assert before.nimbus == ()
    assert [t.status for t in before.topologies] == ["INACTIVE"]
    own.close()  # no session: every read fails as when ZooKeeper is unreachable
    after = source.state()
    assert "unreachable since" in after.description
    assert after.topologies == before.topologies
    source.close()
