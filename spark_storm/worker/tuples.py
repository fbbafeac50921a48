"""Tuples as bolts see them, and tuples addressed to a task (AddressedTuple)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from spark_storm.messaging.wire import FAILED as FAILED_STATUS
from spark_storm.messaging.wire import PROCESSED as PROCESSED_STATUS

__all__ = ["BROADCAST_TASK", "SYSTEM_COMPONENT", "TICK_STREAM", "AddressedTuple", "GroupTracker", "Tuple"]

#: Wire task id meaning "no task": delivered to every task of every executor in the
#: receiving worker (Storm 0.8's nil task id).  Real task ids start at 1.
BROADCAST_TASK = 0
SYSTEM_COMPONENT = "__system"
TICK_STREAM = "__tick"


class Tuple:
    """An input tuple: values with their field names, where it came from, and its stream.

    Attributes
    ----------
    values : list
    fields : tuple[str, ...]
    source_component : str
    source_task : int
        -1 for tuples sent by an external client to a source component.
    stream : str
    """

    __slots__ = ("anchors", "fields", "pending", "source_component", "source_task", "stream", "values")

    def __init__(
        self,
        values: list[Any],
        fields: Sequence[str],
        source_component: str,
        source_task: int,
        stream: str,
    ) -> None:
        self.values = values
        self.fields = tuple(fields)
        self.source_component = source_component
        self.source_task = source_task
        self.stream = stream
        #: Tuple trees this tuple belongs to: (acker slot index, root id, this tuple's edge id).
        self.anchors: list[tuple[int, int, int]] = []
        #: Per (slot index, root): XOR of the edges of children emitted anchored on this tuple.
        self.pending: dict[tuple[int, int], int] | None = None

    def get(self, field: str) -> Any:
        """Value of ``field`` (KeyError naming the fields when absent)."""
        try:
            return self.values[self.fields.index(field)]
        except ValueError:
            msg = f"tuple from {self.source_component!r} has no field {field!r}; fields are {list(self.fields)}"
            raise KeyError(msg) from None

    def __getitem__(self, index: int) -> Any:
        return self.values[index]

    def __len__(self) -> int:
        return len(self.values)

    @property
    def is_tick(self) -> bool:
        return self.stream == TICK_STREAM and self.source_component == SYSTEM_COMPONENT

    def __repr__(self) -> str:
        return (
            f"Tuple({self.source_component}:{self.source_task}/{self.stream} "
            f"{dict(zip(self.fields, self.values, strict=False)) if self.fields else self.values!r})"
        )


class GroupTracker:
    """Counts the acks of one delivery group's tuples; reports PROCESSED when all are in.

    The worker calls :meth:`expect` while decoding, :meth:`sealed` once every tuple is
    queued; collectors call :meth:`ack` / :meth:`fail` for source tuples.  The first fail
    reports FAILED (the sender retries the group; delivery is at-least-once).
    """

    __slots__ = ("_done", "_failed", "_lock", "_pending", "_sealed")

    def __init__(self, done: Callable[[int], None]) -> None:
        self._done = done
        self._pending = 0
        self._sealed = False
        self._failed = False
        self._lock = threading.Lock()

    def expect(self, n: int) -> None:
        with self._lock:
            self._pending += n

    def sealed(self) -> None:
        with self._lock:
            self._sealed = True
            finished = self._pending == 0 and not self._failed
        if finished:
            self._done(PROCESSED_STATUS)

    def ack(self) -> None:
        with self._lock:
            self._pending -= 1
            finished = self._sealed and self._pending == 0 and not self._failed
        if finished:
            self._done(PROCESSED_STATUS)

    def fail(self) -> None:
        with self._lock:
            first = not self._failed
            self._failed = True
        if first:
            self._done(FAILED_STATUS)


class AddressedTuple(NamedTuple):
    """A tuple on its way to ``task`` (``BROADCAST_TASK``: every task of the executor)."""

    task: int
    tuple: Tuple
