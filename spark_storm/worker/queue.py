"""Bounded ring-buffer queues with batch publish and batch consume (Storm's JCQueue).

* ``publish(items)`` copies a whole batch in under one lock; when the ring is full it
  waits (counted as ``overflow``): there is no unbounded overflow list anywhere.
* ``consume_batch(handler)`` takes everything available at once and calls
  ``handler(item, end_of_batch)`` per item, the flag true on the last one (Disruptor).
* the consumer waits progressively: spin, then yield, then park on a condition.
* crossing the high watermark calls ``on_high``, draining under the low one ``on_low``:
  the worker turns those into backpressure status for upstream senders.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["RingQueue", "WaitStrategy"]

T = TypeVar("T")


class WaitStrategy:
    """Spin ``spins`` times, then ``time.sleep(0)`` ``yields`` times, then park (progressive)."""

    def __init__(self, spins: int = 100, yields: int = 10, park_s: float = 0.05) -> None:
        self.spins = spins
        self.yields = yields
        self.park_s = park_s


class RingQueue(Generic[T]):
    """A bounded multi-producer, single-consumer ring buffer.

    Parameters
    ----------
    capacity : int
        Slots in the ring.
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
        wait: WaitStrategy | None = None,
    ) -> None:
        if capacity < 1:
            msg = f"queue {name}: capacity must be >= 1, got {capacity}"
            raise ValueError(msg)
        self.name = name
        self.capacity = capacity
        self._ring: list[Any] = [None] * capacity
        self._head = 0  # next slot to read
        self._size = 0
        self._lock = threading.Lock()
        self._not_full = threading.Condition(self._lock)
        self._not_empty = threading.Condition(self._lock)
        self._high = max(1, int(capacity * high))
        self._low = int(capacity * low)
        self._on_high = on_high
        self._on_low = on_low
        self._over_high = False
        self._wait = wait or WaitStrategy()
        self._closed = False
        self.published = 0
        self.consumed = 0
        self.overflow = 0
        self._rate_mark = (time.monotonic(), 0)
        self.arrival_rate = 0.0

    def __len__(self) -> int:
        return self._size

    @property
    def population(self) -> int:
        return self._size

    def publish(self, items: Sequence[T], timeout: float | None = None) -> int:
        """Append ``items`` in order, waiting for room as needed.

        Returns how many were published: all of them, unless the queue was closed or
        ``timeout`` (seconds) ran out while it was full.
        """
        n = len(items)
        done = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        crossed = False
        with self._lock:
            while done < n:
                room = self.capacity - self._size
                if room == 0:
                    if self._closed:
                        break
                    self.overflow += 1
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    self._not_full.wait(remaining if remaining is not None else 0.5)
                    continue
                take = min(room, n - done)
                tail = (self._head + self._size) % self.capacity
                first = min(take, self.capacity - tail)
                self._ring[tail : tail + first] = items[done : done + first]
                if take > first:
                    self._ring[0 : take - first] = items[done + first : done + take]
                self._size += take
                done += take
                self.published += take
                self._not_empty.notify()
                if not self._over_high and self._size >= self._high:
                    self._over_high = True
                    crossed = True
        if crossed and self._on_high is not None:
            self._on_high()
        return done

    def _take_all(self, limit: int) -> list[Any]:
        # Caller holds the lock.
        n = min(self._size, limit)
        head = self._head
        end = head + n
        if end <= self.capacity:
            out = self._ring[head:end]
            self._ring[head:end] = [None] * n
        else:
            wrap = end - self.capacity
            out = self._ring[head:] + self._ring[:wrap]
            self._ring[head:] = [None] * (self.capacity - head)
            self._ring[:wrap] = [None] * wrap
        self._head = end % self.capacity
        self._size -= n
        self.consumed += n
        self._not_full.notify_all()
        return out

    def consume_batch(self, handler: Callable[[T, bool], None], limit: int = 1 << 30) -> int:
        """Hand every available item (up to ``limit``) to ``handler(item, end_of_batch)``.

        Returns the number consumed (0 when empty; does not wait).
        """
        with self._lock:
            if not self._size:
                return 0
            batch = self._take_all(limit)
            cleared = self._over_high and self._size <= self._low
            if cleared:
                self._over_high = False
        if cleared and self._on_low is not None:
            self._on_low()
        last = len(batch) - 1
        for i, item in enumerate(batch):
            handler(item, i == last)
        return len(batch)

    def wait_for_items(self, timeout: float) -> bool:
        """Wait (spin, yield, then park) until something is queued, the queue closes, or ``timeout``."""
        if self._size:
            return True
        for _ in range(self._wait.spins):
            if self._size or self._closed:
                return bool(self._size)
        for _ in range(self._wait.yields):
            time.sleep(0)
            if self._size or self._closed:
                return bool(self._size)
        with self._lock:
            if not self._size and not self._closed:
                self._not_empty.wait(min(timeout, self._wait.park_s) if timeout > 0 else 0)
            return bool(self._size)

    def close(self) -> None:
        """Refuse waits for room (publishers return) and wake the consumer."""
        with self._lock:
            self._closed = True
            self._not_full.notify_all()
            self._not_empty.notify_all()

    def metrics(self) -> dict[str, Any]:
        """capacity, population, overflow, published, consumed, arrival_rate (items/s)."""
        now = time.monotonic()
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
            "arrival_rate": round(self.arrival_rate, 1),
            "backpressure": self._over_high,
        }
