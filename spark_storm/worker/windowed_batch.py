"""Columnar windows: ``WindowedBatchBolt`` gets each window as one Arrow table.

::

    class PerUserCount(WindowedBatchBolt):
        def execute_window(self, window: BatchWindow) -> None:
            counts = window.table.group_by("user").aggregate([("user", "count")])
            self.collector.emit_batch({
                "start": [window.start] * counts.num_rows, "end": [window.end] * counts.num_rows,
                "user": counts["user"], "n": counts["user_count"],
            })

Rows are placed in panes with numpy (event time from a ``timestamp`` or integer column),
late rows are filtered out in one mask, and a window is its panes' record batches as one
table: windowed aggregates run in pyarrow, never per row.  A window covers every key of
the task (its key group): group inside ``execute_window``.  Session windows (``session_gap``
with ``key``) give one table per session and key.

**Bounded memory.**  Override ``combine(table)`` to shrink a pane once it is sealed (the
watermark passed its end, so no row can join it): e.g. a partial ``group_by`` count; a
window then gets its sealed panes' combined rows, so a long window holds a few rows per
pane and key instead of every row.  ``execute_window`` must accept combined rows.

State, exactness and acks are as for :class:`~spark_storm.worker.windowed.WindowedBolt`:
panes are checkpointed as Arrow IPC, a batch is acked when its rows joined their panes,
and emits are anchored to the batch whose arrival closed the window.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.payloads import arrow_stream
from spark_storm.codec.tuples import TupleSource
from spark_storm.errors import ConfigError, WindowError
from spark_storm.reports import WindowMetrics
from spark_storm.state.kv import KeyValueState
from spark_storm.topology.model import DEFAULT_STREAM
from spark_storm.topology.windows import WindowSpec
from spark_storm.worker.bolt import BatchBolt, BatchOutputCollector, TopologyContext
from spark_storm.worker.windowed import (
    WINDOW_PREFIX,
    WindowedComponent,
    channel_slot,
    input_channels,
    window_inputs,
    windowed_spec,
)
from spark_storm.worker.windowing import (
    NO_TIME,
    Session,
    Sessions,
    Watermark,
    due_starts,
    first_open_start,
    next_end,
)

__all__ = ["BatchWindow", "WindowedBatchBolt"]

logger = logging.getLogger(__name__)
_COMBINED = -1  # the txid under which a sealed, combined pane is stored


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


def _from_ipc(blob: bytes) -> list[pa.RecordBatch]:
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all().to_batches()  # type: ignore[no-any-return]


def _table(batches: Sequence[pa.RecordBatch]) -> pa.Table:
    if not batches:
        return pa.table({})
    schema = batches[0].schema
    if all(b.schema.equals(schema) for b in batches):
        return pa.Table.from_batches(batches, schema=schema)
    return pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive")


def event_ms_array(column: pa.Array | pa.ChunkedArray, field: str) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Return a timestamp or integer column as epoch milliseconds (int64; nulls must be gone).

    Raises
    ------
    WindowError
        A column of another type, naming the field, its type and the fix.
    """
    kind = column.type
    if pa.types.is_timestamp(kind):
        raw = pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False)
        unit = kind.unit
        if unit == "s":
            return raw * 1000  # type: ignore[no-any-return]
        if unit == "us":
            return raw // 1000  # type: ignore[no-any-return]
        if unit == "ns":
            return raw // 1_000_000  # type: ignore[no-any-return]
        return raw  # type: ignore[no-any-return]
    if pa.types.is_integer(kind):
        return pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]
    if pa.types.is_floating(kind):
        floats = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
        return np.floor(floats).astype(np.int64)
    msg = (
        f"event time field {field!r} is of type {kind}; it must be a timestamp (Spark's TimestampType) "
        "or epoch milliseconds (an integer column)"
    )
    raise WindowError(msg)


