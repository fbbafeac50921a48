"""The wordcount topology's bolts: split sentences, count words, report counts.

``ReportBolt`` appends one JSON line per count update to
``<report.dir>/<topology>-<task>.jsonl`` (component conf ``report.dir``, default the
current directory) and writes a final ``{"final": {...}}`` snapshot at cleanup.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from spark_storm.bolts import Bolt, KeyValueState, OutputCollector, StatefulBolt, TopologyContext, Tuple

__all__ = ["CountBolt", "ReportBolt", "SplitBolt", "StatefulCountBolt", "open_report", "report_line"]

_WORD = re.compile(r"[\w']+")


class SplitBolt(Bolt):
    """sentence -> one tuple per lower-cased word."""

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:  # the topology's tick tuples carry no sentence
            return
        for word in _WORD.findall(str(tup.get("sentence")).lower()):
            self.collector.emit([word], anchors=tup)
        self.collector.ack(tup)


class CountBolt(Bolt):
    """word -> (word, running count); fields grouping makes each word's count exact."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.counts: Counter[str] = Counter()

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        word = tup.get("word")
        self.counts[word] += 1
        self.collector.emit([word, self.counts[word]], anchors=tup)
        self.collector.ack(tup)


class StatefulCountBolt(StatefulBolt):
    """word -> (word, running count), counts in checkpointed state: exact through failures (docs/design/state.md)."""

    def init_state(self, state: KeyValueState) -> None:
        self.counts = state

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        word = tup.get("word")
        n = self.counts.get(word, 0) + 1
        self.counts.put(word, n)
        self.collector.emit([word, n], anchors=tup)
        self.collector.ack(tup)


def open_report(conf: Mapping[str, Any], context: TopologyContext) -> tuple[Path, TextIO]:
    """Open ``<report.dir>/<topology>-<task>.jsonl`` for appending (report.dir defaults to ".")."""
    directory = Path(str(conf.get("report.dir", ".")))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{context.topology_id}-{context.task_id}.jsonl"
    return path, path.open("a", encoding="utf-8")


_quote = json.encoder.encode_basestring_ascii  # what json.dumps does with a str, without an encoder per call


def report_line(word: Any, count: Any) -> str:
    """Return the line ``json.dumps({"word": word, "count": count})`` makes, without a dict and encoder per update.

    The report bolt runs one task that every update goes through: this is most of its time.
    """
    if type(word) is str and type(count) is int:  # the wordcount's own updates: one f-string
        return f'{{"word": {_quote(word)}, "count": {count}}}\n'
    quoted = _quote(word) if type(word) is str else json.dumps(word)
    number = str(count) if type(count) is int else json.dumps(count)
    return '{"word": ' + quoted + ', "count": ' + number + "}\n"


class ReportBolt(Bolt):
    """(word, count) -> JSON lines; keeps the latest count per word.

    Its one task sees every update, so the lines are written together: at each tick (the
    example topology ticks every second), every ``HELD_LINES`` lines, and at cleanup.
    """

    #: Lines held at most between two writes (a topology without ticks still writes).
    HELD_LINES = 10_000

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.path, self._out = open_report(conf, context)
        self.latest: dict[str, int] = {}
        self._lines: list[str] = []

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            self._write()
            return
        word, count = tup.values  # the count bolt's fields, in order: (word, count)
        latest = self.latest
        if count > latest.get(word, 0):
            latest[word] = count
        lines = self._lines
        lines.append(report_line(word, count))
        if len(lines) >= self.HELD_LINES:
            self._write()
        self.collector.ack(tup)

    def _write(self) -> None:
        if self._lines:
            self._out.write("".join(self._lines))
            self._lines = []
        self._out.flush()

    def cleanup(self) -> None:
        self._write()
        self._out.write(json.dumps({"final": self.latest}) + "\n")
        self._out.close()
