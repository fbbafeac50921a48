"""Windows through worker processes: exact window results through SIGKILLs, fed as Spark feeds them.

in (source, 2 tasks) -> mid (pass-through, shuffle) -> per-user (WindowCount: sliding event-time
windows per user, 4 tasks) -> results (WindowResults: each window's result by id, in state).
The answer is Spark's ``window()`` semantics computed by hand (tests/support/windows.py); the
Spark tier checks the same against Spark itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.ledger import ExactRun
from tests.support.windows import flush_rows, rows_of, spark_sessions, spark_windows, window_results, window_topology

pytestmark = pytest.mark.integration


class Windows(ExactRun):
    def __init__(self, tmp: Path, window: dict[str, Any], workers: int = 2, **kw: Any) -> None:
        super().__init__(window_topology(tmp, window, **kw), workers)
        self.tmp = tmp

    def results(self) -> tuple[dict[tuple[int, int, Any], int], int]:
        return window_results(self.tmp / "state", self.cluster.topology.name, self.cluster.plan)


SLIDING = {"length": "6s", "sliding": "2s", "timestamp_field": "ts", "lag": "3s", "key": "user"}


def _data_rows(run: Windows) -> list[list[Any]]:
    return [r for rows in run.batches.values() for r in rows if r[2] >= 0]


def test_windows_through_workers_equal_sparks_without_failures(tmp_path: Path) -> None:
    with Windows(tmp_path, SLIDING) as run:
        for batch in range(4):
            run.send(batch, rows_of(batch))
            run.commit(batch)
        run.send(4, flush_rows(4))
        run.commit(4)
        got, conflicts = run.results()
    assert got == spark_windows(_data_rows(run), 6000, 2000)
    assert conflicts == 0


@pytest.mark.parametrize(
    "window",
    [SLIDING, {"session_gap": "700ms", "timestamp_field": "ts", "lag": "3s", "key": "user"}],
    ids=["sliding", "session"],
)
def test_a_worker_sigkilled_mid_window_resumes_its_windows_exactly(tmp_path: Path, window: dict[str, Any]) -> None:
    with Windows(tmp_path, window) as run:
        for batch in range(3):
            run.send(batch, rows_of(batch))
            run.commit(batch)
        plan = run.cluster.plan
        hosting = {plan.task_slot[t] for t in plan.component_tasks["per-user"]}
        victim = next(i for i, s in enumerate(run.cluster.slots) if s in hosting)
        sender = run.kill_mid_batch(victim, 3, rows_of(3))  # windows open across the kill
        sender.join(120)
        assert not sender.is_alive()
        result = run.commit(3)
        assert result.rolled_back_to is not None
        for batch in (4, 5):
            run.send(batch, rows_of(batch))
            run.commit(batch)
        run.send(6, flush_rows(6))
        run.commit(6)
        got, conflicts = run.results()
    rows = _data_rows(run)
    want = spark_windows(rows, 6000, 2000) if "length" in window else spark_sessions(rows, 700)
    assert got == want
    assert conflicts == 0, "a window was emitted again with other values"


def test_two_sigkills_of_the_window_worker_still_end_exact(tmp_path: Path) -> None:
    with Windows(tmp_path, SLIDING, bolt="WindowCountTuples") as run:
        run.send(0, rows_of(0))
        run.commit(0)
        plan = run.cluster.plan
        hosting = {plan.task_slot[t] for t in plan.component_tasks["per-user"]}
        victims = [i for i, s in enumerate(run.cluster.slots) if s in hosting]
        for batch, victim in zip((1, 2), (victims[0], victims[-1]), strict=True):
            sender = run.kill_mid_batch(victim, batch, rows_of(batch))
            sender.join(120)
            run.commit(batch)
        run.send(3, flush_rows(3))
        run.commit(3)
        got, conflicts = run.results()
    assert got == spark_windows(_data_rows(run), 6000, 2000)
    assert conflicts == 0
