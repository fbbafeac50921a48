"""The core every window engine stands on: event time, watermarks, which windows are due, sessions.

Windows are aligned as Spark's ``window()`` aligns them: a window of length ``L`` sliding by
``S`` covers ``[s, s + L)`` for every ``s`` that is a multiple of ``S`` (epoch milliseconds).
A duration window is kept as *panes* of ``gcd(L, S)`` milliseconds, so a tuple is stored
once however many sliding windows hold it, and a window is the panes it spans.

The watermark of a task is the minimum over its inputs (``component/stream``) of the
newest event time seen on that input, minus the lag (Storm's ``WaterMarkEventGenerator``
and Flink take the same minimum); it advances with every tuple, so what is late and when
a window closes depend only on the input, not on timers.  A tuple older than the
watermark is late.  A window is due once the watermark reaches its end.
"""

from __future__ import annotations

import datetime as dt
import heapq
import math
from collections.abc import Callable, Iterable
from typing import Any, Final, Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_storm.errors import WindowError

__all__ = [
    "NO_TIME",
    "Session",
    "Sessions",
    "Watermark",
    "due_starts",
    "event_ms",
    "event_ms_array",
    "first_open_start",
    "next_end",
]

#: "No time yet": below every event time.
NO_TIME: Final = -(1 << 62)
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_NAIVE: Final = dt.datetime(1970, 1, 1)
_MS: Final = dt.timedelta(milliseconds=1)


