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
``id``.  A :class:`WindowedBatchBolt` gets each window as one Arrow table
(:class:`BatchWindow`), every key of its task in it: windowed aggregates run in pyarrow.

**Incremental aggregation.**  A bolt that overrides ``zero``, ``add`` and ``merge`` keeps one
accumulator per pane (and key) instead of the tuples, so a ten-minute window over a fast
stream costs its panes, not its tuples (Storm keeps every tuple: STORM-2614);
``window.value`` is then the merged accumulator and ``window.tuples`` is not kept.  A batch
bolt that overrides ``combine(table)`` shrinks each pane once it is sealed (the watermark
passed its end), e.g. into a partial ``group_by`` count; ``execute_window`` must accept
combined rows.

**Exact through failures.**  A windowed bolt is stateful: its open windows, watermarks and
what has fired are checkpointed with the topology's epochs (docs/design/state.md), so a SIGKILLed
or moved task resumes its windows, and a replay fires each window again with the same
rows, values and id.  A tuple (batch) is acked when it joins its window: once window state
is durable that is safe, and a micro-batch never waits for a later one to close its windows
(``delivery=processed`` and windows do not deadlock).  What a window emits is anchored to
the tuple (batch) whose arrival closed it, so a failure downstream rolls the topology back.

The executor, not the bolt, holds the windows (:mod:`spark_storm.worker.windows.engine`,
as Storm's ``WindowedBoltExecutor``): it gives the task's input to the engine, which calls
``execute_window``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, Final

import pyarrow as pa

from spark_storm.codec.tuples import Tuple
from spark_storm.errors import WindowError
from spark_storm.state.kv import KeyValueState
from spark_storm.worker.bolt import BatchBolt, Bolt
from spark_storm.worker.stateful import StatefulComponent

__all__ = ["BatchWindow", "TupleWindow", "WindowedBatchBolt", "WindowedBolt", "table_of"]

#: "No value": an aggregating window's accumulator before its first row.
MISSING: Final = object()


class _Window:
    """What every window has: its span, its key and its id."""

    __slots__ = ("end", "id", "key", "start")

    def __init__(self, start: int, end: int, key: Any, wid: str) -> None:
        self.start = start
        self.end = end
        self.key = key
        self.id = wid


class TupleWindow(_Window):
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

    __slots__ = ("_expired", "_new", "_parts", "_value")

    def __init__(
        self,
        start: int,
        end: int,
        key: Any,
        wid: str,
        parts: list[list[Tuple]] | None,
        new: list[list[Tuple]] | None = None,
        expired: list[list[Tuple]] | None = None,
        value: Any = MISSING,
    ) -> None:
        super().__init__(start, end, key, wid)
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
        if self._value is MISSING:
            msg = f"window {self.id}: window.value needs the bolt to define zero(), add() and merge()"
            raise WindowError(msg)
        return self._value

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts) if self._parts is not None else 0

    def __repr__(self) -> str:
        return f"TupleWindow({self.id}, [{self.start}, {self.end}))"


def table_of(batches: Sequence[pa.RecordBatch]) -> pa.Table:
    """Record batches as one table (schemas that differ are unified)."""
    if not batches:
        return pa.table({})
    schema = batches[0].schema
    if all(b.schema.equals(schema) for b in batches):
        return pa.Table.from_batches(batches, schema=schema)
    return pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive")


class BatchWindow(_Window):
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

    __slots__ = ("_expired", "_new", "table")

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
        super().__init__(start, end, key, wid)
        self.table = table
        self._new = new
        self._expired = expired

    @property
    def new(self) -> pa.Table:
        """Rows in this window that were not in the window one slide earlier."""
        return table_of(self._new) if self._new is not None else self.table

    @property
    def expired(self) -> pa.Table:
        """Rows of the window one slide earlier that this window no longer holds."""
        return table_of(self._expired or []) if self._expired else self.table.slice(0, 0)

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)

    def __repr__(self) -> str:
        return f"BatchWindow({self.id}, [{self.start}, {self.end}), {self.table.num_rows} rows)"


class _Windowed(StatefulComponent):
    """What both windowed bolts share: the task's state (the windows themselves are the executor's)."""

    state: KeyValueState

    def init_state(self, state: KeyValueState) -> None:
        self.state = state

    def execute(self, item: Any) -> None:
        """Not called: the executor gives the task's input to its window engine, which calls ``execute_window``."""
        msg = f"{type(self).__name__}: a windowed bolt's input goes to its window engine, which calls execute_window"
        raise WindowError(msg)

    execute_batch = execute


class WindowedBolt(_Windowed, Bolt):
    """Storm's ``BaseWindowedBolt``: ``execute_window`` per window of the component's ``window:`` spec.

    Do not override ``execute``: the executor gives the tuples to the task's window engine,
    which acks them as they join their windows.  Override ``zero``, ``add`` and ``merge``
    together to aggregate incrementally.  ``init_state`` gives the task's
    :class:`KeyValueState` (keys starting with ``"__window"`` are the engine's); call
    ``super().init_state(state)`` when overriding it.
    """

    @abc.abstractmethod
    def execute_window(self, window: TupleWindow) -> None:
        """Process one window (emit through ``self.collector``)."""

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


class WindowedBatchBolt(_Windowed, BatchBolt):
    """A columnar windowed bolt: ``execute_window`` gets each window as one :class:`BatchWindow`.

    Rows are placed in panes with numpy (event time from a ``timestamp`` or integer column),
    late rows are filtered out in one mask, and a window is its panes' record batches as one
    table.  A window covers every key of the task (its key group): group inside
    ``execute_window``.  Session windows (``session_gap`` with ``key``) give one table per
    session and key.  Do not override ``execute_batch``.  Override ``combine`` to shrink
    sealed panes.
    """

    @abc.abstractmethod
    def execute_window(self, window: BatchWindow) -> None:
        """Process one window (emit through ``self.collector.emit_batch``)."""

    def combine(self, table: pa.Table) -> pa.Table | None:
        """Shrink a sealed pane's rows (return None to keep them as they are)."""
        return None
