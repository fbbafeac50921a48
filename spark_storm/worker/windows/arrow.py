"""Columnar windows: Arrow record batches in panes, shrunk by the bolt's ``combine`` once sealed.

A batch is timed with numpy (a ``timestamp`` or integer column), its late rows are dropped
in one mask and the rest are split by pane; a window is its panes' batches as one table.
In the state, rows are Arrow IPC streams (a sealed, combined pane under txid -1).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.payloads import arrow_stream
from spark_storm.codec.tuples import TupleSource
from spark_storm.errors import ConfigError, WindowError
from spark_storm.state.kv import KeyValueState
from spark_storm.worker.bolt import BatchOutputCollector
from spark_storm.worker.windows.bolts import BatchWindow, WindowedBatchBolt, table_of
from spark_storm.worker.windows.core import NO_TIME, event_ms_array
from spark_storm.worker.windows.engine import WINDOW_PREFIX, Entries, Source, WindowEngine
from spark_storm.worker.windows.kinds import Panes, SessionWindows

__all__ = ["ArrowEngine"]

logger = logging.getLogger(__name__)
_COMBINED = -1  # the txid under which a sealed, combined pane is stored
Times = np.ndarray[Any, np.dtype[np.int64]]


def _ipc_all(batches: Sequence[pa.RecordBatch]) -> list[bytes]:
    """Batches as few IPC streams as their schemas allow (one per run of equal schemas)."""
    out: list[bytes] = []
    run: list[pa.RecordBatch] = []
    for batch in batches:
        if run and not batch.schema.equals(run[0].schema):
            out.append(arrow_stream(run))
            run = []
        run.append(batch)
    if run:
        out.append(arrow_stream(run))
    return out


def _from_ipc(blobs: Sequence[bytes]) -> list[pa.RecordBatch]:
    return [b for blob in blobs for b in pa.ipc.open_stream(pa.py_buffer(blob)).read_all().to_batches()]


def _single(table: pa.Table) -> pa.RecordBatch:
    """One record batch of a table's rows."""
    batches = table.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


class ArrowPanes(Panes):
    """Duration windows of record batches: a pane is its batches (one key, None), combined once sealed."""

    def __init__(self, engine: ArrowEngine) -> None:
        super().__init__(engine)
        self.bolt = engine.bolt
        self.combines = engine.combines
        self.sealed: set[int] = set()
        self._unsaved: dict[int, list[pa.RecordBatch]] = {}
        self._combined: set[int] = set()  # combined since the last checkpoint: stored whole

    def add(self, data: pa.RecordBatch, ts: Times) -> None:
        panes = ts - ts % self.pane
        low, high = int(panes.min()), int(panes.max())
        if low == high:
            self._append(low, data)
        else:
            for p in np.unique(panes):
                self._append(int(p), data.filter(pa.array(panes == p)))
        if self.engine.watermark.value >= self.next_end:
            self.fire()

    def _append(self, pane: int, data: pa.RecordBatch) -> None:
        self.panes.setdefault(pane, {}).setdefault(None, []).append(data)
        self._unsaved.setdefault(pane, []).append(data)
        self.held += data.num_rows

    def seal(self, wm: int) -> None:
        """Combine the panes the watermark passed (no row can join them any more)."""
        if not self.combines:
            return
        for p in sorted(self.panes):
            if p + self.pane > wm:
                break
            if p in self.sealed:
                continue
            self.sealed.add(p)
            rows = table_of(self.panes[p][None])
            combined = self.bolt.combine(rows)
            if combined is None:
                continue
            batches = (combined if isinstance(combined, pa.Table) else pa.Table.from_batches([combined])).to_batches()
            kept = [b for b in batches if b.num_rows] or batches[:1]
            self.held += sum(b.num_rows for b in kept) - rows.num_rows
            self.panes[p][None] = kept
            self._unsaved[p] = list(kept)
            self._drop_chunks(p)
            self.chunks[p] = []
            self._combined.add(p)

    def _drop_chunks(self, pane: int) -> None:
        for txid in self.chunks.pop(pane, ()):
            self.engine.state.delete([WINDOW_PREFIX, "b", pane, txid])

    def evict(self, pane: int) -> None:
        self.held -= sum(b.num_rows for b in self.panes.pop(pane)[None])
        self._unsaved.pop(pane, None)
        self.sealed.discard(pane)
        self._combined.discard(pane)
        self._drop_chunks(pane)

    def save(self, state: KeyValueState, txid: int) -> None:
        for pane, batches in sorted(self._unsaved.items()):
            if pane not in self.panes or not batches:
                continue
            stored = _COMBINED if pane in self._combined else txid
            state.put([WINDOW_PREFIX, "b", pane, stored], _ipc_all(batches))
            self.chunks.setdefault(pane, []).append(stored)
        self._unsaved.clear()
        self._combined.clear()

    def load(self, entries: Entries, meta: Mapping[str, Any]) -> None:
        for pane, txid, blobs in sorted((int(k[1]), int(k[2]), v) for k, v in entries if k[0] == "b"):
            batches = _from_ipc(blobs)
            self.panes.setdefault(pane, {}).setdefault(None, []).extend(batches)
            self.chunks.setdefault(pane, []).append(txid)
            self.held += sum(b.num_rows for b in batches)
        self.sealed = {int(p) for p in meta.get("sealed", [])} & set(self.panes)


