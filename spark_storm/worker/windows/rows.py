"""Tuple windows: each window keeps its tuples, or one accumulator per pane and key (``zero``/``add``/``merge``).

A tuple is timed, judged late or not and placed one at a time, as Storm does.  In the state
a tuple is ``[source id, values]`` (the ids are listed in the ``meta`` entry), so a restored
window gives ``execute_window`` the same tuples, fields and origins.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from spark_storm.codec.tuples import Tuple, TupleSource
from spark_storm.errors import ConfigError, WindowError
from spark_storm.state.kv import KeyValueState
from spark_storm.worker.bolt import OutputCollector
from spark_storm.worker.windows.bolts import MISSING, TupleWindow, WindowedBolt
from spark_storm.worker.windows.core import event_ms
from spark_storm.worker.windows.engine import WINDOW_PREFIX, Entries, Source, WindowEngine, thaw
from spark_storm.worker.windows.kinds import Panes, SessionWindows

__all__ = ["RowEngine"]

logger = logging.getLogger(__name__)


def _aggregating(bolt: Any) -> bool:
    names = ("zero", "add", "merge")
    overridden = [n for n in names if getattr(type(bolt), n) is not getattr(WindowedBolt, n)]
    if overridden and len(overridden) != len(names):
        missing = [n for n in names if n not in overridden]
        msg = (
            f"{type(bolt).__name__} overrides {overridden} but not {missing}: incremental aggregation needs "
            "zero(), add() and merge() together"
        )
        raise ConfigError(msg)
    return bool(overridden)


class RowPanes(Panes):
    """Duration windows of tuples: a pane keeps each key's tuples, or its accumulator."""

    def __init__(self, engine: RowEngine) -> None:
        super().__init__(engine)
        self.rows = engine
        self.keeps_expired = not engine.reduce
        self._saved: dict[int, dict[Any, int]] = {}  # pane -> key -> tuples already in the state
        self._dirty: set[int] = set()

    def add(self, ts: int, key: Any, tup: Tuple) -> None:
        pane = ts - ts % self.pane
        keyed = self.panes.get(pane)
        if keyed is None:
            keyed = self.panes[pane] = {}
        if self.rows.reduce:
            acc = keyed.get(key, MISSING)
            if acc is MISSING:
                acc = self.rows.bolt.zero()
                self.held += 1
            keyed[key] = self.rows.bolt.add(acc, tup)
        else:
            held = keyed.get(key)
            if held is None:
                keyed[key] = [tup]
            else:
                held.append(tup)
            self.held += 1
        self._dirty.add(pane)
        if self.engine.watermark.value >= self.next_end:
            self.fire()

    def evict(self, pane: int) -> None:
        keyed = self.panes.pop(pane)
        self.held -= len(keyed) if self.rows.reduce else sum(len(v) for v in keyed.values())
        self._saved.pop(pane, None)
        self._dirty.discard(pane)
        state = self.engine.state
        for txid in self.chunks.pop(pane, ()):
            state.delete([WINDOW_PREFIX, "p", pane, txid])
        if self.rows.reduce:
            state.delete([WINDOW_PREFIX, "a", pane])

    def save(self, state: KeyValueState, txid: int) -> None:
        entry = self.rows.entry
        for pane in sorted(self._dirty):
            keyed = self.panes.get(pane)
            if keyed is None:
                continue
            if self.rows.reduce:
                state.put([WINDOW_PREFIX, "a", pane], [[k, acc] for k, acc in keyed.items()])
                continue
            saved = self._saved.setdefault(pane, {})
            entries: list[list[Any]] = []
            for key, held in keyed.items():
                done = saved.get(key, 0)
                if done < len(held):
                    entries.extend(entry(t) for t in held[done:])
                    saved[key] = len(held)
            if entries:
                state.put([WINDOW_PREFIX, "p", pane, txid], entries)
                self.chunks.setdefault(pane, []).append(txid)
        self._dirty.clear()

    def load(self, entries: Entries, meta: Mapping[str, Any]) -> None:
        rows = self.rows
        for key, value in entries:
            if key[0] == "a":
                self.panes[int(key[1])] = {thaw(k): acc for k, acc in value}
                self.held += len(value)
        for pane, txid, chunk in sorted((int(k[1]), int(k[2]), v) for k, v in entries if k[0] == "p"):
            keyed = self.panes.setdefault(pane, {})
            saved = self._saved.setdefault(pane, {})
            for item in chunk:
                tup = rows.tuple_of(item)
                key = rows.key(rows.source_of(tup), tup.values)
                keyed.setdefault(key, []).append(tup)
                saved[key] = saved.get(key, 0) + 1
            self.held += len(chunk)
            self.chunks.setdefault(pane, []).append(txid)


class _CountKey:
    """One key's count window: the last ``length`` tuples with their times, and what left since the last fire."""

    __slots__ = ("buf", "evicted", "fires", "since")

    def __init__(self) -> None:
        self.buf: deque[tuple[int, Tuple]] = deque()
        self.evicted: list[Tuple] = []
        self.since = 0
        self.fires = 0


