"""Windowed bolts: Storm's ``BaseWindowedBolt`` in Python, with event time, sessions and exact state.

::

    class PerUserCount(WindowedBolt):
        def execute_window(self, window: TupleWindow) -> None:
            counts = Counter(t.get("user") for t in window.tuples)
            for user, n in counts.items():
                self.collector.emit([window.start, window.end, user, n])

The component's ``window:`` block (:mod:`spark_storm.topology.windows`) says which windows:
count or duration, sliding or tumbling, processing or event time, or sessions per key.
``execute_window`` runs once per window (per key when ``key`` is set) with a
:class:`TupleWindow`: ``tuples``, ``new`` and ``expired`` (against the window one slide
earlier), ``start`` and ``end`` (epoch milliseconds, end exclusive), ``key`` and a stable
``id``.

**Incremental aggregation.**  A bolt that overrides ``zero``, ``add`` and ``merge`` keeps one
accumulator per pane (and key) instead of the tuples, so a ten-minute window over a fast
stream costs its panes, not its tuples (Storm keeps every tuple: STORM-2614);
``window.value`` is then the merged accumulator and ``window.tuples`` is not kept.

**Exact through failures.**  A windowed bolt is stateful: its open windows, watermarks and
what has fired are checkpointed with the topology's epochs (docs/state.md), so a SIGKILLed
or moved task resumes its windows, and a replay fires each window again with the same
tuples, values and id.  A tuple is acked when it joins its window: once window state is
durable that is safe, and a micro-batch never waits for a later one to close its windows
(``delivery=processed`` and windows do not deadlock).  What a window emits is anchored to
the tuple whose arrival closed it, so a failure downstream rolls the topology back.
"""

from __future__ import annotations

import abc
import heapq
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from spark_storm.codec.tuples import CLIENT_COMPONENT, Tuple, TupleSource
from spark_storm.errors import ConfigError, WindowError
from spark_storm.reports import WindowMetrics
from spark_storm.state.kv import KeyValueState
from spark_storm.topology.model import DEFAULT_STREAM
from spark_storm.topology.windows import WindowSpec, window_spec
from spark_storm.worker.bolt import Bolt, OutputCollector, TopologyContext
from spark_storm.worker.stateful import StatefulComponent
from spark_storm.worker.windowing import (
    NO_TIME,
    Session,
    Sessions,
    Watermark,
    due_starts,
    event_ms,
    first_open_start,
    next_end,
)

__all__ = ["TupleWindow", "WindowedBolt", "window_inputs", "windowed_spec"]

logger = logging.getLogger(__name__)

#: State keys of the window engine start with this (the bolt's own keys must not).
WINDOW_PREFIX: Final = "__window"
_MISSING: Final = object()


def windowed_spec(conf: Mapping[str, Any], context: TopologyContext, kind: str) -> WindowSpec:
    """Return the spec of the component a windowed bolt task runs in (ConfigError when it has none)."""
    plan = context.plan
    if plan is None:
        msg = f"{kind} {context.component_id!r} needs its topology (TopologyContext.plan) to read its window"
        raise ConfigError(msg)
    component = plan.topology.components[context.component_id]
    where = f"component {component.id!r}"
    spec = window_spec(component.conf, where, conf)
    if spec is None:
        msg = (
            f"{where}: its bolt is a {kind} but the component declares no window; give it "
            "'window: {length: 60s, sliding: 10s}' (or session_gap, or Storm's topology.bolts.window.* keys)"
        )
        raise ConfigError(msg)
    return spec


#: An input channel: (component, stream, upstream task); task -1 stands for any task.
Channel = tuple[str, str, int]


def input_channels(context: TopologyContext, inputs: list[tuple[str, str, tuple[str, ...]]]) -> dict[Channel, int]:
    """Return the watermark slot of every input channel: (component, stream, upstream task).

    A source component's channel is the client's, whatever task it names (-1).
    """
    assert context.plan is not None
    channels: dict[Channel, int] = {}
    for component, stream, _fields in inputs:
        tasks = context.plan.component_tasks.get(component)
        for task in tasks if tasks else (-1,):
            channels[(component, stream, task)] = len(channels)
    return channels