class ArrowCounts:
    """Count windows of rows (the task's, unkeyed): the last ``length`` rows, fired every ``sliding``.

    In event time, rows wait until the watermark passes them and join in time order.
    """

    def __init__(self, engine: ArrowEngine) -> None:
        self.engine = engine
        self._rows: list[pa.RecordBatch] = []  # the last length + sliding rows counted
        self._row_ts: list[Times] = []
        self._pending: list[pa.RecordBatch] = []
        self._pending_ts: list[Times] = []
        self._since = 0
        self._fires = 0
        self._dirty = False
        self.held = 0

    def evaluate(self) -> None:
        """Rows pending the watermark are released as batches arrive, not by ticks."""

    def add(self, data: pa.RecordBatch, ts: Times) -> None:
        self._dirty = True
        try:
            if not self.engine.event_time:
                self._count(data, ts)
                return
            self._pending.append(data)
            self._pending_ts.append(ts)
            table = table_of(self._pending)
            times = np.concatenate(self._pending_ts)
            ready = times < self.engine.watermark.value
            if not ready.any():
                return
            order = np.argsort(times[ready], kind="stable")
            released = table.filter(pa.array(ready)).take(pa.array(order))
            rest = ~ready
            self._pending = table.filter(pa.array(rest)).to_batches()
            self._pending_ts = [times[rest]]
            self._count(_single(released), times[ready][order])
        finally:
            self.held = sum(b.num_rows for b in self._rows) + sum(b.num_rows for b in self._pending)

    def _count(self, data: pa.RecordBatch, ts: Times) -> None:
        engine = self.engine
        length, slide = engine.spec.length, engine.spec.sliding
        self._rows.append(data)
        self._row_ts.append(ts)
        table = table_of(self._rows)
        times = np.concatenate(self._row_ts)
        total = table.num_rows
        held_before = total - data.num_rows
        # windows end after every `slide` rows counted; `since` rows were counted before this batch
        ends = range(held_before + slide - self._since, total + 1, slide)
        windows = []
        last_end = held_before - self._since
        for end in ends:
            begin = max(0, end - length)
            self._fires += 1
            rows = table.slice(begin, end - begin)
            new = table.slice(max(begin, end - slide), end - max(begin, end - slide))
            prev_begin = max(0, last_end - length)
            expired = table.slice(prev_begin, max(0, begin - prev_begin)) if last_end > 0 else table.slice(0, 0)
            wid = f"{engine.prefix}/#{self._fires}"
            start, stop = int(times[begin]), int(times[end - 1]) + 1
            windows.append(BatchWindow(rows, start, stop, None, wid, new.to_batches(), expired.to_batches()))
            last_end = end
        failure = engine.call(windows)
        self._since = (self._since + data.num_rows) % slide
        keep = min(total, length + slide)
        if total > keep:
            table, times = table.slice(total - keep), times[total - keep :]
        self._rows = [_single(table)] if table.num_rows else []
        self._row_ts = [times]
        if failure is not None:
            raise failure

    def save(self, state: KeyValueState, txid: int) -> None:
        if self._dirty:
            state.put(
                [WINDOW_PREFIX, "cb"],
                {
                    "rows": _ipc_all(self._rows),
                    "ts": [t.tobytes() for t in self._row_ts],
                    "pending": _ipc_all(self._pending),
                    "pending_ts": [t.tobytes() for t in self._pending_ts],
                    "since": self._since,
                    "fires": self._fires,
                },
            )
            self._dirty = False

    def load(self, entries: Entries, meta: Mapping[str, Any]) -> None:
        for key, value in entries:
            if key[0] == "cb":
                self._rows = _from_ipc(value["rows"])
                self._row_ts = [np.frombuffer(t, dtype=np.int64).copy() for t in value["ts"]]
                self._pending = _from_ipc(value["pending"])
                self._pending_ts = [np.frombuffer(t, dtype=np.int64).copy() for t in value["pending_ts"]]
                self._since = int(value["since"])
                self._fires = int(value["fires"])
        self.held = sum(b.num_rows for b in self._rows) + sum(b.num_rows for b in self._pending)


