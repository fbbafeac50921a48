"""Exact state through failures, with real worker processes: a keyed ledger fed like Spark feeds it.

The test plays both of Spark's parts: a writer that sends each batch as delivery groups and
retries what fails, and the driver's commit, which runs a checkpoint round (the
coordinator in spark_storm.state.protocol).  After SIGKILLs and restarts, every key's
committed [count, sum] must equal the answer computed from the rows.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_storm.errors import CoordinatorBusyError
from spark_storm.state.protocol import INTERVAL_PRIORITY, Coordinator
from tests.support import wait_until
from tests.support.ledger import ExactRun, Ledger, expected, ledger_state, rows_for

pytestmark = pytest.mark.integration


def test_committed_state_is_exact_without_failures(tmp_path: Path) -> None:
    with Ledger(tmp_path) as run:
        for batch in range(3):
            run.feed(batch)
            result = run.commit(batch)
            assert result.rolled_back_to is None
        assert run.state() == expected(run.batches)
        assert result.epoch == 3


def test_a_worker_sigkilled_mid_batch_then_restarted_ends_exact(tmp_path: Path) -> None:
    with Ledger(tmp_path) as run:
        run.feed(0)
        run.commit(0)
        sender = run.kill_mid_batch(run.with_source(), 1, 900)
        sender.join(120)
        assert not sender.is_alive()
        result = run.commit(1)
        print(f"rollback to {result.rolled_back_to}, attempts {result.attempts}, groups resent {run.writer.resent}")
        assert result.rolled_back_to == 1
        assert run.state() == expected(run.batches)  # the rollback replayed batch 1 whole, once
        run.feed(2)
        run.commit(2)
        assert run.state() == expected(run.batches)


def test_a_worker_sigkilled_during_a_commit_ends_exact(tmp_path: Path) -> None:
    with Ledger(tmp_path) as run:
        run.feed(0)
        run.commit(0)
        run.feed(1)
        outcome: list[Any] = []

        def commit() -> None:
            try:
                outcome.append(run.commit(1))
            except Exception as exc:  # the assertion below says what
                outcome.append(exc)

        committer = threading.Thread(target=commit)
        committer.start()
        # PREPARE reached worker 1: its barrier is injected, the epoch not yet committed
        wait_until(
            lambda: (
                (cp := run.health(1).get("checkpoint") or {}).get("epoch", 0) > cp.get("committed", 0)
                or not committer.is_alive()
            ),
            what="the commit of batch 1 under way on worker 1",
        )
        run.restart(1)
        committer.join(120)
        assert outcome, "the commit round did not finish"
        assert not isinstance(outcome[0], Exception), outcome[0]
        print(f"commit during a kill: epoch {outcome[0].epoch}, rollback to {outcome[0].rolled_back_to}")
        run.feed(2)
        run.commit(2)
        assert run.state() == expected(run.batches)


def test_two_workers_sigkilled_one_after_the_other_end_exact(tmp_path: Path) -> None:
    with Ledger(tmp_path, workers=3) as run:
        run.feed(0)
        run.commit(0)
        first = run.with_source()
        sender = run.kill_mid_batch(first, 1, 1500)
        run.cluster.wait_running(60, [run.cluster.slots[first]])
        run.restart(next(i for i in range(3) if i != first))
        sender.join(120)
        assert not sender.is_alive()
        result = run.commit(1)
        print(f"two kills: rollback to {result.rolled_back_to}, attempts {result.attempts}, resent {run.writer.resent}")
        assert run.state() == expected(run.batches)
        run.feed(2)
        run.commit(2)
        assert run.state() == expected(run.batches)


def test_the_columnar_ledger_is_exact_through_a_kill_too(tmp_path: Path) -> None:
    with Ledger(tmp_path, batch=True) as run:
        run.feed(0)
        run.commit(0)
        sender = run.kill_mid_batch(run.with_source(), 1, 900)
        sender.join(120)
        run.commit(1)
        assert run.state() == expected(run.batches)


def test_a_plain_client_gets_storms_interval_checkpoints_exact_through_a_kill(tmp_path: Path) -> None:
    """No Spark driver: the workers checkpoint every topology.state.checkpoint.interval.ms themselves."""
    with Ledger(tmp_path, conf={"topology.state.checkpoint.interval.ms": 300}, coordinated=False) as run:
        run.feed(0)
        victim = run.with_source()
        sender = run.kill_mid_batch(victim, 1, 900)
        sender.join(120)
        run.feed(2)

        def caught_up() -> bool:
            views = [run.health(i).get("checkpoint") or {} for i in range(len(run.cluster.slots))]
            return all(v.get("committed", 0) >= 2 and not v.get("dirty") and not v.get("replaying") for v in views)

        wait_until(caught_up, what="interval checkpoints after the last batch", timeout=60)
        first = min((run.health(i).get("checkpoint") or {}).get("committed", 0) for i in range(2))
        wait_until(  # two more rounds: the last rows are in a committed epoch
            lambda: min((run.health(i).get("checkpoint") or {}).get("committed", 0) for i in range(2)) >= first + 2,
            what="two more interval checkpoints",
            timeout=60,
        )
        rollbacks = max((run.health(i).get("checkpoint") or {}).get("rollbacks", 0) for i in range(2))
        print(f"interval checkpoints: {first + 2}+ epochs committed, {rollbacks} rollback(s)")
        assert rollbacks >= 1
        assert run.state() == expected(run.batches)


def test_checkpoints_and_a_rollback_go_through_full_queues(tmp_path: Path) -> None:
    """Barriers and a rollback while every queue is full: nothing may wait on a queue while holding the gate."""
    conf = {
        "topology.state.checkpoint.interval.ms": 100,
        "topology.executor.receive.buffer.size": 64,
        "topology.transfer.buffer.size": 64,
        "ledger.delay.s": 0.0005,
    }
    with Ledger(tmp_path, conf=conf, coordinated=False) as run:  # the interval rounds run between its groups
        for batch in range(3):
            run.feed(batch, 1500)
        victim = run.with_source()
        sender = run.kill_mid_batch(victim, 3, 1500)
        sender.join(180)
        assert not sender.is_alive()
        result = run.commit(3)
        print(f"full queues: epoch {result.epoch}, rollback to {result.rolled_back_to}")
        assert run.state() == expected(run.batches)


def test_a_coordinator_that_died_between_pause_and_resume_leaves_nothing_stuck(tmp_path: Path) -> None:
    """A PAUSE with no RESUME (its coordinator died), then another round's PAUSE: the executors come back.

    The second PAUSE finds every executor already stopped; the RESUME must restart the ones
    the first PAUSE stopped, or the replay waits on a full queue and every PREPARE times out.
    """
    with Ledger(tmp_path, conf={"topology.executor.receive.buffer.size": 64}) as run:
        run.feed(0)
        run.commit(0)
        generation = max(s.generation for s in run.coordinator.status().values())
        run.coordinator.pause(generation + 1)  # and then it "dies"
        statuses = run.coordinator.status().values()
        assert all(s.dirty for s in statuses), "a worker paused without a RESUME must ask for a rollback"
        run.feed(1)  # accepted and logged while paused; published by the replay
        result = run.commit(1)
        assert result.rolled_back_to == 1
        assert run.state() == expected(run.batches)
        run.feed(2)
        run.commit(2)
        assert run.state() == expected(run.batches)


def test_a_worker_resumed_first_cannot_hold_off_a_peer_whose_queues_its_replay_fills(tmp_path: Path) -> None:
    """One worker RESUMEs well before the other (D11): its replay's output fills the paused peer's queues.

    The peer's executors take nothing until its own RESUME, and that RESUME needs the input
    logs' gate.  A receive thread waiting under the gate for room in a paused executor's
    queue held the RESUME (and every STATUS after it) off for good; the paused worker's
    queues now take what comes past their capacity until the RESUME drains them.
    """
    with Ledger(tmp_path, conf={"topology.executor.receive.buffer.size": 64}) as run:
        run.feed(0)
        run.commit(0)
        statuses = run.coordinator.status()
        generation = max(s.generation for s in statuses.values()) + 1
        committed = max(s.committed for s in statuses.values())
        run.coordinator.pause(generation)
        run.feed(1, 1200)  # logged while paused; each worker's replay publishes its share
        first, late = str(run.cluster.slots[0]), 1
        run.coordinator.resume(committed, generation, workers={first})

        def late_queues_full() -> bool:
            queues = [e["queue"] for e in run.health(late).get("executors", {}).values()]
            return any(q["overflow"] > 0 or q["population"] > q["capacity"] for q in queues)

        wait_until(late_queues_full, what="the first worker's replay filling the paused worker's queues", timeout=60)
        started = time.monotonic()
        run.coordinator.resume(committed, generation, workers={str(run.cluster.slots[late])})
        assert time.monotonic() - started < 30
        statuses = run.coordinator.status()
        assert not any(s.dirty for s in statuses.values()), statuses
        result = run.commit(1)
        assert result.rolled_back_to is None
        assert run.state() == expected(run.batches)


def test_a_restarted_worker_behind_the_generation_gets_its_groups_acked_without_a_resend(tmp_path: Path) -> None:
    """A worker restarted after a rollback is at generation 0; its peers drop its tuples as stale.

    They fail those tuples' trees at once, so the restarted worker acks its groups (dirty: the
    next round rolls back and replays) instead of leaving them to the message timeout, and a
    Spark writer waiting on PROCESSED goes on without a resend.
    """
    with Ledger(tmp_path, conf={"topology.message.timeout.secs": 600}) as run:
        run.feed(0)
        run.commit(0)
        victim = run.with_source()
        sender = run.kill_mid_batch(victim, 1, 900)
        sender.join(120)
        assert not sender.is_alive()
        assert run.commit(1).rolled_back_to is not None  # every worker is at a newer generation now
        run.restart(victim)
        run.cluster.wait_running(60, [run.cluster.slots[victim]])
        assert run.conns[run.cluster.slots[victim]].wait_ready(30)
        statuses = run.coordinator.status()
        assert min(s.generation for s in statuses.values()) < max(s.generation for s in statuses.values())
        rows = rows_for(2, 600)
        run.batches[2] = rows
        resent = run.writer.resent
        run.writer.send(2, rows, timeout=90, ack_wait=20)  # without the stale-tuple fail: 20 s, then a resend
        assert run.writer.resent == resent, "a group waited for its stale tuples' trees and was resent"
        result = run.commit(2)
        assert result.rolled_back_to is not None
        assert run.state() == expected(run.batches)


def test_what_a_batch_cut_by_a_rollback_emits_is_dropped_not_counted_besides_the_replay(tmp_path: Path) -> None:
    """A rollback starts while a bolt is inside a long batch: that batch's output is of the old generation.

    The slow forwarder's worker waits for the batch to end before it pauses; the other worker
    paused at once and is already at the new generation when the batch's output arrives.  It
    must drop it (the replay sends those rows again), not queue it for after the RESUME.
    """
    conf = {"forward.delay.s": 0.003, "topology.message.timeout.secs": 600}
    with Ledger(tmp_path, conf=conf, mid="tests.integration.bolts:SlowForwarder") as run:
        run.feed(0)
        run.commit(0)
        plan = run.cluster.plan
        slow_task = plan.component_tasks["mid"][0]
        before = run.executed([slow_task])
        rows = rows_for(1, 900)
        run.batches[1] = rows
        sender = threading.Thread(target=run.writer.send, args=(1, rows))
        sender.start()
        wait_until(lambda: run.executed([slow_task]) > before, what="the slow forwarder inside batch 1", timeout=30)
        statuses = run.coordinator.status().values()
        committed = max(s.committed for s in statuses)
        generation = max(s.generation for s in statuses)
        run.coordinator.rollback(committed, generation + 1, ["a test's rollback while a bolt is mid-batch"])
        sender.join(120)
        assert not sender.is_alive()
        result = run.commit(1)
        print(f"rollback mid-batch: epoch {result.epoch}, rolled back again to {result.rolled_back_to}")
        assert run.state() == expected(run.batches)


def test_a_slow_changelog_write_holds_the_commit_not_the_tuples_after_the_barrier(tmp_path: Path) -> None:
    """The executor encodes its entry at the barrier and goes on; the write and fsync run on the writer thread.

    While epoch 2's writes are held, the next batch is executed and acked, PREPARE is not
    answered, and what that batch puts does not reach epoch 2's entries.
    """
    gate = tmp_path / "gate"
    gate.mkdir()
    conf = {
        "topology.state.provider": "tests.integration.bolts:GatedBackend",
        "topology.state.provider.config": {"dir": str(tmp_path / "state"), "gate": str(gate)},
    }
    with Ledger(tmp_path, conf=conf) as run:
        run.feed(0)
        assert run.commit(0).epoch == 1
        run.feed(1)
        (gate / "closed").touch()
        results: list[Any] = []
        committer = threading.Thread(target=lambda: results.append(run.commit(1)))
        committer.start()
        plan = run.cluster.plan
        by_worker: dict[Any, list[int]] = {}
        for task in plan.component_tasks["ledger"]:
            by_worker.setdefault(plan.task_slot[task], []).append(task)
        wait_until(  # one writer thread per worker: its first task's write holds the others behind it
            lambda: all(any((gate / f"writing-t{t}-e2").exists() for t in ts) for ts in by_worker.values()),
            what="every worker writing epoch 2",
            timeout=30,
        )
        ledger = plan.component_tasks["ledger"]
        before = run.executed(ledger)
        feeder = threading.Thread(target=run.feed, args=(2,))
        feeder.start()
        wait_until(
            lambda: run.executed(ledger) >= before + 600, what="the ledger executing batch 2 (600 rows)", timeout=30
        )
        assert committer.is_alive(), "PREPARE was answered before epoch 2's entries were written"
        assert not results
        (gate / "closed").unlink()
        feeder.join(60)
        committer.join(60)
        assert results
        assert results[0].epoch == 2
        assert run.state() == expected({b: run.batches[b] for b in (0, 1)})  # batch 2's puts stayed out
        assert run.commit(2).epoch == 3
        assert run.state() == expected(run.batches)


def _checkpoint(run: Ledger, index: int) -> dict[str, Any]:
    return run.health(index).get("checkpoint") or {}


def test_a_spark_batch_slower_than_the_lease_holds_the_interval_rounds_until_its_driver_commits(tmp_path: Path) -> None:
    """Issue 24: after the lease the interval coordinator ran epochs between a slow Spark batch's groups.

    Every epoch must fall between micro-batches (the windows' "never late"): while a coordinated
    batch is open the interval rounds stand aside however long the batch takes; once its driver
    committed it, they run again.
    """
    conf = {"topology.state.checkpoint.interval.ms": 100, "topology.state.coordinator.lease.ms": 500}
    with Ledger(tmp_path, conf=conf) as run:
        run.feed(0)
        epoch = run.commit(0).epoch  # the interval rounds may have run before the driver's first commit
        lowest = run.cluster.slots.index(min(run.cluster.slots))  # the worker that runs the interval rounds
        rounds = _checkpoint(run, lowest)["interval_rounds"]
        run.feed(1)  # every row processed; the driver's commit is slow to come
        seen = _checkpoint(run, lowest)["interval_stood_aside"]
        wait_until(  # 15 more looks, 100 ms apart: well past the 500 ms lease since the driver's commit
            lambda: (
                (cp := _checkpoint(run, lowest)).get("interval_stood_aside", 0) >= seen + 15
                or cp.get("interval_rounds", 0) > rounds
            ),
            what="the interval coordinator looking again after the lease ran out",
            timeout=60,
        )
        views = [_checkpoint(run, i) for i in range(2)]
        assert [v["committed"] for v in views] == [epoch, epoch], views
        assert views[lowest]["interval_rounds"] == rounds
        assert run.commit(1).epoch == epoch + 1  # the driver's commit: the batch whole in one epoch
        assert run.state() == expected(run.batches)
        wait_until(  # nothing open: the interval rounds run again once the driver's lease has passed
            lambda: _checkpoint(run, lowest).get("interval_rounds", 0) >= rounds + 2,
            what="interval rounds after the driver's commit",
            timeout=60,
        )
        assert run.state() == expected(run.batches)


def test_an_interval_round_stands_aside_at_each_request_while_a_driver_was_heard_or_its_batch_is_open(
    tmp_path: Path,
) -> None:
    """CI of stop 32: an interval round retried after the driver's COMMIT, which frees the lease.

    The round had started before the driver's first commit; its retry reached the workers
    after that COMMIT and committed an epoch of its own, between the driver's batches.  The
    workers now answer every request of an interval round BUSY while a driver was heard
    within the lease or a Spark batch is open, not only the loop that starts the rounds.
    """
    lease_ms = 2000
    with Ledger(tmp_path, conf={"topology.state.coordinator.lease.ms": lease_ms}) as run:
        run.feed(0)
        epoch = run.commit(0).epoch  # its COMMIT freed every worker's lease
        interval = Coordinator(
            "an interval round", lambda: {str(s): c for s, c in run.conns.items()}, 60.0, 3, priority=INTERVAL_PRIORITY
        )
        with pytest.raises(CoordinatorBusyError, match="a Spark driver coordinated this worker"):
            interval.checkpoint({})
        run.feed(1)  # its driver has not committed it yet
        wait_until(
            lambda: all((s.priority_age_s or 0) * 1000 > lease_ms for s in run.coordinator.status().values()),
            what="the driver's lease running out",
            timeout=30,
        )
        with pytest.raises(CoordinatorBusyError, match="a Spark batch its driver has not committed is open"):
            interval.checkpoint({})
        assert {s.committed for s in run.coordinator.status().values()} == {epoch}
        assert run.commit(1).epoch == epoch + 1  # the batch whole in one epoch
        assert run.state() == expected(run.batches)
        wait_until(
            lambda: all((s.priority_age_s or 0) * 1000 > lease_ms for s in run.coordinator.status().values()),
            what="the driver's lease running out after its commit",
            timeout=30,
        )
        assert interval.checkpoint({}).epoch == epoch + 2  # nothing open, no driver heard: it runs
        assert run.state() == expected(run.batches)


def test_when_a_spark_batch_is_left_open_past_the_hold_the_interval_rounds_commit_it_and_stay_exact(
    tmp_path: Path,
) -> None:
    """A driver presumed gone: the interval rounds commit what it left; its restart's replay is recognised."""
    conf = {
        "topology.state.checkpoint.interval.ms": 100,
        "topology.state.coordinator.lease.ms": 500,
        "topology.state.coordinator.batch.hold.ms": 1500,
    }
    with Ledger(tmp_path, conf=conf) as run:
        run.feed(0)
        epoch = run.commit(0).epoch
        lowest = run.cluster.slots.index(min(run.cluster.slots))
        seen = _checkpoint(run, lowest)["interval_stood_aside"]
        fed = time.time()
        run.feed(1)  # and the driver is gone
        wait_until(
            lambda: min(_checkpoint(run, i).get("committed", 0) for i in range(2)) > epoch,
            what="the interval rounds committing the batch left open",
            timeout=60,
        )
        cp = _checkpoint(run, lowest)
        assert cp["interval_stood_aside"] > seen
        # It waited the hold out first: batch 1's last group came after ``fed``. A bound on the
        # time, not on the looks: a loaded machine (the race tier) looks fewer times per second.
        assert cp["last_commit_at"] - fed >= 1.5, cp
        assert run.state() == expected(run.batches)
        run.feed(1)  # the query restarts from its checkpoint: batch 1 again, the same rows
        run.commit(1)
        assert run.state() == expected(run.batches)  # counted once


def test_an_epoch_every_worker_prepared_is_committed_by_the_next_round_not_rolled_back(tmp_path: Path) -> None:
    """bench.chaos seed 1000 #71: a COMMIT still in flight when the next round read STATUS.

    That round saw epoch E prepared everywhere and committed nowhere, and rolled back to E - 1:
    the workers it reached first dropped E's entries, then the late COMMIT made E committed on
    another worker, and the tasks that had dropped E could never restore it (every later round
    refused).  Now an epoch every worker prepared is committed (two-phase commit's rule), and a
    late COMMIT of it is a no-op.
    """
    with Ledger(tmp_path) as run:
        run.feed(0)
        run.commit(0)
        run.feed(1)
        generation = max(s.generation for s in run.coordinator.status().values())
        answers = run.coordinator.prepare(2, generation)  # the first phase of a round that then died
        assert all(not a["dirty"] for a in answers.values()), answers
        assert {s.prepared for s in run.coordinator.status().values()} == {2}
        result = run.commit(1)
        print(f"next round: epoch {result.epoch}, rollback to {result.rolled_back_to}")
        assert result.rolled_back_to is None
        assert run.coordinator.rolled_forward == 1
        assert result.epoch == 3
        first = str(run.cluster.slots[0])
        run.coordinator.commit(2, {}, workers={first})  # the dead round's COMMIT, landing late
        assert run.state() == expected(run.batches)
        run.feed(2)
        assert run.commit(2).rolled_back_to is None
        assert run.state() == expected(run.batches)


def test_a_worker_sigkilled_before_the_first_commit_loses_nothing(tmp_path: Path) -> None:
    """bench.chaos seed 1000 #169: the ledger tasks of a worker killed before any commit restored 'nothing'.

    Their trees had completed (the groups were acked), so nothing failed, and a task that
    restores epoch 0 with no entries was not taken as restarted: the first commit then left
    out what the killed worker had counted (210 rows).  Now its peers, losing the connection
    to it, are dirty, and the first round rolls back and replays the input logs.
    """
    with Ledger(tmp_path, workers=3) as run:
        plan = run.cluster.plan
        ledger = {plan.task_slot[t] for t in plan.component_tasks["ledger"]}
        sources = {plan.task_slot[t] for t in plan.component_tasks["in"]}
        victim = next(i for i, s in enumerate(run.cluster.slots) if s in ledger and s not in sources)
        run.feed(0)
        run.restart(victim)
        run.cluster.wait_running(60, [run.cluster.slots[victim]])
        result = run.commit(0)
        print(f"first commit after the kill: epoch {result.epoch}, rollback to {result.rolled_back_to}")
        assert result.rolled_back_to == 0
        assert run.state() == expected(run.batches)


def _held_link_ledger(tmp: Path, gate: Path) -> Path:
    """in (source, 1 task) -> mid (pass-through, 1) -> ledger (stateful, 2 tasks); 3 workers put one executor on each.

    Worker-to-worker links are tests.integration.bolts:HeldLinkContext's, steered by files in ``gate``.
    """
    topo = {
        "name": "held-link",
        "conf": {
            "topology.state.provider.config": {"dir": str(tmp / "state")},
            "topology.state.checkpoint.interval.ms": 0,
            "topology.message.timeout.secs": 600,
            "storm.messaging.transport": "tests.integration.bolts:HeldLinkContext",
            "test.link.gate": str(gate),
        },
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": 1},
            {
                "id": "ledger",
                "bolt": "tests.integration.bolts:LedgerBolt",
                "parallelism": 1,
                "tasks": 2,
                "inputs": [{"from": "mid", "grouping": "fields", "fields": ["key"]}],
            },
            {
                "id": "mid",
                "bolt": "spark_storm.worker.bolt:PassThroughBolt",
                "fields": ["key", "n"],
                "parallelism": 1,
                "inputs": [{"from": "in", "grouping": "shuffle"}],
            },
        ],
    }
    path = tmp / "held-link.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def test_a_payload_lost_after_a_stateless_worker_answered_prepare_spoils_the_epoch(tmp_path: Path) -> None:
    """bench.chaos seed 1001 #159: a hole that came after its worker's PREPARE answer was committed.

    A worker with no stateful task answered PREPARE at once, before the epoch's barrier had
    passed its (stateless) tasks.  A payload of the epoch that then arrived undecodable (here
    the replay after a rollback, untracked: no tree fails) marked it dirty too late: the
    epoch committed without those rows, and the rollback the dirt caused went back to that
    very epoch, whose input the commit had truncated (24 rows lost for good).  Now PREPARE
    waits until the barrier passed every local task, and the hole spoils the epoch.
    """
    gate = tmp_path / "gate"
    gate.mkdir()
    with ExactRun(_held_link_ledger(tmp_path, gate), workers=3) as run:
        plan = run.cluster.plan
        (mid,) = plan.component_tasks["mid"]
        on_mid = [t for t, slot in plan.task_slot.items() if slot == plan.task_slot[mid]]
        assert on_mid == [mid], f"mid must be alone on its worker (it holds {on_mid})"
        run.send(0, rows_for(0, 600))
        assert run.commit(0).epoch == 1
        run.send(1, rows_for(1, 600))  # processed, and in the input log as epoch 2 (not committed)
        (gate / f"hold-t{mid}").touch()
        (gate / f"garble-t{mid}").touch()
        statuses = run.coordinator.status().values()
        committed = max(s.committed for s in statuses)
        generation = max(s.generation for s in statuses)
        run.coordinator.rollback(committed, generation + 1, ["a test's rollback: batch 1 is replayed, untracked"])
        results: list[Any] = []
        committer = threading.Thread(target=lambda: results.append(run.commit(1)))
        committer.start()
        # The replay of batch 1 and barrier 2 behind it, held on their way to mid; the first
        # payload of the replay is garbled.  Every PREPARE was sent when the barrier was sealed.
        wait_until(
            lambda: (gate / f"held-barrier-t{mid}-e2").exists(),
            what="barrier 2 held behind the replay, on its way to mid",
            timeout=60,
        )
        assert (gate / f"garbled-t{mid}").exists()
        (gate / f"hold-t{mid}").unlink()  # the garbled payload arrives, then the rest, then the barrier
        committer.join(120)
        assert not committer.is_alive()
        assert results
        print(f"after the hole: epoch {results[0].epoch}, rollback to {results[0].rolled_back_to}")
        assert ledger_state(tmp_path / "state", run.cluster.topology.name, plan) == expected(run.batches)
        assert results[0].rolled_back_to == 1
        run.send(2, rows_for(2, 600))
        run.commit(2)
        assert ledger_state(tmp_path / "state", run.cluster.topology.name, plan) == expected(run.batches)


