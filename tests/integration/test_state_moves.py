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
from tests.integration.test_state_exact import Ledger
from tests.support.ledger import expected

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