class ArrowEngine(WindowEngine[BatchWindow]):
    """The window engine of a :class:`WindowedBatchBolt` task: record batches in windows."""

    noun = "batches"
    kind: ArrowPanes | ArrowCounts | SessionWindows

    def __init__(self, bolt: WindowedBatchBolt, spec: Any, context: Any, collector: BatchOutputCollector) -> None:
        if len(spec.key) > 1 or (spec.key and spec.kind != "session"):
            msg = (
                f"component {context.component_id!r}: a WindowedBatchBolt gets each window as one table of all "
                f"its keys; 'key' ({list(spec.key)}) is for session windows, one field. Group the table in "
                "execute_window (table.group_by(..., use_threads=False) keeps it deterministic) instead"
            )
            raise ConfigError(msg)
        self.combines = type(bolt).combine is not WindowedBatchBolt.combine
        super().__init__(bolt, spec, context, collector)

    def _no_key(self, where: str, source: TupleSource, missing: list[str]) -> str:
        return f"{where} have no key field {missing[0]!r}"

    def _kind(self) -> ArrowPanes | ArrowCounts | SessionWindows:
        kind = self.spec.kind
        return (
            ArrowPanes(self) if kind == "duration" else ArrowCounts(self) if kind == "count" else SessionWindows(self)
        )

    # --- input ------------------------------------------------------------------------------
    def execute(self, batch: ColumnarBatch) -> None:
        """Time the batch's rows, drop the late and timeless ones, place the rest in their windows; ack it."""
        source = batch.source
        if source.is_tick:
            self.tick()
            return
        info = self._src(source)
        kept = self._times(info, batch)
        if kept is not None:
            data, ts = kept
            self.anchoring.anchor = batch
            kind = self.kind
            if isinstance(kind, SessionWindows):
                self._sessions(kind, info, data, ts)
            else:
                kind.add(data, ts)
        self.collector.ack(batch)

    def _times(self, info: Source, batch: ColumnarBatch) -> tuple[pa.RecordBatch, Times] | None:
        """Return the batch's rows that are neither late nor timeless, with their times (None: no rows left)."""
        data = batch.data
        if info.ts < 0:
            return data, np.full(data.num_rows, self._clock(), dtype=np.int64)
        column = data.column(info.ts)
        if column.null_count:
            dropped = column.null_count
            self.bad_times += dropped
            self._report(
                f"event time field {self.spec.timestamp_field!r} is null in {dropped} rows (dropped; "
                f"{self.bad_times} so far)"
            )
            data = data.filter(pc.is_valid(column))
            column = data.column(info.ts)
        try:
            ts = event_ms_array(column, self.spec.timestamp_field or "")
        except WindowError as exc:
            self.bad_times += data.num_rows
            self._report(f"{exc} ({data.num_rows} rows dropped)")
            return None
        wm = self.watermark
        if not wm.active[info.slot]:
            wm.sent(info.slot)
        if wm.value > NO_TIME and len(ts):
            late = ts < wm.value
            if late.any():
                self.late += int(late.sum())
                if self.spec.late_stream is not None:
                    self.collector.emit_batch(data.filter(pa.array(late)), self.spec.late_stream, anchors=batch)
                keep = ~late
                data, ts = data.filter(pa.array(keep)), ts[keep]
        if len(ts):
            newest = int(ts.max())
            if newest > wm.maxes[info.slot]:
                wm.advance(info.slot, newest)
        return (data, ts) if data.num_rows else None

    def _report(self, text: str) -> None:
        if self.bad_times < 1000 or self.bad_times % 100_000 == 0:
            logger.error("%s: %s", self.prefix, text)

    def _sessions(self, kind: SessionWindows, info: Source, data: pa.RecordBatch, ts: Times) -> None:
        """Split each key's rows where the gap between events reaches the session gap; place each run."""
        if info.key >= 0:
            rows = pa.table({"k": data.column(info.key), "i": pa.array(np.arange(data.num_rows))})
            groups = rows.group_by("k", use_threads=False).aggregate([("i", "list")])
            per_key: list[tuple[Any, list[int]]] = list(
                zip(groups.column("k").to_pylist(), groups.column("i_list").to_pylist(), strict=True)
            )
        else:
            per_key = [(None, list(range(data.num_rows)))]
        for key, indices in per_key:
            idx = np.asarray(indices, dtype=np.int64)
            times = ts[idx]
            order = np.argsort(times, kind="stable")
            idx, times = idx[order], times[order]
            cuts = np.flatnonzero(np.diff(times) >= self.spec.length) + 1
            for part_idx, part_ts in zip(np.split(idx, cuts), np.split(times, cuts), strict=True):
                kind.place(key, int(part_ts[0]), int(part_ts[-1]), data.take(pa.array(part_idx)))
        kind.evaluate()

    # --- what a window holds ------------------------------------------------------------------
    def window(
        self, start: int, end: int, key: Any, wid: str, parts: list[Any], new: Any = None, expired: Any = None
    ) -> BatchWindow | None:
        batches = [b for part in parts for b in part]
        if not batches:
            return None
        if new is not None:
            new = [b for part in new for b in part]
            expired = [b for part in expired for b in part]
        return BatchWindow(table_of(batches), start, end, key, wid, new, expired)

    def encode(self, payload: list[pa.RecordBatch]) -> list[bytes]:
        return _ipc_all(payload)

    def decode(self, value: list[bytes]) -> list[pa.RecordBatch]:
        return _from_ipc(value)

    def _meta(self) -> dict[str, Any]:
        return {"sealed": sorted(self.kind.sealed) if isinstance(self.kind, ArrowPanes) else []}
