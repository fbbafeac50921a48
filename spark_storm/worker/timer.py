"""The worker's timer: periodic duties on one thread (heartbeats, load metrics, acker timeouts).

Storm runs these on the worker's timers; here one thread runs every registered duty
when it is due and sleeps on the worker's stop event in between, so a stop interrupts
the wait at once.  A duty that raises kills the thread, and the worker's thread hook
turns a dead thread into an ordered stop with the error in the log — a worker never
keeps running without its heartbeat.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["WorkerTimer"]


class WorkerTimer:
    """Runs ``fn`` every ``every_s`` seconds for each registered duty, until ``stopping`` is set."""

    def __init__(self, stopping: threading.Event) -> None:
        self._stopping = stopping
        self._duties: list[tuple[str, float, Callable[[], None]]] = []
        self._next: list[float] = []

    def every(self, name: str, every_s: float, fn: Callable[[], None]) -> None:
        """Register a duty (before :meth:`run` starts); it runs first right away."""
        if not every_s > 0:
            msg = f"timer duty {name!r} needs a positive period, got {every_s}"
            raise ValueError(msg)
        self._duties.append((name, every_s, fn))
        self._next.append(time.monotonic())

    def run(self) -> None:
        """Run the duties until the worker stops (the timer thread)."""
        while not self._stopping.is_set():
            now = time.monotonic()
            for i, (_name, every_s, fn) in enumerate(self._duties):
                if now >= self._next[i]:
                    fn()
                    self._next[i] = time.monotonic() + every_s
            wake = min(self._next, default=now + 1.0)
            self._stopping.wait(max(0.0, wake - time.monotonic()))
