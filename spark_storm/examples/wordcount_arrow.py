r"""The columnar wordcount: the same topology as ``wordcount``, with batch bolts.

Sentences arrive as Arrow columns (from Spark, unchanged), are split and lower-cased with
``pyarrow.compute`` a whole batch at a time, counted with a hash aggregate per batch
(``value_counts``) into running counts, and reported — no Python object per word except
one dict entry per distinct word of a batch.

Words are the runs of letters, digits, ``_`` and ``'`` of the lower-cased sentence, as in
the tuple wordcount (``[\w']+``) for the ASCII text of the bundled corpus.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_storm.bolts import (
    BatchBolt,
    BatchOutputCollector,
    ColumnarBatch,
    KeyValueState,
    StatefulBatchBolt,
    TopologyContext,
)
from spark_storm.examples.wordcount import open_report

__all__ = ["CountBatchBolt", "ReportBatchBolt", "SplitBatchBolt", "StatefulCountBatchBolt"]

_SEPARATORS = r"[^\p{L}\p{N}_']+"  # RE2: anything that is not part of a word


class SplitBatchBolt(BatchBolt):
    """sentence batch -> word batch (lower-cased, split, empty strings dropped)."""

    def execute_batch(self, batch: ColumnarBatch) -> None:
        if batch.is_tick:
            return
        lowered = pc.utf8_lower(batch.column("sentence").cast(pa.string()))
        words = pc.list_flatten(pc.split_pattern_regex(lowered, _SEPARATORS))
        words = pc.filter(words, pc.not_equal(words, ""))
        self.collector.emit_batch({"word": words}, anchors=batch)
        self.collector.ack(batch)


class CountBatchBolt(BatchBolt):
    """word batch -> (word, running count) for each distinct word of the batch."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: BatchOutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.counts: dict[str, int] = {}

    def execute_batch(self, batch: ColumnarBatch) -> None:
        if batch.is_tick:
            return
        per_word = pc.value_counts(batch.column("word"))
        words = per_word.field("values").to_pylist()
        counts = self.counts
        totals = []
        for word, n in zip(words, per_word.field("counts").to_pylist(), strict=True):
            total = counts.get(word, 0) + n
            counts[word] = total
            totals.append(total)
        self.collector.emit_batch(
            {"word": pa.array(words, pa.string()), "count": pa.array(totals, pa.int64())}, anchors=batch
        )
        self.collector.ack(batch)


class StatefulCountBatchBolt(StatefulBatchBolt):
    """word batch -> (word, running count), counts in checkpointed state (vectorised get_many/put_many)."""

    def init_state(self, state: KeyValueState) -> None:
        self.counts = state

    def execute_batch(self, batch: ColumnarBatch) -> None:
        if batch.is_tick:
            return
        per_word = pc.value_counts(batch.column("word"))
        words = per_word.field("values")
        totals = pc.add(self.counts.get_many(words, 0), per_word.field("counts"))
        self.counts.put_many(words, totals)
        self.collector.emit_batch({"word": words.cast(pa.string()), "count": totals.cast(pa.int64())}, anchors=batch)
        self.collector.ack(batch)


class ReportBatchBolt(BatchBolt):
    """(word, count) batches -> the latest count per word; a ``{"final": {...}}`` JSON line at cleanup.

    Writes ``<report.dir>/<topology>-<task>.jsonl`` like the tuple ``ReportBolt``'s
    final snapshot (a line per update would be millions of lines per second here).
    """

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: BatchOutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.path, self._out = open_report(conf, context)
        self.latest: dict[str, int] = {}

    def execute_batch(self, batch: ColumnarBatch) -> None:
        if batch.is_tick:
            return
        latest = self.latest
        for word, count in zip(batch.column("word").to_pylist(), batch.column("count").to_pylist(), strict=True):
            if count > latest.get(word, 0):
                latest[word] = count
        self.collector.ack(batch)

    def cleanup(self) -> None:
        self._out.write(json.dumps({"final": self.latest}) + "\n")
        self._out.close()
