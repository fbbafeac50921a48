"""The window engine of one task: Storm's ``WindowedBoltExecutor``, held by the task's executor.

The executor builds it (:func:`spark_storm.worker.windows.window_engine`) and gives it what
it would have given the bolt, ticks included.  The engine keeps the task's input channels
and watermark, counts what is late or has no usable time, places the rest in the windows of
the component's spec (a kind: :class:`~.kinds.Panes`, counts or
:class:`~.kinds.SessionWindows`), and calls the bolt's ``execute_window`` as windows close.
How a window holds its rows is a storage strategy, a subclass: tuples or accumulators
(:class:`~.rows.RowEngine`), Arrow panes with ``combine`` (:class:`~.arrow.ArrowEngine`).
The checkpoint machinery asks it to :meth:`~WindowEngine.save` and :meth:`~WindowEngine.load`
the windows, under ``"__window"`` keys of the task's KeyValueState.

Threads: all of it runs on the executor's thread (a rollback's ``load`` on the manager's,
with the executor quiesced); :meth:`~WindowEngine.metrics` reads numbers only, from any thread.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Generic, Protocol, TypeVar

from spark_storm.codec.tuples import CLIENT_COMPONENT, TupleSource
from spark_storm.errors import ConfigError, WindowError
from spark_storm.reports import WindowMetrics
from spark_storm.state.kv import KeyValueState
from spark_storm.topology.model import DEFAULT_STREAM
from spark_storm.topology.windows import WindowSpec, window_spec
from spark_storm.worker.bolt import BatchOutputCollector, OutputCollector, TopologyContext
from spark_storm.worker.windows.core import NO_TIME, Watermark

__all__ = ["WINDOW_PREFIX", "Anchoring", "Kind", "WindowEngine", "thaw", "windowed_spec"]

logger = logging.getLogger(__name__)

#: State keys of the window engine start with this (the bolt's own keys must not).
WINDOW_PREFIX: Final = "__window"

#: An input channel: (component, stream, upstream task); task -1 stands for any task.
Channel = tuple[str, str, int]
#: State entries of the engine: (key without the prefix's list head, value).
Entries = list[tuple[list[Any], Any]]
W = TypeVar("W")


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


def thaw(key: Any) -> Any:
    """Return a window key the state gives back (a list) as the engine keyed it (a tuple)."""
    return tuple(key) if isinstance(key, list) else key


class Kind(Protocol):
    """A kind of window over one storage (panes, counts, sessions): what the engine asks of it."""

    @property
    def held(self) -> int: ...  # rows, accumulators or sessions in open windows (kept by the executor thread)
    def evaluate(self) -> None: ...  # fire what the watermark closed (a tick, an epoch)
    def save(self, state: KeyValueState, txid: int) -> None: ...  # what changed since the last checkpoint
    def load(self, entries: Entries, meta: Mapping[str, Any]) -> None: ...  # into a new kind object


class Anchoring(OutputCollector, BatchOutputCollector):
    """The collector a windowed bolt is prepared with: the task's, anchoring what a window emits.

    Emits without anchors are anchored to ``anchor``: the tuple or batch whose arrival closed
    the window (None when a tick or an epoch closed it).
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.anchor: Any = None

    def emit(self, values: Sequence[Any], stream: str = DEFAULT_STREAM, anchors: Any = None) -> list[int]:
        return self.inner.emit(values, stream, self.anchor if anchors is None else anchors)  # type: ignore[no-any-return]

    def emit_direct(self, task: int, values: Sequence[Any], stream: str = DEFAULT_STREAM, anchors: Any = None) -> None:
        self.inner.emit_direct(task, values, stream, self.anchor if anchors is None else anchors)

    def emit_batch(self, data: Any, stream: str = DEFAULT_STREAM, anchors: Any = None, tasks: Any = None) -> None:
        self.inner.emit_batch(data, stream, self.anchor if anchors is None else anchors, tasks)

    def ack(self, item: Any) -> None:
        self.inner.ack(item)

    def fail(self, item: Any) -> None:
        self.inner.fail(item)

    def report_error(self, error: str) -> None:
        self.inner.report_error(error)


class Source:
    """What the engine knows about one origin: field positions, watermark slot, id in the state."""

    __slots__ = ("key", "keys", "sid", "slot", "ts")

    def __init__(self, ts: int, keys: tuple[int, ...], slot: int, sid: int) -> None:
        self.ts = ts
        self.key = keys[0] if len(keys) == 1 else -1
        self.keys = keys
        self.slot = slot
        self.sid = sid