def channel_slot(channels: dict[Channel, int], watermark: Watermark, component: str, stream: str, task: int) -> int:
    """Return the slot of a channel, adding one for an upstream task the plan did not name."""
    slot = channels.get((component, stream, task))
    if slot is None:
        slot = channels.get((component, stream, -1))
    if slot is None:
        slot = channels[(component, stream, task)] = watermark.add_channel()
    return slot


def window_inputs(context: TopologyContext) -> list[tuple[str, str, tuple[str, ...]]]:
    """Return the (component, stream, fields) of every input of the task's component, in declaration order."""
    assert context.plan is not None
    topo = context.plan.topology
    component = topo.components[context.component_id]
    if component.source:
        return [(CLIENT_COMPONENT, DEFAULT_STREAM, component.fields_of(DEFAULT_STREAM))]
    out: list[tuple[str, str, tuple[str, ...]]] = []
    for inp in component.inputs:
        entry = (inp.component, inp.stream, topo.components[inp.component].fields_of(inp.stream))
        if entry not in out:
            out.append(entry)
    return out


class TupleWindow:
    """One window as ``execute_window`` sees it.

    Attributes
    ----------
    start, end : int
        Epoch milliseconds, end exclusive (count windows: the first and last tuple's time + 1;
        sessions: the first event and the last event + gap).
    key : Any
        The window's key (``key`` in the spec); None when windows are not keyed.
    id : str
        Stable across replays and restarts: ``component/task/start-end[/key]``.
    """

    __slots__ = ("_expired", "_new", "_parts", "_value", "end", "id", "key", "start")

    def __init__(
        self,
        start: int,
        end: int,
        key: Any,
        wid: str,
        parts: list[list[Tuple]] | None,
        new: list[list[Tuple]] | None = None,
        expired: list[list[Tuple]] | None = None,
        value: Any = _MISSING,
    ) -> None:
        self.start = start
        self.end = end
        self.key = key
        self.id = wid
        self._parts = parts
        self._new = new
        self._expired = expired
        self._value = value

    def _join(self, parts: list[list[Tuple]] | None, what: str) -> list[Tuple]:
        if parts is None:
            msg = (
                f"window {self.id}: this bolt aggregates incrementally (zero/add/merge), so the window keeps "
                f"no tuples; read window.value instead of window.{what}"
            )
            raise WindowError(msg)
        if len(parts) == 1:
            return list(parts[0])
        return [t for part in parts for t in part]

    @property
    def tuples(self) -> list[Tuple]:
        """Every tuple in the window (in pane order, arrival order within a pane)."""
        return self._join(self._parts, "tuples")

    @property
    def new(self) -> list[Tuple]:
        """Tuples in this window that were not in the window one slide earlier."""
        return self._join(self._new if self._parts is not None else None, "new")

    @property
    def expired(self) -> list[Tuple]:
        """Tuples of the window one slide earlier that this window no longer holds."""
        return self._join(self._expired if self._parts is not None else None, "expired")

    @property
    def value(self) -> Any:
        """The merged accumulator of an aggregating bolt (``zero``/``add``/``merge``)."""
        if self._value is _MISSING:
            msg = f"window {self.id}: window.value needs the bolt to define zero(), add() and merge()"
            raise WindowError(msg)
        return self._value

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts) if self._parts is not None else 0

    def __repr__(self) -> str:
        return f"TupleWindow({self.id}, [{self.start}, {self.end}))"


