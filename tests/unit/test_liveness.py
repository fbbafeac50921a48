"""Nimbus's rules for slots and workers, judged on the caller's clock (nimbus and the UI both call them)."""

from __future__ import annotations

from spark_storm.cluster.liveness import ALIVE, DEAD, STARTING, WorkerLiveness, slot_owners, used_slots
from spark_storm.cluster.records import Assignment, HeartbeatZnode, SupervisorInfo
from spark_storm.reports import WorkerHeartbeat
from spark_storm.topology import Slot, plan, topology_from_dict

SLOT = Slot("10.0.0.1", 6700)
RECORD: WorkerHeartbeat = {
    "topology": "t",
    "worker": str(SLOT),
    "pid": 1,
    "status": "running",
    "time": 0.0,
    "uptime_s": 0.0,
    "executors": [],
    "received": 0,
    "metrics_port": None,
    "metrics_host": None,
}


LIVE = {SLOT, Slot("10.0.0.2", 6700)}


def _znode(version: int) -> HeartbeatZnode:
    return HeartbeatZnode(SLOT, RECORD, version)


def test_a_worker_starts_then_lives_while_its_znode_changes_then_dies() -> None:
    judge = WorkerLiveness(task_timeout_s=30, launch_timeout_s=120)
    judge.assigned("t", SLOT, now=0.0)
    assert judge.judge("t", SLOT, None, LIVE, now=100.0).state == STARTING
    assert not judge.heard_from("t", SLOT)
    assert judge.judge("t", SLOT, _znode(1), LIVE, now=101.0).state == ALIVE
    assert judge.heard_from("t", SLOT)
    assert judge.judge("t", SLOT, _znode(1), LIVE, now=131.0).state == ALIVE  # unchanged 30 s: not yet
    dead = judge.judge("t", SLOT, _znode(1), LIVE, now=131.5)
    assert (dead.state, dead.dead) == (DEAD, True)
    assert dead.reason == "heartbeat unchanged for more than nimbus.task.timeout.secs=30"
    assert judge.judge("t", SLOT, _znode(2), LIVE, now=132.0).state == ALIVE  # a new version: alive again


def test_a_slot_no_supervisor_offers_is_dead_whatever_its_heartbeat() -> None:
    judge = WorkerLiveness(task_timeout_s=30, launch_timeout_s=120)
    verdict = judge.judge("t", SLOT, _znode(1), live=set(), now=0.0)
    assert (verdict.dead, verdict.reason) == (True, "its supervisor is gone")


def test_a_worker_that_never_heartbeats_is_dead_after_the_launch_timeout() -> None:
    judge = WorkerLiveness(task_timeout_s=30, launch_timeout_s=120)
    assert judge.judge("t", SLOT, None, LIVE, now=5.0).state == STARTING  # the first look starts the clock
    judge.assigned("t", SLOT, now=50.0)  # kept: the clock runs already
    verdict = judge.judge("t", SLOT, None, LIVE, now=125.5)
    assert verdict.dead
    assert verdict.reason == "no heartbeat within nimbus.task.launch.secs=120"


def test_forget_and_retain_drop_what_left_the_cluster() -> None:
    judge = WorkerLiveness(task_timeout_s=1, launch_timeout_s=1)
    other = Slot("10.0.0.2", 6700)
    for slot in (SLOT, other):
        judge.judge("t", slot, _znode(1), LIVE, now=0.0)
    judge.retain({("t", SLOT)})
    assert (judge.heard_from("t", SLOT), judge.heard_from("t", other)) == (True, False)
    judge.forget("t", SLOT)
    assert judge.judge("t", SLOT, None, LIVE, now=10.0).state == STARTING  # a fresh launch clock
    judge.forget("t")
    judge.clear()
    assert not judge.heard_from("t", SLOT)


def test_from_conf_takes_nimbus_timeouts() -> None:
    judge = WorkerLiveness.from_conf({"nimbus.task.timeout.secs": 4, "nimbus.task.launch.secs": 9})
    assert (judge.task_timeout_s, judge.launch_timeout_s) == (4.0, 9.0)


def test_a_slot_offered_twice_belongs_to_the_first_supervisor_and_assigned_slots_are_used() -> None:
    supervisors = {
        "B": SupervisorInfo("B", "10.0.0.1", (6700, 6701)),
        "A": SupervisorInfo("A", "10.0.0.1", (6700,)),
    }
    owners, conflicts = slot_owners(supervisors)
    assert owners == {SLOT: "A", Slot("10.0.0.1", 6701): "B"}
    assert conflicts == [(SLOT, "A", "B")]
    topo = topology_from_dict({"name": "t", "components": [{"id": "in", "bolt": "x.Y", "source": True}]})
    assignment = Assignment.from_plan(plan(topo, [SLOT]), 1)
    assert used_slots([assignment]) == {SLOT: "t"}