class RowCounts:
    """Count windows of tuples per key: the last ``length``, fired every ``sliding`` tuples.

    In event time a tuple joins its count window once the watermark passes it, oldest first.
    """

    def __init__(self, engine: RowEngine) -> None:
        self.engine = engine
        self.counts: dict[Any, _CountKey] = {}
        self.pending: list[tuple[int, int, Any, Tuple]] = []  # event time: not released yet
        self._dirty: set[Any] = set()
        self.held = 0

    def add(self, ts: int, key: Any, tup: Tuple) -> None:
        engine = self.engine
        if engine.event_time:
            engine.arrivals += 1
            heapq.heappush(self.pending, (ts, engine.arrivals, key, tup))
            self.held += 1
            self.evaluate()
        else:
            self._count(key, ts, tup)

    def evaluate(self) -> None:
        """Event time: tuples older than the watermark join their count windows, oldest first."""
        if not self.engine.event_time:
            return
        pending, wm = self.pending, self.engine.watermark.value
        failure: Exception | None = None
        while pending and pending[0][0] < wm:
            ts, _, key, tup = heapq.heappop(pending)
            self.held -= 1
            try:
                self._count(key, ts, tup)
            except Exception as exc:  # the user's execute_window: fire the rest, raise the first
                failure = failure or exc
        if failure is not None:
            raise failure

    def _count(self, key: Any, ts: int, tup: Tuple) -> None:
        engine = self.engine
        spec = engine.spec
        state = self.counts.get(key)
        if state is None:
            state = self.counts[key] = _CountKey()
        buf = state.buf
        buf.append((ts, tup))
        if len(buf) > spec.length:
            state.evicted.append(buf.popleft()[1])
        else:
            self.held += 1
        state.since += 1
        self._dirty.add(key)
        if state.since >= spec.sliding:
            state.since = 0
            state.fires += 1
            tuples = [t for _, t in buf]
            expired, state.evicted = state.evicted, []
            suffix = f"/{key}" if spec.key else ""
            wid = f"{engine.prefix}{suffix}/#{state.fires}"
            value = MISSING
            if engine.reduce:
                bolt = engine.bolt
                value = bolt.zero()
                for t in tuples:
                    value = bolt.add(value, t)
            new = tuples[-spec.sliding :]
            window = TupleWindow(buf[0][0], buf[-1][0] + 1, key, wid, [tuples], [new], [expired], value)
            failure = engine.call([window])
            if failure is not None:
                raise failure

    def save(self, state: KeyValueState, txid: int) -> None:
        entry = self.engine.entry
        for key in self._dirty:
            c = self.counts.get(key)
            if c is None:
                continue
            state.put(
                [WINDOW_PREFIX, "c", key],
                {
                    "buf": [[ts, *entry(t)] for ts, t in c.buf],
                    "evicted": [entry(t) for t in c.evicted],
                    "since": c.since,
                    "fires": c.fires,
                },
            )
        self._dirty.clear()
        if self.engine.event_time:
            state.put([WINDOW_PREFIX, "pending"], [[ts, seq, *entry(t)] for ts, seq, _key, t in self.pending])

    def load(self, entries: Entries, meta: Mapping[str, Any]) -> None:
        engine = self.engine
        for key, value in entries:
            if key[0] == "c":
                c = self.counts[thaw(key[1])] = _CountKey()
                for ts, sid, values in value.get("buf", []):
                    c.buf.append((int(ts), engine.tuple_of([sid, values])))
                c.evicted = [engine.tuple_of(e) for e in value.get("evicted", [])]
                c.since = int(value.get("since", 0))
                c.fires = int(value.get("fires", 0))
                self.held += len(c.buf)
            elif key[0] == "pending":
                for ts, seq, sid, values in value:
                    tup = engine.tuple_of([sid, values])
                    self.pending.append((int(ts), int(seq), engine.key(engine.source_of(tup), tup.values), tup))
                heapq.heapify(self.pending)
                self.held += len(self.pending)


