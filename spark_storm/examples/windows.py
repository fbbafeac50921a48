"""Windowed bolts: counts per window (Spark's ``groupBy(window(...), key).count()``), top words, results.

Declared in a topology like this (``wordcount-windows.yaml`` beside this module is a whole one)::

    - id: per-user
      bolt: spark_storm.examples.windows:WindowCount
      fields: [start, end, key, count, id]
      window: {length: 60s, sliding: 10s, timestamp_field: ts, lag: 5s, key: user}
      inputs: [{from: events, grouping: fields, fields: [user]}]

Every window's result carries the window's ``id``, stable across replays, so a sink keyed
by it (:class:`WindowResults`, or ``results_to_delta.py --merge-key id``) stays exact.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from spark_storm.bolts import (
    BatchOutputCollector,
    BatchWindow,
    Bolt,
    KeyValueState,
    OutputCollector,
    StatefulBolt,
    TopologyContext,
    Tuple,
    TupleWindow,
    WindowedBatchBolt,
    WindowedBolt,
)

__all__ = ["SplitWithTime", "TopWords", "WindowCount", "WindowCountBatch", "WindowCountTuples", "WindowResults"]

_WORD = re.compile(r"[\w']+")


class SplitWithTime(Bolt):
    """(sentence, ts) -> one (word, ts) per lower-cased word: the event time travels with each word."""

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        ts = tup.get("ts")
        for word in _WORD.findall(str(tup.get("sentence")).lower()):
            self.collector.emit([word, ts], anchors=tup)
        self.collector.ack(tup)


class WindowCount(WindowedBolt):
    """(start, end, key, count, id) per window and key, counted incrementally (one integer per pane and key)."""

    def zero(self) -> int:
        return 0

    def add(self, acc: int, tup: Tuple) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def execute_window(self, window: TupleWindow) -> None:
        self.collector.emit([window.start, window.end, window.key, window.value, window.id])


class WindowCountTuples(WindowedBolt):
    """The same counts from the tuples the window holds (``len(window.tuples)``): Storm's way."""

    def execute_window(self, window: TupleWindow) -> None:
        self.collector.emit([window.start, window.end, window.key, len(window.tuples), window.id])


class WindowCountBatch(WindowedBatchBolt):
    """Per window, the rows of each value of the ``count.by`` field (component conf), counted in pyarrow.

    Sealed panes are combined into partial counts (a ``__n`` column), so a long window holds one
    row per key and pane.
    """

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: BatchOutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.by = str(conf.get("count.by", "key"))

    def combine(self, table: pa.Table) -> pa.Table:
        if "__n" in table.column_names:
            grouped = table.group_by(self.by, use_threads=False).aggregate([("__n", "sum")])
            return grouped.rename_columns([c.replace("__n_sum", "__n") for c in grouped.column_names])
        grouped = table.group_by(self.by, use_threads=False).aggregate([([], "count_all")])
        return grouped.rename_columns([c.replace("count_all", "__n") for c in grouped.column_names])

    def execute_window(self, window: BatchWindow) -> None:
        table = window.table  # every pane of a due window is sealed, so combined
        if "__n" in table.column_names:
            counts = table.group_by(self.by, use_threads=False).aggregate([("__n", "sum")])
            keys, values = counts.column(self.by), counts.column("__n_sum")
        else:
            counts = table.group_by(self.by, use_threads=False).aggregate([([], "count_all")])
            keys, values = counts.column(self.by), counts.column("count_all")
        n = len(keys)
        self.collector.emit_batch(
            {
                "start": pa.array([window.start] * n, pa.int64()),
                "end": pa.array([window.end] * n, pa.int64()),
                "key": keys,
                "count": values,
                "id": pa.array([f"{window.id}/{k}" for k in keys.to_pylist()]),
            }
        )


class TopWords(WindowedBolt):
    """(start, end, top, words, id) per window: its commonest words, its word count and its id.

    ``top`` is JSON ``[[word, count], ...]`` of the ``top.n`` commonest words (component conf).
    """

    def zero(self) -> dict[str, int]:
        return {}

    def add(self, acc: dict[str, int], tup: Tuple) -> dict[str, int]:
        word = tup.get("word")
        acc[word] = acc.get(word, 0) + 1
        return acc

    def merge(self, a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        out = dict(a)
        for word, n in b.items():
            out[word] = out.get(word, 0) + n
        return out

    def execute_window(self, window: TupleWindow) -> None:
        counts = Counter(window.value)
        top = counts.most_common(int(self.conf.get("top.n", 5)))
        self.collector.emit([window.start, window.end, json.dumps(top), sum(counts.values()), window.id])


class WindowResults(StatefulBolt):
    """A sink that keeps every window's result by its id in checkpointed state.

    A window emitted again (a replay) must carry the same values; one that does not is
    counted under the ``conflicts`` key, so a test can assert none ever happened.  With
    ``results.file`` (component conf), each window this process has not seen yet is also
    appended to that file as a JSON line ``{"id": ..., "values": [...]}`` as it arrives,
    before it is committed (the demo prints windows from it as they close); a replay may
    append a window again, with the same values.
    """

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        path = conf.get("results.file")
        self._file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 (closed in cleanup)
        self._written: set[str] = set()

    def init_state(self, state: KeyValueState) -> None:
        self.results = state

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        values = list(tup.values)
        wid = values[-1]
        seen = self.results.get(["window", wid])
        if seen is not None and seen != values:
            self.results.put("conflicts", self.results.get("conflicts", 0) + 1)
            self.results.put(["conflict", wid], [seen, values])
        self.results.put(["window", wid], values)
        if self._file is not None and wid not in self._written:
            self._written.add(wid)
            self._file.write(json.dumps({"id": wid, "values": values}) + "\n")
            self._file.flush()
        self.collector.ack(tup)

    def cleanup(self) -> None:
        if self._file is not None:
            self._file.close()
        super().cleanup()