class WindowEngine(abc.ABC, Generic[W]):
    """The windows of one task (its executor's thread only; :meth:`metrics` from any thread).

    Subclasses are the storage strategies: they take the executor's items in (:meth:`execute`),
    build the windows (``W``) and encode what windows hold.  A window's payload is a list of
    what it holds unless a subclass says otherwise (``start``, ``put``, ``join``).
    """

    noun = "tuples"

    def __init__(self, bolt: Any, spec: WindowSpec, context: TopologyContext, collector: Any) -> None:
        self.bolt = bolt
        self.spec = spec
        self.collector = collector  # the task's own: acks, the late stream, errors
        self.anchoring = Anchoring(collector)
        self.prefix = f"{context.component_id}/{context.task_id}"
        self.inputs = window_inputs(context)
        self.channels: dict[Channel, int] = {}
        for component, stream, _fields in self.inputs:
            tasks = context.plan.component_tasks.get(component) if context.plan is not None else None
            for task in tasks if tasks else (-1,):  # a source component's channel is the client's
                self.channels[(component, stream, task)] = len(self.channels)
        self.watermark = Watermark(len(self.channels), spec.lag_ms, spec.epoch_watermark)
        self.event_time = spec.event_time
        self.late = 0
        self.bad_times = 0
        self.fired_count = 0
        self.fired = NO_TIME
        self.state = KeyValueState()  # the task's, from the first load on
        self._srcs: dict[TupleSource, Source] = {}
        self.kind = self._kind()

    @abc.abstractmethod
    def _kind(self) -> Kind:
        """Return a new, empty window kind of the spec's (``duration``, ``count``, ``session``) for this storage."""

    # --- input ------------------------------------------------------------------------------
    @abc.abstractmethod
    def execute(self, item: Any) -> None:
        """Take what the bolt would have been given (a tuple, or a batch; ticks too), and ack it."""

    def _src(self, source: TupleSource) -> Source:
        """Return what the engine knows about ``source`` (checking it has the spec's fields)."""
        info = self._srcs.get(source)
        if info is not None:
            return info
        spec, index = self.spec, source.index
        where = f"window of {self.prefix}: {self.noun} from {source.component!r}"
        if spec.timestamp_field is not None and spec.timestamp_field not in index:
            msg = (
                f"{where} stream {source.stream!r} have no field {spec.timestamp_field!r} "
                f"(fields {list(source.fields)}); it is the window's timestamp_field"
            )
            raise WindowError(msg)
        missing = [k for k in spec.key if k not in index]
        if missing:
            msg = self._no_key(where, source, missing)
            raise WindowError(msg)
        slot = self.channels.get((source.component, source.stream, source.task))
        if slot is None:
            slot = self.channels.get((source.component, source.stream, -1))
        if slot is None:  # an upstream task the plan did not name
            slot = self.channels[(source.component, source.stream, source.task)] = self.watermark.add_channel()
        ts = index[spec.timestamp_field] if spec.timestamp_field is not None else -1
        info = self._srcs[source] = Source(ts, tuple(index[k] for k in spec.key), slot, self._sid(source))
        return info

    def _no_key(self, where: str, source: TupleSource, missing: list[str]) -> str:
        return f"{where} stream {source.stream!r} have no key field(s) {missing} (fields {list(source.fields)})"

    def _sid(self, source: TupleSource) -> int:
        return -1

    def _clock(self) -> int:
        """Return the time now (processing time: the clock is the watermark)."""
        now = time.time_ns() // 1_000_000
        if now > self.watermark.value:
            self.watermark.value = now
        return now

    # --- firing -------------------------------------------------------------------------------
    def tick(self) -> None:
        """Fire the windows that ended (every watermark interval): by the clock, or by an epoch's watermark."""
        if not self.event_time:
            self._clock()
        self.anchoring.anchor = None
        self.kind.evaluate()

    def call(self, windows: Iterable[Any]) -> Exception | None:
        """Run ``execute_window`` on each window; log any exception and return the first (to raise once done)."""
        failure: Exception | None = None
        for window in windows:
            self.fired_count += 1
            try:
                self.bolt.execute_window(window)
            except Exception as exc:
                logger.exception("%s: execute_window raised on %s", self.prefix, window.id)
                failure = failure or exc
        return failure

    # --- what a window holds (the storage strategy) -------------------------------------------
    @abc.abstractmethod
    def window(
        self, start: int, end: int, key: Any, wid: str, parts: list[Any], new: Any = None, expired: Any = None
    ) -> W | None:
        """Return the window of payloads ``parts``, in time order (``new``/``expired``: None for all/none)."""

    def start(self, item: Any) -> Any:
        """Return a payload holding ``item`` alone."""
        return [item]

    def put(self, payload: Any, item: Any) -> Any:
        """Return ``payload`` with ``item`` added."""
        payload.append(item)
        return payload

    def join(self, a: Any, b: Any) -> Any:
        """Return the payload of two merged sessions."""
        return a + b

    @abc.abstractmethod
    def encode(self, payload: Any) -> Any:
        """Return a payload as a state value (``decode`` reads it back)."""

    @abc.abstractmethod
    def decode(self, value: Any) -> Any: ...

    # --- state ----------------------------------------------------------------------------------
    def save(self, state: KeyValueState, txid: int) -> None:
        """Put what changed since the last checkpoint into the state (before epoch ``txid`` is written)."""
        if self.event_time:
            # an aligned barrier: every channel delivered the epoch.  The windows it closes fire
            # now, so their results go out before the barrier and commit with this epoch.
            self.watermark.epoch()
            self.tick()
        self.kind.save(state, txid)
        state.put(
            [WINDOW_PREFIX, "meta"],
            {
                "maxes": list(self.watermark.maxes),
                "clock": self.watermark.value,
                "fired": self.fired,
                "late": self.late,
                "windows": self.fired_count,
                **self._meta(),
            },
        )

    def _meta(self) -> dict[str, Any]:
        return {}

    def load(self, state: KeyValueState) -> None:
        """Rebuild the windows from ``state`` (at start, and after a rollback put it back)."""
        self.state = state
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
        self._load_meta(meta)
        entries = [
            (key[1:], value) for key, value in state.items() if isinstance(key, list) and key[:1] == [WINDOW_PREFIX]
        ]
        kind = self._kind()
        kind.load(entries, meta)
        self.kind = kind

    def _load_meta(self, meta: Mapping[str, Any]) -> None:
        pass

    def metrics(self) -> WindowMetrics:
        """Return the task's window counters (any thread: numbers the executor thread keeps, no iteration)."""
        wm = self.watermark.value
        return {
            "spec": self.spec.describe(),
            "watermark_ms": None if wm <= NO_TIME else wm,
            "windows": self.fired_count,
            "late": self.late,
            "bad_times": self.bad_times,
            "held": self.kind.held,
        }
