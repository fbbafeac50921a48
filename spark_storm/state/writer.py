"""One thread per worker that makes changelog entries durable, in the order they were encoded.

Flink's asynchronous snapshot, in this project's terms: at a barrier the executor encodes
its task's entry (on its own thread, so a put after the barrier cannot reach the entry),
sends the barrier on and goes on with the next epoch's tuples.  The write and its
``fsync`` run here, and the task reports itself prepared once the entry is durable, so
the worker still answers ``PREPARE`` only after every entry of the epoch is on disk.

Jobs run one at a time, first in first out: a task's entries land in epoch order.
:meth:`StateWriter.drain` waits for every job submitted so far; a rollback drains first,
so no late write lands on a changelog it has just cut back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from spark_storm.errors import CheckpointError

__all__ = ["StateWriter"]

logger = logging.getLogger(__name__)


class StateWriter:
    """Run write jobs on one daemon thread, in submission order (see the module doc)."""

    def __init__(self, name: str = "spark-storm-state-writer") -> None:
        self._name = name
        self._jobs: deque[Callable[[], None]] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job`` (it reports its own outcome; an exception it lets out is logged).

        Raises
        ------
        CheckpointError
            The writer is closed: the worker is stopping.
        """
        with self._cond:
            if self._closed:
                msg = "the state writer is closed: the worker is stopping, so this epoch is not written"
                raise CheckpointError(msg)
            self._jobs.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        with self._cond:
            return len(self._jobs) + self._busy

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return  # closed, and everything submitted ran
                job = self._jobs.popleft()
                self._busy = True
            try:
                job()
            except Exception:  # a job reports its own failures: this one let one out
                logger.exception("%s: a write job failed", self._name)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def drain(self, timeout: float) -> bool:
        """Wait until every job submitted so far has run; False if ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._jobs or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self, timeout: float) -> bool:
        """Let the queued jobs run (up to ``timeout`` seconds), then refuse new ones; True if all ran."""
        drained = self.drain(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        return drained