class RowEngine(WindowEngine[TupleWindow]):
    """The window engine of a :class:`WindowedBolt` task: tuples (or accumulators) in windows."""

    kind: RowPanes | RowCounts | SessionWindows

    def __init__(self, bolt: WindowedBolt, spec: Any, context: Any, collector: OutputCollector) -> None:
        self.reduce = _aggregating(bolt)
        self.arrivals = 0  # event-time count windows: the order tuples arrived in
        self._sources: list[tuple[str, int, str]] = []  # source id -> (component, task, stream)
        self._source_objs: dict[tuple[str, int, str], TupleSource] = {}
        super().__init__(bolt, spec, context, collector)
        if spec.key == () and spec.kind == "session":
            logger.info("component %s: session windows without 'key': one session stream per task", self.prefix)

    def _kind(self) -> RowPanes | RowCounts | SessionWindows:
        kind = self.spec.kind
        return RowPanes(self) if kind == "duration" else RowCounts(self) if kind == "count" else SessionWindows(self)

    # --- input ------------------------------------------------------------------------------
    def execute(self, tup: Tuple) -> None:
        """Time ``tup``, drop it (late, or timeless) or place it in its windows; ack it."""
        source = tup.source
        info = self._srcs.get(source)
        if info is None:
            if source.is_tick:
                self.tick()
                return
            info = self._src(source)
        ts = self._observe(info, tup)
        if ts is None:
            return
        self.anchoring.anchor = tup
        self.kind.add(ts, self.key(info, tup.values), tup)
        self.collector.ack(tup)

    def _sid(self, source: TupleSource) -> int:
        ident = (source.component, source.task, source.stream)
        if ident not in self._sources:
            self._sources.append(ident)
        return self._sources.index(ident)

    def key(self, info: Source, values: list[Any]) -> Any:
        if info.key >= 0:
            return values[info.key]
        if not info.keys:
            return None
        return tuple(values[i] for i in info.keys)

    def _time(self, info: Source, tup: Tuple) -> int | None:
        """Return the tuple's time; None (reported, counted, acked) when its event time is unusable."""
        if info.ts < 0:
            return time.time_ns() // 1_000_000
        value = tup.values[info.ts]
        if type(value) is int:
            return value
        try:
            return event_ms(value, self.spec.timestamp_field or "")
        except WindowError as exc:
            self.bad_times += 1
            if self.bad_times <= 10 or self.bad_times % 10_000 == 0:
                self.collector.report_error(f"{exc} (tuple dropped; {self.bad_times} so far)")
            return None

    def _observe(self, info: Source, tup: Tuple) -> int | None:
        """Time the tuple; None when it is late or timeless (then it is done with)."""
        ts = self._time(info, tup)
        if ts is None:
            self.collector.ack(tup)
            return None
        wm = self.watermark
        if self.event_time:
            if not wm.active[info.slot]:
                wm.sent(info.slot)
            if ts < wm.value:
                self.late += 1
                if self.spec.late_stream is not None:
                    self.collector.emit(tup.values, self.spec.late_stream, anchors=tup)
                self.collector.ack(tup)
                return None
            if ts > wm.maxes[info.slot]:
                wm.advance(info.slot, ts)
        elif ts > wm.value:
            wm.value = ts  # processing time: the clock is the watermark
        return ts

    # --- what a window holds ------------------------------------------------------------------
    def window(
        self, start: int, end: int, key: Any, wid: str, parts: list[Any], new: Any = None, expired: Any = None
    ) -> TupleWindow:
        if not self.reduce:
            return TupleWindow(start, end, key, wid, parts, parts if new is None else new, expired or [])
        merge = self.bolt.merge
        value: Any = MISSING
        for acc in parts:
            value = acc if value is MISSING else merge(value, acc)
        return TupleWindow(start, end, key, wid, None, value=value)

    def start(self, item: Tuple) -> Any:
        return self.bolt.add(self.bolt.zero(), item) if self.reduce else [item]

    def put(self, payload: Any, item: Tuple) -> Any:
        return self.bolt.add(payload, item) if self.reduce else super().put(payload, item)

    def join(self, a: Any, b: Any) -> Any:
        return self.bolt.merge(a, b) if self.reduce else a + b

    def encode(self, payload: Any) -> Any:
        return payload if self.reduce else [self.entry(t) for t in payload]

    def decode(self, value: Any) -> Any:
        return value if self.reduce else [self.tuple_of(e) for e in value]

    # --- tuples in the state --------------------------------------------------------------------
    def entry(self, tup: Tuple) -> list[Any]:
        """Return a tuple as the state keeps it: ``[source id, values]``."""
        return [self.source_of(tup).sid, tup.values]

    def source_of(self, tup: Tuple) -> Source:
        return self._srcs.get(tup.source) or self._src(tup.source)

    def tuple_of(self, entry: list[Any]) -> Tuple:
        """Return the tuple of a state entry (its origin rebuilt from the source ids the meta lists)."""
        component, task, stream = ident = self._sources[int(entry[0])]
        obj = self._source_objs.get(ident)
        if obj is None:
            fields = next((f for c, s, f in self.inputs if c == component and s == stream), ())
            obj = self._source_objs[ident] = TupleSource(component, task, stream, fields)
        return Tuple(list(entry[1]), obj)

    def _meta(self) -> dict[str, Any]:
        return {"arrivals": self.arrivals, "sources": [list(s) for s in self._sources]}

    def _load_meta(self, meta: Mapping[str, Any]) -> None:
        self._srcs.clear()
        self._sources = [(str(c), int(t), str(s)) for c, t, s in meta.get("sources", [])]
        self.arrivals = int(meta.get("arrivals", 0))
