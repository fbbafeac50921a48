"""The bundled example bolts' own logic, without a worker."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spark_storm.examples.wordcount import report_line


@pytest.mark.parametrize(
    ("word", "count"),
    [
        ("the", 1),
        ("don't", 12345678901234),
        ('a "quoted" \\ word', 0),
        ("naïve café 日本", 7),
        ("tab\there\nline", -3),
        (None, 2.5),
        (7, True),
    ],
)
def test_the_report_line_is_what_json_dumps_writes(word: Any, count: Any) -> None:
    assert report_line(word, count) == json.dumps({"word": word, "count": count}) + "\n"


def test_the_report_bolt_writes_every_update_at_ticks_when_many_are_held_and_at_cleanup(tmp_path: Path) -> None:
    from spark_storm.codec.tuples import TICK_SOURCE, Tuple, TupleSource
    from spark_storm.examples.wordcount import ReportBolt

    acked: list[Tuple] = []
    context = SimpleNamespace(topology_id="wc", task_id=5)
    collector = SimpleNamespace(ack=acked.append)
    bolt = ReportBolt()
    bolt.HELD_LINES = 3
    bolt.prepare({"report.dir": str(tmp_path)}, context, collector)  # type: ignore[arg-type]
    source = TupleSource("count", 1, "default", ["word", "count"])
    path = tmp_path / "wc-5.jsonl"

    def lines() -> list[Any]:
        return [json.loads(line) for line in path.read_text().splitlines()]

    bolt.execute(Tuple(["a", 1], source))
    bolt.execute(Tuple(["b", 1], source))
    assert lines() == []  # held
    bolt.execute(Tuple([time.time()], TICK_SOURCE))
    assert lines() == [{"word": "a", "count": 1}, {"word": "b", "count": 1}]
    for n in (2, 3, 4):
        bolt.execute(Tuple(["a", n], source))
    assert len(lines()) == 5  # three held: written without a tick
    bolt.execute(Tuple(["c", 1], source))
    bolt.execute(Tuple(["a", 2], source))  # an older count (a replay after a rollback): the latest stays 4
    bolt.cleanup()
    assert lines()[-3:] == [{"word": "c", "count": 1}, {"word": "a", "count": 2}, {"final": {"a": 4, "b": 1, "c": 1}}]
    assert len(acked) == 7