def test_a_prepare_answered_dirty_ends_the_phase_without_waiting_for_a_barrier_that_never_comes(
    tmp_path: Path,
) -> None:
    """A rebalance under load (tests/cluster/test_windows_cluster.py): a PREPARE waited out its 300 s.

    Two workers answered PREPARE dirty at once (their executors had just moved), and the new
    worker waited for a barrier their tasks never sent, until the deadline: the coordinator
    waited for every answer, and Spark's commit failed.  Now the first dirty answer ends the
    phase: the round is spoiled at once, and the next one rolls back (its PAUSE ends the
    PREPARE still waiting).
    """
    gate = tmp_path / "gate"
    gate.mkdir()
    with ExactRun(_held_link_ledger(tmp_path, gate), workers=3) as run:
        plan = run.cluster.plan
        (mid,) = plan.component_tasks["mid"]
        ledger = plan.component_tasks["ledger"]
        run.send(0, rows_for(0, 600))
        assert run.commit(0).epoch == 1
        for task in ledger:  # barrier 2 will not reach the ledger's worker
            (gate / f"hold-t{task}").touch()
        (gate / f"garble-t{mid}").touch()  # and mid's worker gets a payload it cannot decode: dirty
        run.send(1, rows_for(1, 600))
        wait_until(
            lambda: any(s.dirty for s in run.coordinator.status().values()),
            what="mid's worker dirty after the garbled payload",
            timeout=60,
        )
        generation = max(s.generation for s in run.coordinator.status().values())
        answers: list[dict[str, Any]] = []
        started = time.monotonic()
        phase = threading.Thread(target=lambda: answers.append(run.coordinator.prepare(2, generation)))
        phase.start()
        phase.join(30)  # the coordinator's timeout is 60 s: without the early end it waits for all of it
        assert not phase.is_alive(), "PREPARE waited for the ledger's worker although another answered dirty"
        print(f"PREPARE phase ended in {time.monotonic() - started:.2f}s: {answers[0]}")
        assert any(a["dirty"] for a in answers[0].values())
        for task in ledger:
            (gate / f"hold-t{task}").unlink()
        result = run.commit(1)  # rolls back to 1 and replays: nothing lost, nothing twice
        assert result.rolled_back_to == 1
        assert ledger_state(tmp_path / "state", run.cluster.topology.name, plan) == expected(run.batches)
        phase.join(60)