class BatchWindow:
    """One window of a :class:`WindowedBatchBolt`.

    Attributes
    ----------
    table : pyarrow.Table
        The window's rows (sealed panes combined, if the bolt combines).
    start, end : int
        Epoch milliseconds, end exclusive.
    key : Any
        The session's key (session windows with ``key``); None otherwise.
    id : str
        Stable across replays and restarts.
    """

    __slots__ = ("_expired", "_new", "end", "id", "key", "start", "table")

    def __init__(
        self,
        table: pa.Table,
        start: int,
        end: int,
        key: Any,
        wid: str,
        new: list[pa.RecordBatch] | None = None,
        expired: list[pa.RecordBatch] | None = None,
    ) -> None:
        self.table = table
        self.start = start
        self.end = end
        self.key = key
        self.id = wid
        self._new = new
        self._expired = expired

    @property
    def new(self) -> pa.Table:
        """Rows in this window that were not in the window one slide earlier."""
        return _table(self._new) if self._new is not None else self.table

    @property
    def expired(self) -> pa.Table:
        """Rows of the window one slide earlier that this window no longer holds."""
        return _table(self._expired or []) if self._expired else self.table.slice(0, 0)

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)

    def __repr__(self) -> str:
        return f"BatchWindow({self.id}, [{self.start}, {self.end}), {self.table.num_rows} rows)"


class _AnchoringBatchCollector(BatchOutputCollector):
    """Emits without anchors are anchored to the batch whose arrival closed the window."""

    def __init__(self, inner: BatchOutputCollector) -> None:
        self.inner = inner
        self.anchor: ColumnarBatch | None = None

    def emit_batch(
        self,
        data: Any,
        stream: str = DEFAULT_STREAM,
        anchors: Sequence[ColumnarBatch] | ColumnarBatch | None = None,
        tasks: Any = None,
    ) -> None:
        self.inner.emit_batch(data, stream, self.anchor if anchors is None else anchors, tasks)

    def ack(self, batch: ColumnarBatch) -> None:
        self.inner.ack(batch)

    def fail(self, batch: ColumnarBatch) -> None:
        self.inner.fail(batch)


class WindowedBatchBolt(WindowedComponent, BatchBolt):
    """A columnar windowed bolt: ``execute_window`` gets each window as one :class:`BatchWindow`.

    Do not override ``execute_batch``.  Override ``combine`` to shrink sealed panes.
    """

    _windows: _BatchWindows

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: BatchOutputCollector) -> None:
        self.window_spec = windowed_spec(conf, context, "WindowedBatchBolt")
        self._anchoring = _AnchoringBatchCollector(collector)
        super().prepare(conf, context, self._anchoring)
        self._windows = _BatchWindows(self, self.window_spec, context, collector, self._anchoring)

    @abc.abstractmethod
    def execute_window(self, window: BatchWindow) -> None:
        """Process one window (emit through ``self.collector.emit_batch``)."""

    def execute_batch(self, batch: ColumnarBatch) -> None:
        self._windows.add(batch)

    def combine(self, table: pa.Table) -> pa.Table | None:
        """Shrink a sealed pane's rows (return None to keep them as they are)."""
        return None


class _Src:
    __slots__ = ("key", "slot", "ts")

    def __init__(self, ts: int, key: int, slot: int) -> None:
        self.ts = ts
        self.key = key
        self.slot = slot