def event_ms(value: Any, field: str) -> int:
    """Return an event time in epoch milliseconds.

    A ``datetime`` (Spark's ``TimestampType`` arrives zone-aware; a naive one, Spark's
    ``TimestampNTZType``, is read as UTC) or epoch milliseconds (int, or a float's whole part).

    Raises
    ------
    WindowError
        None, another type, or a float that is not finite; names the field and the value.
    """
    kind = type(value)
    if kind is int:
        return int(value)
    if isinstance(value, dt.datetime):  # pandas' Timestamp is one too
        return int((value - (_EPOCH if value.tzinfo is not None else _EPOCH_NAIVE)) // _MS)
    if isinstance(value, float) and math.isfinite(value):
        return math.floor(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    msg = (
        f"event time field {field!r} holds {value!r} ({type(value).__name__}); it must be a timestamp "
        "(Spark's TimestampType) or epoch milliseconds (an integer)"
    )
    raise WindowError(msg)


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


class Watermark:
    """The newest event time per input channel and the watermark: their minimum minus ``lag``.

    A channel is one upstream task of one input stream (Flink's input channels): each task's
    tuples arrive in its own order, while two tasks of one component run apart by whatever
    the parallel work between them takes (a micro-batch, split over tasks) — per stream, as
    Storm keeps it, a fast task's newest time would make a slow task's tuples late.

    With ``aligned`` the watermark moves only at :meth:`epoch`, called at an aligned
    checkpoint barrier (every channel delivered the epoch): what the epoch's tuples say, as
    Spark moves its watermark between micro-batches.  The tasks upstream reorder what one
    micro-batch holds (its partitions go through several tasks at once), by up to the whole
    batch; moved per tuple, the watermark would make that reordering late.  Without
    ``aligned`` (no checkpoints) it moves at every tuple, as in Storm.

    Until every channel has sent an event the watermark stays at :data:`NO_TIME`, so no
    window closes on one task's word alone.  A channel that sent nothing during a whole
    epoch is idle and does not hold the watermark back until it sends again; its next
    tuples older than the watermark are then late (Flink's idleness).
    """

    __slots__ = ("active", "aligned", "idle", "lag", "maxes", "value")

    def __init__(self, channels: int, lag: int, aligned: bool = False) -> None:
        n = max(1, channels)
        self.aligned = aligned
        self.maxes = [NO_TIME] * n
        self.active = [False] * n  # sent during the current epoch
        self.idle = [False] * n
        self.lag = lag
        self.value = NO_TIME

    def add_channel(self) -> int:
        """Return a new channel's slot (an upstream task the topology did not name)."""
        self.maxes.append(NO_TIME)
        self.active.append(False)
        self.idle.append(False)
        return len(self.maxes) - 1

    def sent(self, slot: int) -> None:
        """Channel ``slot`` sent a tuple this epoch (it is not idle)."""
        self.active[slot] = True
        if self.idle[slot]:
            self.idle[slot] = False

    def advance(self, slot: int, ts: int) -> None:
        """Channel ``slot`` saw ``ts`` (newer than its maximum)."""
        maxes = self.maxes
        maxes[slot] = ts
        if self.aligned:
            return
        if len(maxes) == 1:
            self._raise(ts)
        else:
            self._recompute()

    def epoch(self) -> None:
        """End an aligned epoch: channels that sent nothing in it become idle."""
        self.idle = [not a for a in self.active]
        self.active = [False] * len(self.maxes)
        self._recompute()

    def _recompute(self) -> None:
        idle = self.idle
        live = [m for i, m in enumerate(self.maxes) if not idle[i]]
        if live:
            self._raise(min(live))

    def _raise(self, low: int) -> None:
        if low != NO_TIME:
            value = low - self.lag
            if value > self.value:
                self.value = value

    def restore(self, maxes: list[int], clock: int) -> None:
        """Put back the channels' maxima and the watermark (``clock``) a checkpoint saved."""
        if len(maxes) == len(self.maxes):
            self.maxes = [int(m) for m in maxes]
        self.value = int(clock)
        self._recompute()


def first_open_start(fired: int, length: int, slide: int) -> int:
    """Return the first window start whose window ends after ``fired`` (windows before it are done)."""
    if fired <= NO_TIME:
        return NO_TIME
    return ((fired - length) // slide + 1) * slide


def next_end(fired: int, length: int, slide: int) -> int:
    """Return the first window end after ``fired``: the watermark that makes the next window due."""
    if fired <= NO_TIME:
        return NO_TIME
    return first_open_start(fired, length, slide) + length


def due_starts(panes: Iterable[int], fired: int, watermark: int, length: int, slide: int, pane: int) -> list[int]:
    """Return the starts of the windows due now: their end in ``(fired, watermark]``, holding at least one pane.

    Only windows that hold a pane are returned, so a jump of the watermark over a long
    silence costs the panes held, not the windows passed.
    """
    hi = watermark - length  # start <= hi: the window ended
    lo = fired - length if fired > NO_TIME else NO_TIME  # start > lo: it had not ended before
    if hi <= lo:
        return []
    out: set[int] = set()
    for p in panes:
        # windows holding pane p start in [p + pane - length, p]
        a = max(lo + 1, p + pane - length)
        b = min(hi, p)
        s = -((-a) // slide) * slide  # the first multiple of slide >= a
        while s <= b:
            out.add(s)
            s += slide
    return sorted(out)


P = TypeVar("P")


class Session(Generic[P]):
    """One session of one key: its first and last event time and what it holds."""

    __slots__ = ("alive", "key", "last", "payload", "start")

    def __init__(self, key: Any, start: int, last: int, payload: P) -> None:
        self.key = key
        self.start = start
        self.last = last
        self.payload = payload
        self.alive = True


class Sessions(Generic[P]):
    """Session windows per key, closed by a gap (Spark's ``session_window`` and Flink's).

    An event at ``ts`` opens ``[ts, ts + gap)``; sessions whose spans overlap merge, so a
    session is ``[first event, last event + gap)``.  ``join`` merges two payloads.
    """

    def __init__(self, gap: int, join: Callable[[P, P], P]) -> None:
        self.gap = gap
        self._join = join
        self.by_key: dict[Any, list[Session[P]]] = {}
        self._heap: list[tuple[int, int, Session[P]]] = []
        self._seq = 0
        self._open = 0  # kept as sessions open and close: metrics() reads it from HTTP threads
        self.dirty: set[Any] = set()

    def __len__(self) -> int:
        return self._open

    def place(self, key: Any, ts: int) -> Session[P] | None:
        """Return the open session of ``key`` that an event at ``ts`` joins, or None (a new one)."""
        sessions = self.by_key.get(key)
        if not sessions:
            return None
        last = sessions[-1]
        gap = self.gap
        if last.start - gap < ts < last.last + gap and (len(sessions) == 1 or ts >= last.start):
            return self.grow(key, last, ts, ts)
        for s in sessions:
            if s.start - gap < ts < s.last + gap:
                return self.grow(key, s, ts, ts)
        return None

    def open(self, key: Any, start: int, last: int, payload: P) -> Session[P]:
        """Add a session (and merge it with any it overlaps)."""
        session = Session(key, start, last, payload)
        sessions = self.by_key.setdefault(key, [])
        sessions.append(session)
        self._open += 1
        if len(sessions) > 1 and sessions[-2].start > start:
            sessions.sort(key=lambda s: s.start)
        self._merge_around(key, session)
        self._push(session)
        self.dirty.add(key)
        return session

    def grow(self, key: Any, session: Session[P], low: int, high: int) -> Session[P]:
        """Widen an open session to events from ``low`` to ``high`` (merging any it then overlaps)."""
        changed_end = high > session.last
        if low < session.start:
            session.start = low
        if changed_end:
            session.last = high
        merged = self._merge_around(key, session)
        if changed_end or merged:
            self._push(session)
        self.dirty.add(key)
        return session

    def _merge_around(self, key: Any, session: Session[P]) -> bool:
        sessions = self.by_key[key]
        gap = self.gap
        merged = False
        for other in list(sessions):
            if other is session or not other.alive:
                continue
            if other.start < session.last + gap and session.start < other.last + gap:
                session.start = min(session.start, other.start)
                session.last = max(session.last, other.last)
                session.payload = self._join(session.payload, other.payload)
                other.alive = False
                sessions.remove(other)
                self._open -= 1
                merged = True
        return merged

    def _push(self, session: Session[P]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (session.last + self.gap, self._seq, session))

    @property
    def next_end(self) -> int | None:
        """The end of the session that closes first (or None)."""
        heap = self._heap
        while heap and (not heap[0][2].alive or heap[0][0] != heap[0][2].last + self.gap):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def close_until(self, watermark: int) -> list[Session[P]]:
        """Remove and return the sessions whose end is at or before ``watermark``, by end."""
        out: list[Session[P]] = []
        heap = self._heap
        gap = self.gap
        while heap and heap[0][0] <= watermark:
            end, _, session = heapq.heappop(heap)
            if not session.alive or end != session.last + gap:
                continue  # merged away, or grown since
            session.alive = False
            sessions = self.by_key[session.key]
            sessions.remove(session)
            self._open -= 1
            if not sessions:
                del self.by_key[session.key]
            self.dirty.add(session.key)
            out.append(session)
        return out
