"""The cluster side of Spark-hosted supervisors, against the real ZooKeeper and no Spark.

A supervisor dedicated to a topology (what a deploy() task registers) gives its slot to that
topology only; a hosted supervisor registers one slot, removes an earlier attempt of its index
at once (nimbus reassigns without waiting for the dead one's session to expire), and ends when
its deployment retires it or the driver's lease is gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_storm.cluster import admin
from spark_storm.cluster.hosted import HostedSupervisorSpec, deployment_path, lease_path, run_hosted_supervisor
from spark_storm.cluster.nimbus import Nimbus
from spark_storm.cluster.records import HostedDeployment, SupervisorInfo
from spark_storm.cluster.state import ClusterState
from spark_storm.topology import Slot
from tests.support import wait_until, wordcount
from tests.support.cluster import FAST

pytestmark = pytest.mark.cluster


@pytest.fixture
def nimbus(zk: str) -> Iterator[Nimbus]:
    n = Nimbus(zk, FAST).start()
    assert n.wait_leader(20)
    yield n
    n.stop()


def test_a_dedicated_slot_goes_to_its_topology_only(
    nimbus: Nimbus, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    hosted = ClusterState(zk, FAST).start()
    hosted.register_supervisor(SupervisorInfo("mine.0.0.0", "10.0.0.9", (7000,), topology="mine"))
    try:
        admin.submit(state, wordcount(tmp_path, "other"), workers=1)
        time.sleep(2 * FAST["nimbus.monitor.freq.secs"])  # two rounds: the free dedicated slot is not taken
        assert state.read_assignment("other") is None
        admin.submit(state, wordcount(tmp_path, "mine"), workers=1)
        wait_until(lambda: state.read_assignment("mine") is not None, what="mine assigned", timeout=20)
        got = state.read_assignment("mine")
        assert got is not None
        assert got.slots == (Slot("10.0.0.9", 7000),)
        assert state.supervisors()["mine.0.0.0"].topology == "mine"
    finally:
        hosted.close()


def _deployment(state: ClusterState, name: str, retired: tuple[int, ...] = ()) -> None:
    session = state.session
    path = session.path(deployment_path(name))
    record = HostedDeployment(name, "app-test", "driver:1", time.time(), False, 1, retired)
    session.ensure_path(path.rsplit("/", 1)[0])
    if session.read(path) is None:
        session.call("create", "create", path, record.to_json())
    else:
        session.call("write", "set", path, record.to_json())


def test_a_hosted_supervisor_replaces_its_earlier_attempt_and_ends_when_retired(
    nimbus: Nimbus, state: ClusterState, zk: str, tmp_path: Path
) -> None:
    name = "hostedwc"
    admin.submit(state, wordcount(tmp_path, name), workers=1)
    _deployment(state, name)
    lease = ClusterState(zk, FAST).start()
    lease.session.register_ephemeral(lease.session.path(lease_path(name)), b"{}")
    # a dead attempt 0 whose session still holds its registration (as after an executor's SIGKILL)
    dead = ClusterState(zk, FAST).start()
    dead.register_supervisor(SupervisorInfo(f"{name}.0.0.0", "127.0.0.1", (1,), topology=name))
    wait_until(lambda: state.read_assignment(name) is not None, what="the dead attempt's slot assigned", timeout=20)
    spec = HostedSupervisorSpec(name, zk, 0, 0, dict(FAST))
    reasons: list[str] = []
    runner = threading.Thread(
        target=lambda: reasons.append(run_hosted_supervisor(spec, 1, local_dir=tmp_path / "sup")), daemon=True
    )
    started = time.monotonic()
    runner.start()
    try:

        def reassigned() -> bool:
            got = state.read_assignment(name)
            return got is not None and got.slots != (Slot("127.0.0.1", 1),)

        wait_until(reassigned, what="the new attempt's slot assigned", timeout=60, interval=0.05)
        took = time.monotonic() - started
        assert f"{name}.0.0.0" not in state.supervisors()
        assert f"{name}.0.0.1" in state.supervisors()
        # the dead attempt's session stays open here: only its removal (not a timeout) explains this
        assert took < FAST["nimbus.task.launch.secs"], took
        print(f"a new attempt's slot assigned {took:.1f}s after it started")
        _deployment(state, name, retired=(0,))
        runner.join(60)
        assert reasons == ["retired (the deployment has fewer workers now)"]
        assert f"{name}.0.0.1" not in state.supervisors()
    finally:
        dead.close()
        lease.close()
