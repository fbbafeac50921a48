"""Exact state through failures, with real worker processes: a keyed ledger fed like Spark feeds it.

The test plays both of Spark's parts: a writer that sends each batch as delivery groups and
retries what fails, and the driver's commit, which runs a checkpoint round (the
coordinator in spark_storm.state.protocol).  After SIGKILLs and restarts, every key's
committed [count, sum] must equal the answer computed from the rows.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from spark_storm.state.protocol import Coordinator
from spark_storm.transport import make_context
from spark_storm.worker.local_cluster import LocalCluster
from tests.helpers import wait_until
from tests.support.ledger import GroupWriter, expected, ledger_state, ledger_topology, rows_for

pytestmark = pytest.mark.integration

OVERRIDES = {"storm.messaging.tcp.min_wait_ms": 20, "storm.messaging.tcp.max_wait_ms": 200}


class Ledger:
    def __init__(self, tmp: Path, workers: int = 2, *, batch: bool = False, conf: dict[str, Any] | None = None) -> None:
        self.tmp = tmp
        self.topology = ledger_topology(tmp, batch=batch, conf=conf)
        self.cluster = LocalCluster(str(self.topology), workers, overrides=OVERRIDES)
        self.ctx = make_context({"storm.messaging.transport": "tcp", **OVERRIDES})
        self.batches: dict[int, list[list[Any]]] = {}

    def __enter__(self) -> Ledger:
        self.cluster.start()
        self.conns = {s: self.ctx.connect(self.cluster.topology.name, s.host, s.port) for s in self.cluster.slots}
        for conn in self.conns.values():
            assert conn.wait_ready(30)
        self.writer = GroupWriter(self.cluster.plan, self.conns)
        self.coordinator = Coordinator("test", lambda: {str(s): c for s, c in self.conns.items()}, 60.0, 3)
        return self

    def __exit__(self, *exc: object) -> None:
        self.ctx.term()
        self.cluster.stop()

    def feed(self, batch: int, n: int = 600) -> None:
        rows = rows_for(batch, n)
        self.batches[batch] = rows
        self.writer.send(batch, rows)

    def commit(self, batch: int) -> Any:
        return self.coordinator.checkpoint({self.writer.query: batch})

    def restart(self, index: int) -> None:
        slot = self.cluster.slots[index]
        self.cluster.kill(slot)
        self.cluster.start_worker(slot)

    def state(self) -> dict[str, list[int]]:
        return ledger_state(self.tmp / "state", self.cluster.topology.name, self.cluster.plan)

    def health(self, index: int) -> dict[str, Any]:
        hb = self.cluster.heartbeat(self.cluster.slots[index])
        if not hb or not hb.get("metrics_port"):
            return {}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{hb['metrics_port']}/health", timeout=5) as r:
                data: dict[str, Any] = json.loads(r.read())
                return data
        except OSError:
            return {}

    def accepted(self, index: int) -> int:
        return int(self.health(index).get("counters", {}).get("source_tuples_in", 0))

    def with_source(self, *, other_than: int | None = None) -> int:
        """Index of a worker that runs a source task (the plan decides which do)."""
        plan = self.cluster.plan
        hosting = {plan.task_slot[t] for t in plan.component_tasks["in"]}
        return next(i for i, s in enumerate(self.cluster.slots) if s in hosting and i != other_than)

    def kill_mid_batch(self, victim: int, batch: int, n: int) -> threading.Thread:
        """Start sending ``batch`` and SIGKILL+restart ``victim`` once it is accepting that batch's rows."""
        rows = rows_for(batch, n)
        self.batches[batch] = rows
        before = self.accepted(victim)
        sender = threading.Thread(target=self.writer.send, args=(batch, rows))
        sender.start()
        wait_until(lambda: self.accepted(victim) > before, what=f"worker {victim} accepting batch {batch}", timeout=30)
        self.restart(victim)
        return sender


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
    with Ledger(tmp_path, conf={"topology.state.checkpoint.interval.ms": 300}) as run:
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
    with Ledger(tmp_path, conf=conf) as run:
        for batch in range(3):
            run.feed(batch, 1500)
        victim = run.with_source()
        sender = run.kill_mid_batch(victim, 3, 1500)
        sender.join(180)
        assert not sender.is_alive()
        result = run.commit(3)
        print(f"full queues: epoch {result.epoch}, rollback to {result.rolled_back_to}")
        assert run.state() == expected(run.batches)
