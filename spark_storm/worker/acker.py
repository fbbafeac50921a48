"""Storm's XOR acker: tuple trees rooted at the tracked source tuples of delivery groups.

Every tracked source tuple is a *root* with a random 64-bit id, kept by the worker that
received it.  Each tuple of the tree carries, per root, its own random *edge* id.  When
a bolt emits anchored on a tuple, the child's new edge is XORed into the anchor's
``pending`` value; when the anchor is acked, ``edge ^ pending`` is XORed into the root.
Every edge therefore enters the root's value twice (created, then acked) and the value
is zero exactly when the whole tree has been acked — in any arrival order, because the
creation of a child travels inside its parent's ack.  A fail anywhere fails the root.

Roots on other workers are updated with small messages to the reserved task id
:data:`ACKER_TASK` on that worker.
"""

from __future__ import annotations

import logging
import random
import threading
from typing import Final

from spark_storm.worker.tuples import GroupTracker

__all__ = ["ACKER_TASK", "Acker", "new_edge"]

logger = logging.getLogger(__name__)

#: Wire task id of a worker's acker (topologies use task ids below it).
ACKER_TASK: Final = 0x7FFF

_rng = random.SystemRandom()


def new_edge() -> int:
    """Return a random non-zero 63-bit id."""
    return _rng.getrandbits(63) or 1


class Acker:
    """The roots of one worker: value per root, and the group tracker to tell."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._vals: dict[int, int] = {}
        self._trackers: dict[int, GroupTracker] = {}
        self.completed = 0
        self.failed = 0

    def __len__(self) -> int:
        return len(self._vals)

    def root(self, tracker: GroupTracker) -> tuple[int, int]:
        """Create a root for one source tuple; return (root id, the source tuple's edge)."""
        edge = new_edge()
        with self._lock:
            root = new_edge()
            while root in self._vals:
                root = new_edge()
            self._vals[root] = edge
            self._trackers[root] = tracker
        return root, edge

    def update(self, root: int, value: int) -> None:
        """XOR ``value`` into ``root``; a zero value completes the tree."""
        with self._lock:
            if root not in self._vals:
                return  # already failed or completed (e.g. an ack after a fail)
            current = self._vals[root] ^ value
            if current:
                self._vals[root] = current
                return
            del self._vals[root]
            tracker = self._trackers.pop(root)
            self.completed += 1
        tracker.ack()

    def fail(self, root: int) -> None:
        """Fail ``root``: its group is reported FAILED (and replayed by the sender)."""
        with self._lock:
            self._vals.pop(root, None)
            tracker = self._trackers.pop(root, None)
            if tracker is not None:
                self.failed += 1
        if tracker is not None:
            tracker.fail()