class _AnchoringCollector(OutputCollector):
    """The bolt's collector: emits without anchors are anchored to the tuple that closed the window."""

    def __init__(self, inner: OutputCollector) -> None:
        self.inner = inner
        self.anchor: Tuple | None = None

    def emit(
        self, values: Sequence[Any], stream: str = DEFAULT_STREAM, anchors: Sequence[Tuple] | Tuple | None = None
    ) -> list[int]:
        return self.inner.emit(values, stream, self.anchor if anchors is None else anchors)

    def emit_direct(
        self,
        task: int,
        values: Sequence[Any],
        stream: str = DEFAULT_STREAM,
        anchors: Sequence[Tuple] | Tuple | None = None,
    ) -> None:
        self.inner.emit_direct(task, values, stream, self.anchor if anchors is None else anchors)

    def ack(self, tup: Tuple) -> None:
        self.inner.ack(tup)

    def fail(self, tup: Tuple) -> None:
        self.inner.fail(tup)

    def report_error(self, error: str) -> None:
        self.inner.report_error(error)


class _WindowEngine(Protocol):
    def load(self, state: KeyValueState) -> None: ...
    def save(self, state: KeyValueState, txid: int) -> None: ...
    def metrics(self) -> WindowMetrics: ...


class WindowedComponent(StatefulComponent):
    """What both windowed bolts share: the task's state and the checkpoint machinery's hooks."""

    _windows: _WindowEngine
    state: KeyValueState

    def init_state(self, state: KeyValueState) -> None:
        self.state = state

    def _state_restored(self, state: KeyValueState) -> None:
        self.state = state
        self._windows.load(state)

    def _state_saving(self, txid: int) -> None:
        self._windows.save(self.state, txid)

    def window_metrics(self) -> WindowMetrics:
        return self._windows.metrics()


class WindowedBolt(WindowedComponent, Bolt):
    """Storm's ``BaseWindowedBolt``: ``execute_window`` per window of the component's ``window:`` spec.

    Do not override ``execute``: tuples join their windows there and are acked.  Override
    ``zero``, ``add`` and ``merge`` together to aggregate incrementally.  ``init_state``
    gives the task's :class:`KeyValueState` (keys starting with ``"__window"`` are the
    engine's); call ``super().init_state(state)`` when overriding it.
    """

    _windows: _TupleWindows

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        self.window_spec = windowed_spec(conf, context, "WindowedBolt")
        self._raw_collector = collector
        self._anchoring = _AnchoringCollector(collector)
        super().prepare(conf, context, self._anchoring)
        self._windows = _TupleWindows(self, self.window_spec, context, collector, self._anchoring)

    @abc.abstractmethod
    def execute_window(self, window: TupleWindow) -> None:
        """Process one window (emit through ``self.collector``)."""

    def execute(self, tup: Tuple) -> None:
        self._windows.add(tup)

    # --- incremental aggregation (override all three) ------------------------------------------
    def zero(self) -> Any:
        """Return the accumulator of an empty window."""
        raise NotImplementedError

    def add(self, acc: Any, tup: Tuple) -> Any:
        """Return ``acc`` with ``tup`` added."""
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        """Return the accumulator of two disjoint parts of a window."""
        raise NotImplementedError


def _aggregating(bolt: Any, base: type) -> bool:
    names = ("zero", "add", "merge")
    overridden = [n for n in names if getattr(type(bolt), n) is not getattr(base, n)]
    if overridden and len(overridden) != len(names):
        missing = [n for n in names if n not in overridden]
        msg = (
            f"{type(bolt).__name__} overrides {overridden} but not {missing}: incremental aggregation needs "
            "zero(), add() and merge() together"
        )
        raise ConfigError(msg)
    return bool(overridden)


class _Src:
    """What the engine knows about one tuple origin: field positions, input slot, id in the state."""

    __slots__ = ("key", "keys", "sid", "slot", "ts")

    def __init__(self, ts: int, key: int, keys: tuple[int, ...], slot: int, sid: int) -> None:
        self.ts = ts
        self.key = key
        self.keys = keys
        self.slot = slot
        self.sid = sid