class _BatchWindows:
    """The window engine of one :class:`WindowedBatchBolt` task (its executor thread only)."""

    def __init__(
        self,
        bolt: WindowedBatchBolt,
        spec: WindowSpec,
        context: TopologyContext,
        collector: BatchOutputCollector,
        anchoring: _AnchoringBatchCollector,
    ) -> None:
        self.bolt = bolt
        self.spec = spec
        self.collector = collector
        self.anchoring = anchoring
        self.context = context
        self.prefix = f"{context.component_id}/{context.task_id}"
        self.inputs = window_inputs(context)
        self.channels = input_channels(context, self.inputs)
        if len(spec.key) > 1 or (spec.key and spec.kind != "session"):
            msg = (
                f"component {context.component_id!r}: a WindowedBatchBolt gets each window as one table of all "
                f"its keys; 'key' ({list(spec.key)}) is for session windows, one field. Group the table in "
                "execute_window (table.group_by(...)) instead"
            )
            raise ConfigError(msg)
        self.combines = type(bolt).combine is not WindowedBatchBolt.combine
        self.watermark = Watermark(len(self.channels), spec.lag_ms, spec.epoch_watermark)
        self.event_time = spec.event_time
        self.late = 0
        self.bad_times = 0
        self.fired_count = 0
        self.fired = NO_TIME
        self._next_end = NO_TIME
        self._srcs: dict[TupleSource, _Src] = {}
        # duration windows
        self.panes: dict[int, list[pa.RecordBatch]] = {}
        self._sealed: set[int] = set()
        self._unsaved: dict[int, list[pa.RecordBatch]] = {}
        self._chunks: dict[int, list[int]] = {}
        self._combined_pending: set[int] = set()  # combined since the last checkpoint: stored whole
        # count windows: the last `length` rows (and their times), rows pending the watermark
        self._rows: list[pa.RecordBatch] = []
        self._row_ts: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        self._pending: list[pa.RecordBatch] = []
        self._pending_ts: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        self._since = 0
        self._fires = 0
        self._count_dirty = False
        # session windows
        self.sessions: Sessions[list[pa.RecordBatch]] = Sessions(spec.length, lambda a, b: a + b)
        if spec.kind == "duration":
            self._length, self._slide, self._pane = spec.length, spec.sliding, spec.pane

    # --- input ------------------------------------------------------------------------------------------
    def _src(self, source: TupleSource) -> _Src:
        info = self._srcs.get(source)
        if info is not None:
            return info
        spec, index = self.spec, source.index
        if spec.timestamp_field is not None and spec.timestamp_field not in index:
            msg = (
                f"window of {self.prefix}: batches from {source.component!r} stream {source.stream!r} have no "
                f"field {spec.timestamp_field!r} (fields {list(source.fields)}); it is the window's timestamp_field"
            )
            raise WindowError(msg)
        if spec.key and spec.key[0] not in index:
            msg = f"window of {self.prefix}: batches from {source.component!r} have no key field {spec.key[0]!r}"
            raise WindowError(msg)
        slot = channel_slot(self.channels, self.watermark, source.component, source.stream, source.task)
        info = self._srcs[source] = _Src(
            index[spec.timestamp_field] if spec.timestamp_field is not None else -1,
            index[spec.key[0]] if spec.key else -1,
            slot,
        )
        return info

    def _times(
        self, info: _Src, batch: ColumnarBatch
    ) -> tuple[pa.RecordBatch, np.ndarray[Any, np.dtype[np.int64]]] | None:
        """Return the batch's rows that are neither late nor timeless, with their times (None: no rows left)."""
        data = batch.data
        if info.ts < 0:
            now = time.time_ns() // 1_000_000
            if now > self.watermark.value:
                self.watermark.value = now
            return data, np.full(data.num_rows, now, dtype=np.int64)
        column = data.column(info.ts)
        if column.null_count:
            valid = pc.is_valid(column)
            dropped = column.null_count
            self.bad_times += dropped
            self.collector_report(
                f"event time field {self.spec.timestamp_field!r} is null in {dropped} rows (dropped; "
                f"{self.bad_times} so far)"
            )
            data = data.filter(valid)
            column = data.column(info.ts)
        try:
            ts = event_ms_array(column, self.spec.timestamp_field or "")
        except WindowError as exc:
            self.bad_times += data.num_rows
            self.collector_report(f"{exc} ({data.num_rows} rows dropped)")
            return None
        wm = self.watermark
        if not wm.active[info.slot]:
            wm.sent(info.slot)
        if wm.value > NO_TIME and len(ts):
            late = ts < wm.value
            if late.any():
                n = int(late.sum())
                self.late += n
                if self.spec.late_stream is not None:
                    self.collector.emit_batch(data.filter(pa.array(late)), self.spec.late_stream, anchors=batch)
                keep = ~late
                data, ts = data.filter(pa.array(keep)), ts[keep]
        if len(ts):
            newest = int(ts.max())
            if newest > wm.maxes[info.slot]:
                wm.advance(info.slot, newest)
        return (data, ts) if data.num_rows else None

    def collector_report(self, text: str) -> None:
        if self.bad_times < 1000 or self.bad_times % 100_000 == 0:
            logger.error("%s: %s", self.prefix, text)

    def add(self, batch: ColumnarBatch) -> None:
        source = batch.source
        if source.is_tick:
            self.tick()
            return
        info = self._src(source)
        kept = self._times(info, batch)
        if kept is not None:
            data, ts = kept
            self.anchoring.anchor = batch
            kind = self.spec.kind
            if kind == "duration":
                self._add_panes(data, ts)
            elif kind == "count":
                self._add_count(data, ts)
            else:
                self._add_sessions(info, data, ts)
        self.collector.ack(batch)

    def tick(self) -> None:
        """Fire the windows that ended: by the clock, or (event time) by a watermark an epoch raised."""
        if not self.event_time:
            now = time.time_ns() // 1_000_000
            if now > self.watermark.value:
                self.watermark.value = now
        self.anchoring.anchor = None
        kind = self.spec.kind
        if kind == "duration" and self.watermark.value >= self._next_end:
            self._fire_panes()
        elif kind == "session":
            self._fire_sessions()

    # --- duration windows ---------------------------------------------------------------------------
    def _add_panes(self, data: pa.RecordBatch, ts: np.ndarray[Any, np.dtype[np.int64]]) -> None:
        pane = self._pane
        panes = ts - ts % pane
        low, high = int(panes.min()), int(panes.max())
        if low == high:
            self._append(low, data)
        else:
            for p in np.unique(panes):
                self._append(int(p), data.filter(pa.array(panes == p)))
        if self.watermark.value >= self._next_end:
            self._fire_panes()

    def _append(self, pane: int, data: pa.RecordBatch) -> None:
        self.panes.setdefault(pane, []).append(data)
        self._unsaved.setdefault(pane, []).append(data)

    def _seal(self, wm: int) -> None:
        """Combine the panes the watermark passed (no row can join them any more)."""
        pane = self._pane
        for p in sorted(self.panes):
            if p + pane > wm:
                break
            if p in self._sealed:
                continue
            self._sealed.add(p)
            rows = _table(self.panes[p])
            combined = self.bolt.combine(rows)
            if combined is None:
                continue
            batches = (combined if isinstance(combined, pa.Table) else pa.Table.from_batches([combined])).to_batches()
            self.panes[p] = [b for b in batches if b.num_rows] or batches[:1]
            self._unsaved[p] = list(self.panes[p])
            for txid in self._chunks.pop(p, ()):
                self.bolt.state.delete([WINDOW_PREFIX, "b", p, txid])
            self._chunks[p] = []
            self._combined_pending.add(p)

    def _fire_panes(self) -> None:
        wm = self.watermark.value
        if wm <= NO_TIME:
            return
        length, slide, pane = self._length, self._slide, self._pane
        if self.combines:
            self._seal(wm)
        panes = self.panes
        failure: Exception | None = None
        for start in due_starts(panes, self.fired, wm, length, slide, pane):
            end = start + length
            batches = [b for p in range(start, end, pane) for b in panes.get(p, ())]
            if not batches:
                continue
            new_from = max(start, end - slide)
            new = [b for p in range(new_from, end, pane) for b in panes.get(p, ())]
            expired = [b for p in range(start - slide, min(start, end - slide), pane) for b in panes.get(p, ())]
            window = BatchWindow(_table(batches), start, end, None, f"{self.prefix}/{start}-{end}", new, expired)
            failure = self._call(window, failure)
        self.fired = max(self.fired, wm)
        self._next_end = next_end(self.fired, length, slide)
        keep = first_open_start(self.fired, length, slide) - slide
        for p in [p for p in panes if p + pane <= keep]:
            self._evict(p)
        if failure is not None:
            raise failure

    def _evict(self, pane: int) -> None:
        del self.panes[pane]
        self._unsaved.pop(pane, None)
        self._sealed.discard(pane)
        self._combined_pending.discard(pane)
        for txid in self._chunks.pop(pane, ()):
            self.bolt.state.delete([WINDOW_PREFIX, "b", pane, txid])

    # --- count windows ---------------------------------------------------------------------------------
    def _add_count(self, data: pa.RecordBatch, ts: np.ndarray[Any, np.dtype[np.int64]]) -> None:
        self._count_dirty = True
        if not self.event_time:
            self._count_rows(data, ts)
            return
        self._pending.append(data)
        self._pending_ts.append(ts)
        wm = self.watermark.value
        table = _table(self._pending)
        times = np.concatenate(self._pending_ts)
        ready = times < wm
        if not ready.any():
            return
        order = np.argsort(times[ready], kind="stable")
        released = table.filter(pa.array(ready)).take(pa.array(order))
        rest = ~ready
        self._pending = table.filter(pa.array(rest)).to_batches()
        self._pending_ts = [times[rest]]
        self._count_rows(_single(released), times[ready][order])

    def _count_rows(self, data: pa.RecordBatch, ts: np.ndarray[Any, np.dtype[np.int64]]) -> None:
        length, slide = self.spec.length, self.spec.sliding
        self._rows.append(data)
        self._row_ts.append(ts)
        table = _table(self._rows)
        times = np.concatenate(self._row_ts)
        total = table.num_rows
        held_before = total - data.num_rows
        failure: Exception | None = None
        # windows end after every `slide` rows counted; `since` rows were counted before this batch
        first = slide - self._since
        ends = range(held_before + first, total + 1, slide)
        last_end = held_before - self._since
        for end in ends:
            begin = max(0, end - length)
            self._fires += 1
            rows = table.slice(begin, end - begin)
            new = table.slice(max(begin, end - slide), end - max(begin, end - slide))
            prev_begin = max(0, last_end - length)
            expired = table.slice(prev_begin, max(0, begin - prev_begin)) if last_end > 0 else table.slice(0, 0)
            wid = f"{self.prefix}/#{self._fires}"
            window = BatchWindow(
                rows, int(times[begin]), int(times[end - 1]) + 1, None, wid, new.to_batches(), expired.to_batches()
            )
            failure = self._call(window, failure)
            last_end = end
        counted = self._since + data.num_rows
        self._since = counted % slide
        keep = min(total, length + slide)
        if total > keep:
            table, times = table.slice(total - keep), times[total - keep :]
        self._rows = [_single(table)] if table.num_rows else []
        self._row_ts = [times]
        if failure is not None:
            raise failure

    # --- session windows -------------------------------------------------------------------------------
    def _add_sessions(self, info: _Src, data: pa.RecordBatch, ts: np.ndarray[Any, np.dtype[np.int64]]) -> None:
        gap = self.spec.length
        if info.key >= 0:
            keys = data.column(info.key)
            groups = (
                pa.table({"k": keys, "i": pa.array(np.arange(data.num_rows))}).group_by("k").aggregate([("i", "list")])
            )
            per_key: list[tuple[Any, list[int]]] = list(
                zip(groups.column("k").to_pylist(), groups.column("i_list").to_pylist(), strict=True)
            )
        else:
            per_key = [(None, list(range(data.num_rows)))]
        sessions = self.sessions
        for key, rows in per_key:
            idx = np.asarray(rows, dtype=np.int64)
            times = ts[idx]
            order = np.argsort(times, kind="stable")
            idx, times = idx[order], times[order]
            cuts = np.flatnonzero(np.diff(times) >= gap) + 1
            for part_idx, part_ts in zip(np.split(idx, cuts), np.split(times, cuts), strict=True):
                rows_of = data.take(pa.array(part_idx))
                low, high = int(part_ts[0]), int(part_ts[-1])
                session = sessions.place(key, low)
                if session is None:
                    session = sessions.open(key, low, high, [rows_of])
                    continue
                session.payload.append(rows_of)
                if high > session.last:
                    sessions.grow(key, session, low, high)
        self._fire_sessions()

    def _fire_sessions(self) -> None:
        nxt = self.sessions.next_end
        if nxt is None or nxt > self.watermark.value:
            return
        failure: Exception | None = None
        for session in self.sessions.close_until(self.watermark.value):
            failure = self._call(self._session_window(session), failure)
        if failure is not None:
            raise failure

    def _session_window(self, session: Session[list[pa.RecordBatch]]) -> BatchWindow:
        end = session.last + self.spec.length
        suffix = f"/{session.key}" if self.spec.key else ""
        return BatchWindow(
            _table(session.payload), session.start, end, session.key, f"{self.prefix}{suffix}/{session.start}-{end}"
        )

    # --- calling the bolt ------------------------------------------------------------------------------
    def _call(self, window: BatchWindow, failure: Exception | None) -> Exception | None:
        self.fired_count += 1
        try:
            self.bolt.execute_window(window)
        except Exception as exc:
            logger.exception("%s: execute_window raised on %s", self.prefix, window.id)
            return failure or exc
        return failure

    # --- state -----------------------------------------------------------------------------------------
    def save(self, state: KeyValueState, txid: int) -> None:
        if self.event_time:
            # an aligned barrier: every channel delivered the epoch.  The windows it closes fire
            # now, so their results go out before the barrier and commit with this epoch.
            self.watermark.epoch()
            self.tick()
        kind = self.spec.kind
        if kind == "duration":
            for pane, batches in sorted(self._unsaved.items()):
                if pane not in self.panes or not batches:
                    continue
                stored = _COMBINED if pane in self._combined_pending else txid
                state.put([WINDOW_PREFIX, "b", pane, stored], _ipc_all(batches))
                self._chunks.setdefault(pane, []).append(stored)
            self._unsaved.clear()
            self._combined_pending.clear()
        elif kind == "count":
            if self._count_dirty:
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
                self._count_dirty = False
        else:
            sessions = self.sessions
            for key in sessions.dirty:
                held = sessions.by_key.get(key)
                if not held:
                    state.delete([WINDOW_PREFIX, "s", key])
                    continue
                state.put([WINDOW_PREFIX, "s", key], [[s.start, s.last, _ipc_all(s.payload)] for s in held])
            sessions.dirty.clear()
        state.put(
            [WINDOW_PREFIX, "meta"],
            {
                "maxes": list(self.watermark.maxes),
                "clock": self.watermark.value,
                "fired": self.fired,
                "late": self.late,
                "windows": self.fired_count,
                "sealed": sorted(self._sealed),
            },
        )

    def load(self, state: KeyValueState) -> None:
        self.panes.clear()
        self._sealed.clear()
        self._unsaved.clear()
        self._chunks.clear()
        self._combined_pending = set()
        self._rows, self._row_ts, self._pending, self._pending_ts = [], [], [], []
        self._since = self._fires = 0
        self._count_dirty = False
        self.sessions.clear()
        meta = state.get([WINDOW_PREFIX, "meta"]) or {}
        self.watermark = Watermark(len(self.channels), self.spec.lag_ms, self.spec.epoch_watermark)
        if meta:
            if self.event_time:
                self.watermark.restore(list(meta.get("maxes", [])), int(meta.get("clock", NO_TIME)))
            else:
                self.watermark.value = int(meta.get("clock", NO_TIME))
        self.fired = int(meta.get("fired", NO_TIME))
        self.late = int(meta.get("late", 0))
        self.fired_count = int(meta.get("windows", 0))
        self._sealed = {int(p) for p in meta.get("sealed", [])}
        chunks: list[tuple[int, int, list[bytes]]] = []
        for key, value in state.items():
            if not (isinstance(key, list) and key and key[0] == WINDOW_PREFIX):
                continue
            if key[1] == "b":
                chunks.append((int(key[2]), int(key[3]), value))
            elif key[1] == "cb":
                self._rows = [b for blob in value["rows"] for b in _from_ipc(blob)]
                self._row_ts = [np.frombuffer(t, dtype=np.int64).copy() for t in value["ts"]]
                self._pending = [b for blob in value["pending"] for b in _from_ipc(blob)]
                self._pending_ts = [np.frombuffer(t, dtype=np.int64).copy() for t in value["pending_ts"]]
                self._since = int(value["since"])
                self._fires = int(value["fires"])
            elif key[1] == "s":
                k = tuple(key[2]) if isinstance(key[2], list) else key[2]
                for start, last, blobs in value:
                    self.sessions.open(k, int(start), int(last), [b for blob in blobs for b in _from_ipc(blob)])
        for pane, txid, blobs in sorted(chunks, key=lambda c: (c[0], c[1])):
            self.panes.setdefault(pane, []).extend(b for blob in blobs for b in _from_ipc(blob))
            self._chunks.setdefault(pane, []).append(txid)
        self._sealed &= set(self.panes)
        self.sessions.dirty.clear()
        if self.spec.kind == "duration":
            self._next_end = next_end(self.fired, self._length, self._slide)

    def metrics(self) -> WindowMetrics:
        # An HTTP thread reads this while the executor changes the panes: iterate copies.
        if self.spec.kind == "duration":
            held = sum(b.num_rows for bs in list(self.panes.values()) for b in list(bs))
        elif self.spec.kind == "count":
            held = sum(b.num_rows for b in list(self._rows)) + sum(b.num_rows for b in list(self._pending))
        else:
            held = len(self.sessions)
        wm = self.watermark.value
        return {
            "spec": self.spec.describe(),
            "watermark_ms": None if wm <= NO_TIME else wm,
            "windows": self.fired_count,
            "late": self.late,
            "bad_times": self.bad_times,
            "held": held,
        }


def _single(table: pa.Table) -> pa.RecordBatch:
    """One record batch of a table's rows."""
    combined = table.combine_chunks()
    batches = combined.to_batches()
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
