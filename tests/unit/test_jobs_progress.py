"""Reading a streaming query's progress the same way on classic Spark and over Spark Connect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spark_storm.spark.jobs import cut_batch, input_rows, stop_between_batches


class ConnectProgress(dict[str, Any]):
    """What pyspark 4's StreamingQueryProgress is over Connect: the key is None, the property sums the sources."""

    @property
    def numInputRows(self) -> int:  # pyspark's name
        return sum(s["numInputRows"] for s in self["sources"])


def test_input_rows_reads_classic_dicts_and_connect_progress() -> None:
    assert input_rows({"numInputRows": 7}) == 7
    assert input_rows({"numInputRows": None}) == 0
    connect = ConnectProgress(numInputRows=None, sources=[{"numInputRows": 3}, {"numInputRows": 4}])
    assert connect["numInputRows"] is None
    assert input_rows(connect) == 7


class FakeQuery:
    """A query whose micro-batch runs for ``busy_polls`` status reads (a StreamingQuery's status/stop)."""

    id = "q-test"

    def __init__(self, busy_polls: int | None) -> None:
        self.busy_polls = busy_polls
        self.stopped_while_active: bool | None = None

    @property
    def status(self) -> dict[str, Any]:
        active = self.busy_polls is None or self.busy_polls > 0
        if self.busy_polls:
            self.busy_polls -= 1
        return {"isTriggerActive": active}

    def stop(self) -> None:
        self.stopped_while_active = self.busy_polls is None or self.busy_polls > 0


def test_stop_between_batches_waits_for_the_batch_to_end() -> None:
    query = FakeQuery(busy_polls=5)
    assert stop_between_batches(query, timeout_s=10)
    assert query.stopped_while_active is False


def test_stop_between_batches_gives_up_at_its_deadline_when_batches_never_end() -> None:
    query = FakeQuery(busy_polls=None)  # every batch outlasts the trigger interval
    assert not stop_between_batches(query, timeout_s=0.05)
    assert query.stopped_while_active is True


def _checkpoint(root: Path, begun: int, committed: int) -> Path:
    for part, last in (("offsets", begun), ("commits", committed)):
        (root / part).mkdir(parents=True, exist_ok=True)
        for n in range(last + 1):
            (root / part / str(n)).write_text("v1\n")
            (root / part / f".{n}.crc").write_text("")
    return root


def test_a_batch_that_began_just_before_the_stop_counts_as_cut(tmp_path: Path) -> None:
    # The query looked idle, but while batches run behind their trigger the next one begins at
    # once: the stop cut it (a full run saw "processed 12,500, sent 12,000" in the demo).
    cut = _checkpoint(tmp_path / "cut", begun=6, committed=5)
    assert cut_batch(cut) == 6
    assert not stop_between_batches(FakeQuery(busy_polls=0), timeout_s=10, checkpoint=cut)
    whole = _checkpoint(tmp_path / "whole", begun=6, committed=6)
    assert cut_batch(whole) is None
    assert stop_between_batches(FakeQuery(busy_polls=0), timeout_s=10, checkpoint=whole)
    assert cut_batch(tmp_path / "never-started") is None
