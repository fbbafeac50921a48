"""Window kinds: when windows close and what they hold, over any storage (the engine's subclass).

* :class:`Panes`: duration windows, kept as panes of ``gcd(length, slide)`` milliseconds, so a
  row is held once however many sliding windows hold it; a window is the panes it spans.
  Each storage subclasses it with how a pane keeps its rows and saves them.
* Count windows are each storage's own (:mod:`.rows` keeps them per key, :mod:`.arrow` as one
  table): their state formats differ.
* :class:`SessionWindows`: sessions per key (:class:`~.core.Sessions`), whatever they hold.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from spark_storm.state.kv import KeyValueState
from spark_storm.worker.windows.core import NO_TIME, Session, Sessions, due_starts, first_open_start, next_end
from spark_storm.worker.windows.engine import WINDOW_PREFIX, Entries, WindowEngine, thaw

__all__ = ["Panes", "SessionWindows"]


class Panes:
    """Duration windows: the panes, which windows are due, and eviction (storages add the rest)."""

    #: Keep one slide more than the open windows need, for ``window.expired``.
    keeps_expired = True

    def __init__(self, engine: WindowEngine[Any]) -> None:
        spec = engine.spec
        self.engine = engine
        self.length, self.slide, self.pane = spec.length, spec.sliding, spec.pane
        #: pane start -> key -> payload (a storage's: tuples, an accumulator, record batches)
        self.panes: dict[int, dict[Any, Any]] = {}
        self.chunks: dict[int, list[int]] = {}  # pane -> txids of its state entries
        self.next_end = next_end(engine.fired, self.length, self.slide)
        self.held = 0

    def evaluate(self) -> None:
        if self.engine.watermark.value >= self.next_end:
            self.fire()

    def fire(self) -> None:
        """Fire the windows the watermark ended, then evict the panes no open window holds."""
        engine = self.engine
        wm = engine.watermark.value
        if wm <= NO_TIME:
            return  # not every input has sent an event yet
        self.seal(wm)
        failure = engine.call(self._due(wm))
        length, slide = self.length, self.slide
        engine.fired = max(engine.fired, wm)
        self.next_end = next_end(engine.fired, length, slide)
        keep = first_open_start(engine.fired, length, slide) - (slide if self.keeps_expired else 0)
        for p in [p for p in self.panes if p + self.pane <= keep]:
            self.evict(p)
        if failure is not None:
            raise failure

    def _due(self, wm: int) -> Iterator[Any]:
        engine, panes, pane, slide = self.engine, self.panes, self.pane, self.slide
        keyed_ids = bool(engine.spec.key)
        for start in due_starts(panes, engine.fired, wm, self.length, slide, pane):
            end = start + self.length
            spans = [panes[p] for p in range(start, end, pane) if p in panes]
            for key in dict.fromkeys(k for keyed in spans for k in keyed):
                parts = [keyed[key] for keyed in spans if key in keyed]
                new = expired = None
                if self.keeps_expired:
                    new = [panes[p][key] for p in range(max(start, end - slide), end, pane) if key in panes.get(p, ())]
                    old = range(start - slide, min(start, end - slide), pane)
                    expired = [panes[p][key] for p in old if key in panes.get(p, ())]
                wid = f"{engine.prefix}/{start}-{end}/{key}" if keyed_ids else f"{engine.prefix}/{start}-{end}"
                window = engine.window(start, end, key, wid, parts, new, expired)
                if window is not None:
                    yield window

    def seal(self, wm: int) -> None:
        """Panes the watermark passed can take no more rows (a storage may shrink them)."""

    def evict(self, pane: int) -> None:
        """Drop a pane no open window holds, and its state entries."""
        raise NotImplementedError


class SessionWindows:
    """Session windows per key, closed by a gap (Spark's ``session_window``), over any payload."""

    def __init__(self, engine: WindowEngine[Any]) -> None:
        self.engine = engine
        self.sessions: Sessions[Any] = Sessions(engine.spec.length, engine.join)

    @property
    def held(self) -> int:
        return len(self.sessions)

    def add(self, ts: int, key: Any, item: Any) -> None:
        """One row at ``ts`` (fired at once if the watermark already closed its session)."""
        self.place(key, ts, ts, item)
        self.evaluate()

    def place(self, key: Any, low: int, high: int, item: Any) -> None:
        """Put ``item`` (events from ``low`` to ``high``, closer than the gap) in a session of ``key``."""
        sessions = self.sessions
        session = sessions.place(key, low)
        if session is None:
            sessions.open(key, low, high, self.engine.start(item))
            return
        session.payload = self.engine.put(session.payload, item)
        if high > session.last:
            sessions.grow(key, session, low, high)

    def evaluate(self) -> None:
        nxt = self.sessions.next_end
        wm = self.engine.watermark.value
        if nxt is None or nxt > wm:
            return
        failure = self.engine.call(self._window(s) for s in self.sessions.close_until(wm))
        if failure is not None:
            raise failure

    def _window(self, session: Session[Any]) -> Any:
        engine = self.engine
        end = session.last + self.sessions.gap
        suffix = f"/{session.key}" if engine.spec.key else ""
        wid = f"{engine.prefix}{suffix}/{session.start}-{end}"
        return engine.window(session.start, end, session.key, wid, [session.payload])

    def save(self, state: KeyValueState, txid: int) -> None:
        sessions, encode = self.sessions, self.engine.encode
        for key in sessions.dirty:
            held = sessions.by_key.get(key)
            if held:
                state.put([WINDOW_PREFIX, "s", key], [[s.start, s.last, encode(s.payload)] for s in held])
            else:
                state.delete([WINDOW_PREFIX, "s", key])
        sessions.dirty.clear()

    def load(self, entries: Entries, meta: Mapping[str, Any]) -> None:
        decode = self.engine.decode
        for key, value in entries:
            if key[0] == "s":
                for start, last, payload in value:
                    self.sessions.open(thaw(key[1]), int(start), int(last), decode(payload))
        self.sessions.dirty.clear()
