"""Bounded queues of batches, counted in tuples (Storm's JCQueue, batch in, batch out).

Storm 2.x publishes to an executor's ``JCQueue`` in batches and the consumer drains
whatever is there in one ``consume`` call.  Here every queue item is already a batch —
the tuples one publisher has for one task, or one columnar batch — and carries its
weight in tuples (rows), so locking, waking and watermark checks happen once per batch:

* ``publish(items, weight)`` appends all of ``items`` at once, waiting while the queue
  holds tuples and ``weight`` more would pass ``capacity`` (counted as ``overflow``;
  there is no unbounded overflow list).  A batch larger than the whole capacity enters an
  empty queue, and the consumer thread itself never waits (a bolt emitting to a task of
  its own executor must not deadlock on its own queue);
* ``take(limit, timeout)`` waits for something, then returns items up to ``limit``
  tuples (at least one item);
* crossing the high watermark calls ``on_high``, draining under the low one ``on_low``:
  the worker turns those into backpressure status for upstream senders.

Waiting is a plain condition variable: under the GIL a consumer spinning for work only
takes the interpreter from the producer that would give it some.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from spark_storm.reports import QueueMetrics

__all__ = ["BatchQueue", "QueueItem"]

T = TypeVar("T")

#: An executor queue item: (task, list of tuples) or (task, columnar batch); the task may be
#: BROADCAST_TASK (every task of the executor).
QueueItem = tuple[int, Any]


class BatchQueue(Generic[T]):
    """A bounded multi-producer, single-consumer FIFO of weighted items.

    Parameters
    ----------
    capacity : int
        Tuples the queue holds before publishers wait.
    name : str
        For metrics and logs.
    high, low : float
        Watermarks as fractions of capacity.
    on_high, on_low : callable, optional
        Called (outside the lock) when the population crosses above ``high`` / falls under ``low``.
    """

    def __init__(
        self,
        capacity: int,
        name: str,
        high: float = 0.9,
        low: float = 0.4,
        on_high: Callable[[], None] | None = None,
        on_low: Callable[[], None] | None = None,
    ) -> None:
        if capacity < 1:
            msg = f"queue {name}: capacity must be >= 1, got {capacity}"
            raise ValueError(msg)
        self.name = name
        self.capacity = capacity
        self._items: deque[tuple[T, int]] = deque()
        self._size = 0
        self._lock = threading.Lock()
        self._not_full = threading.Condition(self._lock)
        self._not_empty = threading.Condition(self._lock)
        self._high = max(1, int(capacity * high))
        self._low = int(capacity * low)
        self._on_high = on_high
        self._on_low = on_low
        self._over_high = False
        self._closed = False
        self._waiting = False  # the consumer is parked in take(): publishers must notify
        self.consumer: int | None = None
        self.published = 0
        self.consumed = 0
        self.overflow = 0
        self.overflow_waiters = 0
        self.publishes = 0
        self.wakeups = 0
        self._rate_mark = (time.monotonic(), 0)
        self.arrival_rate = 0.0

    def __len__(self) -> int:
        return self._size

    @property
    def population(self) -> int:
        return self._size

    @property
    def load(self) -> float:
        """How full the queue is, 0.0 .. 1.0 (Storm's queue load, sent to peers as load metrics).

        The population may pass ``capacity`` (a batch larger than the free room enters an
        empty queue, and the consumer's own publishes never wait): such a queue is full, 1.0.
        """
        return min(1.0, self._size / self.capacity)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def over_high(self) -> bool:
        """Whether the queue crossed its high watermark and has not drained under the low one since."""
        return self._over_high

    def publish(
        self, items: Sequence[T], weights: Sequence[int], timeout: float | None = None, *, wait: bool = True
    ) -> bool:
        """Append ``items`` (with their weights in tuples) in order, waiting for room.

        Returns False, publishing nothing, when the queue was closed or ``timeout``
        (seconds) ran out while it was full.  ``wait=False`` never waits (a checkpoint
        barrier, which weighs nothing, goes behind what is queued whatever the fill).
        """
        total = sum(weights)
        crossed = False
        with self._lock:
            if wait and self._size and self._size + total > self.capacity and threading.get_ident() != self.consumer:
                deadline = None if timeout is None else time.monotonic() + timeout
                self.overflow += 1
                self.overflow_waiters += 1
                try:
                    while self._size and self._size + total > self.capacity:
                        if self._closed:
                            return False
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            return False
                        self._not_full.wait(0.5 if remaining is None else min(remaining, 0.5))
                finally:
                    self.overflow_waiters -= 1
            if self._closed:
                return False
            self._items.extend(zip(items, weights, strict=True))
            self._size += total
            self.published += total
            self.publishes += 1
            if self._waiting:
                self.wakeups += 1
                self._not_empty.notify()
            if not self._over_high and self._size >= self._high:
                self._over_high = crossed = True
        if crossed and self._on_high is not None:
            self._on_high()
        return True

    def wait_for_room(self, total: int, timeout: float) -> None:
        """Wait up to ``timeout`` until ``total`` tuples would fit (or the queue is empty or closed); no publish."""
        with self._lock:
            if self._size and self._size + total > self.capacity and not self._closed:
                self.overflow_waiters += 1
                try:
                    self._not_full.wait(timeout)
                finally:
                    self.overflow_waiters -= 1

    def take(self, limit: int, timeout: float, gate: Callable[[], bool] | None = None) -> list[T]:
        """Wait up to ``timeout`` for items; return them up to ``limit`` tuples (at least one item).

        With a ``gate``, nothing is taken while ``gate()`` is false (checked under the
        lock, after any wait): a paused consumer leaves everything queued.
        """
        with self._lock:
            if not self._items or (gate is not None and not gate()):
                if self._closed or timeout <= 0:
                    return []
                self._waiting = True
                try:
                    self._not_empty.wait(timeout)
                finally:
                    self._waiting = False
                if not self._items or (gate is not None and not gate()):
                    return []
            items = self._items
            out: list[T] = []
            taken = 0
            while items and (taken < limit or not out):
                item, weight = items.popleft()
                out.append(item)
                taken += weight
            self._size -= taken
            self.consumed += taken
            if self.overflow_waiters:
                self._not_full.notify_all()
            cleared = self._over_high and self._size <= self._low
            if cleared:
                self._over_high = False
        if cleared and self._on_low is not None:
            self._on_low()
        return out

    def clear(self) -> int:
        """Drop everything queued (a rollback); return the weight dropped (not counted as consumed)."""
        with self._lock:
            dropped = self._size
            self._items.clear()
            self._size = 0
            self._not_full.notify_all()
            cleared = self._over_high
            self._over_high = False
        if cleared and self._on_low is not None:
            self._on_low()
        return dropped

    def wake(self) -> None:
        """Wake a waiting consumer (an activate or a stop); returns once no take is under way."""
        with self._lock:
            self._not_empty.notify_all()

    def close(self) -> None:
        """Refuse further publishes (waiting publishers return False) and wake the consumer."""
        with self._lock:
            self._closed = True
            self._not_full.notify_all()
            self._not_empty.notify_all()

    def metrics(self) -> QueueMetrics:
        """capacity, population, overflow, published, consumed, arrival_rate (tuples/s), backpressure."""
        now = time.monotonic()
        with self._lock:  # HTTP threads may read at once
            then, count = self._rate_mark
            if now - then >= 1.0:
                self.arrival_rate = (self.published - count) / (now - then)
                self._rate_mark = (now, self.published)
        return {
            "capacity": self.capacity,
            "population": self._size,
            "overflow": self.overflow,
            "published": self.published,
            "consumed": self.consumed,
            "publishes": self.publishes,
            "wakeups": self.wakeups,
            "arrival_rate": round(self.arrival_rate, 1),
            "backpressure": self._over_high,
        }