class _CountKey:
    """One key's count window: the last ``length`` tuples with their times, and what left since the last fire."""

    __slots__ = ("buf", "evicted", "fires", "since")

    def __init__(self) -> None:
        self.buf: deque[tuple[int, Tuple]] = deque()
        self.evicted: list[Tuple] = []
        self.since = 0
        self.fires = 0


class _TupleWindows:
    """The window engine of one :class:`WindowedBolt` task (its executor thread only)."""

    def __init__(
        self,
        bolt: WindowedBolt,
        spec: WindowSpec,
        context: TopologyContext,
        collector: OutputCollector,
        anchoring: _AnchoringCollector,
    ) -> None:
        self.bolt = bolt
        self.spec = spec
        self.collector = collector
        self.anchoring = anchoring
        self.reduce = _aggregating(bolt, WindowedBolt)
        self.prefix = f"{context.component_id}/{context.task_id}"
        self.inputs = window_inputs(context)
        self.channels = input_channels(context, self.inputs)
        self.watermark = Watermark(len(self.channels), spec.lag_ms, spec.epoch_watermark)
        self.event_time = spec.event_time
        self.late = 0
        self.fired_count = 0
        self.bad_times = 0
        self._srcs: dict[TupleSource, _Src] = {}
        self._sources: list[tuple[str, int, str]] = []
        self._source_objs: dict[tuple[str, int, str], TupleSource] = {}
        self.fired = NO_TIME
        # duration windows: pane start -> key -> tuples (or accumulator)
        self.panes: dict[int, dict[Any, Any]] = {}
        self._saved: dict[int, dict[Any, int]] = {}  # pane -> key -> tuples already in the state
        self._chunks: dict[int, list[int]] = {}  # pane -> txids of its state entries
        self._dirty: set[int] = set()
        # count windows
        self.counts: dict[Any, _CountKey] = {}
        self._pending: list[tuple[int, int, Any, Tuple]] = []  # event-time count windows: not yet released
        self._count_dirty: set[Any] = set()
        self._arrivals = 0
        # session windows
        self.sessions: Sessions[Any] = Sessions(spec.length, self._join)
        self._next_end = NO_TIME
        kind = spec.kind
        if spec.key == () and kind == "session":
            logger.info("component %s: session windows without 'key': one session stream per task", self.prefix)
        self.add: Callable[[Tuple], None] = {
            "duration": self._add_pane,
            "count": self._add_count,
            "session": self._add_session,
        }[kind]
        if kind == "duration":
            self._length, self._slide, self._pane = spec.length, spec.sliding, spec.pane

    # --- origins ----------------------------------------------------------------------------------
    def _src(self, source: TupleSource) -> _Src:
        info = self._srcs.get(source)
        if info is not None:
            return info
        spec = self.spec
        index = source.index
        if spec.timestamp_field is not None and spec.timestamp_field not in index:
            msg = (
                f"window of {self.prefix}: tuples from {source.component!r} stream {source.stream!r} have no "
                f"field {spec.timestamp_field!r} (fields {list(source.fields)}); it is the window's timestamp_field"
            )
            raise WindowError(msg)
        missing = [k for k in spec.key if k not in index]
        if missing:
            msg = (
                f"window of {self.prefix}: tuples from {source.component!r} stream {source.stream!r} have no "
                f"key field(s) {missing} (fields {list(source.fields)})"
            )
            raise WindowError(msg)
        slot = channel_slot(self.channels, self.watermark, source.component, source.stream, source.task)
        ident = (source.component, source.task, source.stream)
        if ident not in self._sources:
            self._sources.append(ident)
        keys = tuple(index[k] for k in spec.key)
        info = _Src(
            index[spec.timestamp_field] if spec.timestamp_field is not None else -1,
            keys[0] if len(keys) == 1 else -1,
            keys,
            slot,
            self._sources.index(ident),
        )
        self._srcs[source] = info
        return info

    def _key(self, info: _Src, values: list[Any]) -> Any:
        if info.key >= 0:
            return values[info.key]
        if not info.keys:
            return None
        return tuple(values[i] for i in info.keys)

    def _time(self, info: _Src, tup: Tuple) -> int | None:
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

    def _late(self, tup: Tuple) -> None:
        self.late += 1
        stream = self.spec.late_stream
        if stream is not None:
            self.collector.emit(tup.values, stream, anchors=tup)

    def _observe(self, info: _Src, tup: Tuple) -> int | None:
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
                self._late(tup)
                self.collector.ack(tup)
                return None
            if ts > wm.maxes[info.slot]:
                wm.advance(info.slot, ts)
        elif ts > wm.value:
            wm.value = ts  # processing time: the clock is the watermark
        return ts

    def tick(self) -> None:
        """Fire the windows that ended (every watermark interval): by the clock, or by an epoch's watermark."""
        if not self.event_time:
            now = time.time_ns() // 1_000_000
            if now > self.watermark.value:
                self.watermark.value = now
        self.anchoring.anchor = None
        self._evaluate()

    def _evaluate(self) -> None:
        kind = self.spec.kind
        if kind == "duration":
            if self.watermark.value >= self._next_end:
                self._fire_panes()
        elif kind == "session":
            self._fire_sessions()
        elif self.event_time:
            self._release_counts()

    # --- duration windows ---------------------------------------------------------------------------
    def _add_pane(self, tup: Tuple) -> None:
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
        pane = ts - ts % self._pane
        keyed = self.panes.get(pane)
        if keyed is None:
            keyed = self.panes[pane] = {}
        key = self._key(info, tup.values)
        if self.reduce:
            acc = keyed.get(key, _MISSING)
            bolt = self.bolt
            keyed[key] = bolt.add(bolt.zero() if acc is _MISSING else acc, tup)
        else:
            held = keyed.get(key)
            if held is None:
                keyed[key] = [tup]
            else:
                held.append(tup)
        self._dirty.add(pane)
        if self.watermark.value >= self._next_end:
            self.anchoring.anchor = tup
            self._fire_panes()
        self.collector.ack(tup)

    def _fire_panes(self) -> None:
        wm = self.watermark.value
        if wm <= NO_TIME:
            return  # not every input has sent an event yet
        length, slide, pane = self._length, self._slide, self._pane
        panes = self.panes
        failure: Exception | None = None
        for start in due_starts(panes, self.fired, wm, length, slide, pane):
            end = start + length
            spans = [panes[p] for p in range(start, end, pane) if p in panes]
            keys: dict[Any, None] = {}
            for keyed in spans:
                keys.update(dict.fromkeys(keyed))
            for key in keys:
                window = self._pane_window(start, end, key, spans)
                failure = self._call(window, failure)
        self.fired = max(self.fired, wm)
        self._next_end = next_end(self.fired, length, slide)
        keep = first_open_start(self.fired, length, slide) - (0 if self.reduce else slide)
        for p in [p for p in panes if p + pane <= keep]:
            self._evict(p)
        if failure is not None:
            raise failure

    def _pane_window(self, start: int, end: int, key: Any, spans: list[dict[Any, Any]]) -> TupleWindow:
        wid = f"{self.prefix}/{start}-{end}" if not self.spec.key else f"{self.prefix}/{start}-{end}/{key}"
        if self.reduce:
            merge = self.bolt.merge
            value: Any = _MISSING
            for keyed in spans:
                acc = keyed.get(key, _MISSING)
                if acc is not _MISSING:
                    value = acc if value is _MISSING else merge(value, acc)
            return TupleWindow(start, end, key, wid, None, value=value)
        pane, slide, panes = self._pane, self._slide, self.panes
        parts = [held for keyed in spans if (held := keyed.get(key))]
        new_from = max(start, end - slide)
        new = [held for p in range(new_from, end, pane) if p in panes and (held := panes[p].get(key))]
        expired = [
            held
            for p in range(start - slide, min(start, end - slide), pane)
            if p in panes and (held := panes[p].get(key))
        ]
        return TupleWindow(start, end, key, wid, parts, new, expired)

    def _evict(self, pane: int) -> None:
        del self.panes[pane]
        self._saved.pop(pane, None)
        self._dirty.discard(pane)
        for txid in self._chunks.pop(pane, ()):
            self.bolt.state.delete([WINDOW_PREFIX, "p", pane, txid])
        if self.reduce:
            self.bolt.state.delete([WINDOW_PREFIX, "a", pane])

    # --- count windows ---------------------------------------------------------------------------------
    def _add_count(self, tup: Tuple) -> None:
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
        key = self._key(info, tup.values)
        self.anchoring.anchor = tup
        if self.event_time:
            self._arrivals += 1
            heapq.heappush(self._pending, (ts, self._arrivals, key, tup))
            self._release_counts()
        else:
            self._count(key, ts, tup)
        self.collector.ack(tup)

    def _release_counts(self) -> None:
        """Event time: tuples older than the watermark join their count windows, oldest first."""
        pending, wm = self._pending, self.watermark.value
        failure: Exception | None = None
        while pending and pending[0][0] < wm:
            ts, _, key, tup = heapq.heappop(pending)
            try:
                self._count(key, ts, tup)
            except Exception as exc:  # the user's execute_window: fire the rest, raise the first
                failure = failure or exc
        if failure is not None:
            raise failure

    def _count(self, key: Any, ts: int, tup: Tuple) -> None:
        state = self.counts.get(key)
        if state is None:
            state = self.counts[key] = _CountKey()
        buf = state.buf
        buf.append((ts, tup))
        if len(buf) > self.spec.length:
            state.evicted.append(buf.popleft()[1])
        state.since += 1
        self._count_dirty.add(key)
        if state.since >= self.spec.sliding:
            state.since = 0
            state.fires += 1
            tuples = [t for _, t in buf]
            new = tuples[-self.spec.sliding :]
            expired, state.evicted = state.evicted, []
            suffix = f"/{key}" if self.spec.key else ""
            wid = f"{self.prefix}{suffix}/#{state.fires}"
            value = _MISSING
            if self.reduce:
                bolt = self.bolt
                value = bolt.zero()
                for t in tuples:
                    value = bolt.add(value, t)
            window = TupleWindow(buf[0][0], buf[-1][0] + 1, key, wid, [tuples], [new], [expired], value)
            failure = self._call(window, None)
            if failure is not None:
                raise failure

    # --- session windows -------------------------------------------------------------------------------
    def _join(self, a: Any, b: Any) -> Any:
        if self.reduce:
            return self.bolt.merge(a, b)
        return a + b

    def _add_session(self, tup: Tuple) -> None:
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
        key = self._key(info, tup.values)
        sessions = self.sessions
        session = sessions.place(key, ts)
        if session is None:
            bolt = self.bolt
            sessions.open(key, ts, ts, bolt.add(bolt.zero(), tup) if self.reduce else [tup])
        elif self.reduce:
            session.payload = self.bolt.add(session.payload, tup)
        else:
            session.payload.append(tup)
        nxt = sessions.next_end
        if nxt is not None and nxt <= self.watermark.value:
            self.anchoring.anchor = tup
            self._fire_sessions()
        self.collector.ack(tup)

    def _fire_sessions(self) -> None:
        failure: Exception | None = None
        for session in self.sessions.close_until(self.watermark.value):
            failure = self._call(self._session_window(session), failure)
        if failure is not None:
            raise failure

    def _session_window(self, session: Session[Any]) -> TupleWindow:
        end = session.last + self.spec.length
        suffix = f"/{session.key}" if self.spec.key else ""
        wid = f"{self.prefix}{suffix}/{session.start}-{end}"
        if self.reduce:
            return TupleWindow(session.start, end, session.key, wid, None, value=session.payload)
        return TupleWindow(session.start, end, session.key, wid, [session.payload], [session.payload], [])

    # --- calling the bolt ------------------------------------------------------------------------------
    def _call(self, window: TupleWindow, failure: Exception | None) -> Exception | None:
        """Run ``execute_window``; an exception is logged and returned (the first one is raised after the rest)."""
        self.fired_count += 1
        try:
            self.bolt.execute_window(window)
        except Exception as exc:
            logger.exception("%s: execute_window raised on %s", self.prefix, window.id)
            return failure or exc
        return failure

    # --- state -----------------------------------------------------------------------------------------
    def _entry(self, tup: Tuple) -> list[Any]:
        info = self._srcs.get(tup.source) or self._src(tup.source)
        return [info.sid, tup.values]

    def save(self, state: KeyValueState, txid: int) -> None:
        """Put what changed since the last checkpoint into the state (before epoch ``txid`` is written)."""
        if self.event_time:
            # an aligned barrier: every channel delivered the epoch.  The windows it closes fire
            # now, so their results go out before the barrier and commit with this epoch.
            self.watermark.epoch()
            self.tick()
        kind = self.spec.kind
        if kind == "duration":
            for pane in sorted(self._dirty):
                keyed = self.panes.get(pane)
                if keyed is None:
                    continue
                if self.reduce:
                    state.put([WINDOW_PREFIX, "a", pane], [[k, acc] for k, acc in keyed.items()])
                    continue
                saved = self._saved.setdefault(pane, {})
                entries: list[list[Any]] = []
                for key, held in keyed.items():
                    done = saved.get(key, 0)
                    if done < len(held):
                        entries.extend(self._entry(t) for t in held[done:])
                        saved[key] = len(held)
                if entries:
                    state.put([WINDOW_PREFIX, "p", pane, txid], entries)
                    self._chunks.setdefault(pane, []).append(txid)
            self._dirty.clear()
        elif kind == "count":
            for key in self._count_dirty:
                c = self.counts.get(key)
                if c is None:
                    continue
                state.put(
                    [WINDOW_PREFIX, "c", key],
                    {
                        "buf": [[ts, *self._entry(t)] for ts, t in c.buf],
                        "evicted": [self._entry(t) for t in c.evicted],
                        "since": c.since,
                        "fires": c.fires,
                    },
                )
            self._count_dirty.clear()
            if self.event_time:
                pending = [[ts, seq, *self._entry(t)] for ts, seq, _key, t in self._pending]
                state.put([WINDOW_PREFIX, "pending"], pending)
        else:
            sessions = self.sessions
            for key in sessions.dirty:
                held = sessions.by_key.get(key)
                if not held:
                    state.delete([WINDOW_PREFIX, "s", key])
                    continue
                stored = [
                    [s.start, s.last, s.payload if self.reduce else [self._entry(t) for t in s.payload]] for s in held
                ]
                state.put([WINDOW_PREFIX, "s", key], stored)
            sessions.dirty.clear()
        state.put(
            [WINDOW_PREFIX, "meta"],
            {
                "maxes": list(self.watermark.maxes),
                "clock": self.watermark.value,
                "fired": self.fired,
                "late": self.late,
                "windows": self.fired_count,
                "arrivals": self._arrivals,
                "sources": [list(s) for s in self._sources],
            },
        )

    def _source_obj(self, sid: int) -> TupleSource:
        component, task, stream = self._sources[sid]
        ident = (component, task, stream)
        obj = self._source_objs.get(ident)
        if obj is None:
            fields: tuple[str, ...] = ()
            for c, s, f in self.inputs:
                if c == component and s == stream:
                    fields = f
                    break
            obj = self._source_objs[ident] = TupleSource(component, task, stream, fields)
        return obj

    def _tuple(self, entry: list[Any]) -> Tuple:
        sid, values = entry[0], entry[1]
        tup = Tuple(list(values), self._source_obj(int(sid)))
        return tup

    def load(self, state: KeyValueState) -> None:
        """Rebuild the windows from ``state`` (at start, and after a rollback put it back)."""
        self.panes.clear()
        self._saved.clear()
        self._chunks.clear()
        self._dirty.clear()
        self.counts.clear()
        self._pending.clear()
        self._count_dirty.clear()
        self.sessions.clear()
        self._srcs.clear()
        meta = state.get([WINDOW_PREFIX, "meta"]) or {}
        self._sources = [(str(c), int(t), str(s)) for c, t, s in meta.get("sources", [])]
        self.watermark = Watermark(len(self.channels), self.spec.lag_ms, self.spec.epoch_watermark)
        if meta:
            if self.event_time:
                self.watermark.restore(list(meta.get("maxes", [])), int(meta.get("clock", NO_TIME)))
            else:
                self.watermark.value = int(meta.get("clock", NO_TIME))
        self.fired = int(meta.get("fired", NO_TIME))
        self.late = int(meta.get("late", 0))
        self.fired_count = int(meta.get("windows", 0))
        self._arrivals = int(meta.get("arrivals", 0))
        chunks: list[tuple[int, int, list[Any]]] = []
        for key, value in state.items():
            if not (isinstance(key, list) and key and key[0] == WINDOW_PREFIX):
                continue
            kind = key[1]
            if kind == "p":
                chunks.append((int(key[2]), int(key[3]), value))
            elif kind == "a":
                self.panes[int(key[2])] = {self._thaw_key(k): acc for k, acc in value}
            elif kind == "c":
                self._load_count(self._thaw_key(key[2]), value)
            elif kind == "pending":
                for ts, seq, sid, values in value:
                    tup = self._tuple([sid, values])
                    info = self._src(tup.source)
                    self._pending.append((int(ts), int(seq), self._key(info, tup.values), tup))
                heapq.heapify(self._pending)
            elif kind == "s":
                k = self._thaw_key(key[2])
                for start, last, payload in value:
                    held = payload if self.reduce else [self._tuple(e) for e in payload]
                    self.sessions.open(k, int(start), int(last), held)
        for pane, txid, entries in sorted(chunks, key=lambda c: (c[0], c[1])):
            keyed = self.panes.setdefault(pane, {})
            saved = self._saved.setdefault(pane, {})
            for entry in entries:
                tup = self._tuple(entry)
                key = self._key(self._src(tup.source), tup.values)
                keyed.setdefault(key, []).append(tup)
                saved[key] = saved.get(key, 0) + 1
            self._chunks.setdefault(pane, []).append(txid)
        self.sessions.dirty.clear()
        if self.spec.kind == "duration":
            self._next_end = next_end(self.fired, self._length, self._slide)

    def _thaw_key(self, key: Any) -> Any:
        return tuple(key) if isinstance(key, list) else key

    def _load_count(self, key: Any, value: Mapping[str, Any]) -> None:
        c = self.counts[key] = _CountKey()
        for ts, sid, values in value.get("buf", []):
            c.buf.append((int(ts), self._tuple([sid, values])))
        c.evicted = [self._tuple(e) for e in value.get("evicted", [])]
        c.since = int(value.get("since", 0))
        c.fires = int(value.get("fires", 0))

    def metrics(self) -> WindowMetrics:
        # An HTTP thread reads this while the executor changes the panes: iterate copies (a
        # list() of a dict's values is taken whole, under the GIL).
        if self.spec.kind == "duration":
            held = sum(
                len(keyed) if self.reduce else sum(len(v) for v in list(keyed.values()))
                for keyed in list(self.panes.values())
            )
        elif self.spec.kind == "count":
            held = sum(len(c.buf) for c in list(self.counts.values())) + len(self._pending)
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
