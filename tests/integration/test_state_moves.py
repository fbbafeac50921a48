"""Exact state when a source task moves between workers: its input log has had two writers.

In cluster mode a rebalance or a reassignment moves a source task while groups arrive: the
new worker opens the task's input log (shared on the host's disk, or in Redis), the old one
may still log a group, and the sender's retry of it (keyed the same, on the new assignment)
is logged again by the new worker, which did not see it.  The log then holds that group
twice; the rollback that every move triggers must replay it once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_storm.state.files import EmbeddedBackend
from tests.support.ledger import Ledger, expected, rows_for

pytestmark = pytest.mark.integration


def test_a_group_logged_by_the_old_and_the_new_worker_of_a_task_is_replayed_once(tmp_path: Path) -> None:
    with Ledger(tmp_path) as run:
        run.feed(0)
        assert run.commit(0).epoch == 1
        run.feed(1)  # processed live and logged (epoch 2), not committed
        plan = run.cluster.plan
        task = plan.component_tasks["in"][0]
        backend = EmbeddedBackend(run.cluster.topology.name, tmp_path / "state")
        old_owner = backend.input_log(task, "old-owner")
        groups = [r for r in old_owner.entries(1) if r.key is not None]
        assert groups, f"no group of batch 1 in task {task}'s log"
        old_owner.append(groups[0], 2)  # the same group, logged by the task's other worker
        backend.close()
        run.restart(run.cluster.slots.index(plan.task_slot[task]))  # a move makes the worker dirty, as this does
        result = run.commit(1)
        assert result.rolled_back_to == 1
        health = [run.health(i).get("checkpoint") or {} for i in range(len(run.cluster.slots))]
        print(f"replayed {sum(h.get('replayed_records', 0) for h in health)} input-log records after the rollback")
        assert run.state() == expected(run.batches)


def test_a_worker_that_rejoins_clean_after_a_rollback_is_brought_to_the_new_generation(tmp_path: Path) -> None:
    """A restarted (or newly assigned) worker starts at generation 0 with nothing to restore.

    After a rollback the others are at generation 1: they drop what it emits, and it refuses
    a PREPARE of generation 1 ("roll back first").  The round rolls everyone back together
    first, rather than failing once and counting on the failed PREPARE to leave the others
    past the committed epoch.
    """
    # what the newcomer emits is dropped: its groups are acked when the writer's resend is delivered
    # again (they are in its input log), after this long instead of 30 s
    with Ledger(tmp_path, workers=3, conf={"storm.messaging.server.ledger.redeliver.after.ms": 2000}) as run:
        run.feed(0)
        run.commit(0)
        sender = run.kill_mid_batch(run.with_source(), 1, 900)
        sender.join(120)
        assert run.commit(1).rolled_back_to == 1  # generation 1 everywhere
        plan = run.cluster.plan
        stateful = {plan.task_slot[t] for t in plan.component_tasks["ledger"]}
        clean = next(i for i, s in enumerate(run.cluster.slots) if s not in stateful)  # a source and mid only
        run.restart(clean)  # its input log was truncated by the commit: it restores nothing, it is not dirty
        run.cluster.wait_running(60, [run.cluster.slots[clean]])
        assert (run.health(clean).get("checkpoint") or {}).get("generation") == 0
        run.batches[2] = rows_for(2, 600)
        run.writer.send(2, run.batches[2], ack_wait=1.0)  # its groups are acked once delivered again
        result = run.commit(2)
        print(f"rejoin: epoch {result.epoch}, rollback to {result.rolled_back_to}, attempts {result.attempts}")
        assert (result.rolled_back_to, result.attempts) == (2, 1)  # not a failed round first
        assert run.state() == expected(run.batches)
