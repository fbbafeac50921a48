"""Storm's XOR acker: tuple trees rooted at the tracked source tuples of delivery groups.

Every tracked source tuple (or source batch) is a *root* with a random 64-bit id, kept by
the worker that received it.  Each tuple of the tree carries, per root, its own random
*edge* id.  When a bolt emits anchored on a tuple, the child's new edge is XORed into
the anchor's ``pending`` value; when the anchor is acked, ``edge ^ pending`` is XORed
into the root.  Every edge therefore enters the root's value twice (created, then acked)
and the value is zero exactly when the whole tree has been acked — in any arrival order,
because the creation of a child travels inside its parent's ack.  A fail anywhere fails
the root.

A tree can also stop moving: a worker it passed through died with tuples of it in
memory.  Two things fail such trees, so the sender replays their groups:

* Storm's message timeout — a root pending longer than ``topology.message.timeout.secs``
  fails (:meth:`Acker.expire`, run by the worker's timer);
* a lost peer — every ack of a tuple whose anchored children went to other workers says
  which (their :func:`worker_id`), so each root knows the workers its tree passed
  through.  When a connection to one of them drops, the trees that had passed through it
  fail at once (:meth:`Acker.peer_lost`).  Trees whose tuples reach that worker only
  after it dropped (held for it, delivered once it is back) are left alone.  A failed
  tree whose tuple was in fact still on its way (resent to the restarted worker) is
  delivered again (at-least-once through the bolts, as with Storm's timeout), in
  exchange for a replay in milliseconds rather than after the timeout; the rare tree
  whose ack naming the peer arrives after the drop is left to the timeout.

Roots on other workers are updated with small messages to the reserved task id
:data:`ACKER_TASK` on that worker.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import zlib
from collections.abc import Iterable
from typing import Final

from spark_storm.worker.tuples import GroupTracker

__all__ = ["ACKER_TASK", "Acker", "new_edge", "worker_id"]

logger = logging.getLogger(__name__)

#: Wire task id of a worker's acker (topologies use task ids below it).
ACKER_TASK: Final = 0x7FFF

_rng = random.SystemRandom()


def new_edge() -> int:
    """Return a random non-zero 63-bit id."""
    return _rng.getrandbits(63) or 1


def worker_id(slot: object) -> int:
    """Name a worker in tuple-tree anchors: a 31-bit CRC-32 of its ``host:port``.

    Stable across plan changes (a position in the slot list is not: a slot added or
    removed shifts the others), the same in every process, and small on the wire.
    """
    return zlib.crc32(str(slot).encode("utf-8")) & 0x7FFFFFFF


class Acker:
    """The roots of one worker: value per root, its group tracker, and when it was born."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._vals: dict[int, int] = {}
        self._trackers: dict[int, GroupTracker] = {}
        self._born: dict[int, float] = {}  # insertion order is birth order: the oldest first
        self._touched: dict[int, set[int]] = {}  # root -> ids of the workers its tree passed through
        self.completed = 0
        self.failed = 0
        self.timed_out = 0
        self.failed_on_peer_loss = 0

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
            self._born[root] = time.monotonic()
        return root, edge

    def update(self, root: int, value: int, touched: Iterable[int] = ()) -> None:
        """XOR ``value`` into ``root``; a zero value completes the tree.

        ``touched``: the workers (ids) the acked tuple's children went to.
        """
        with self._lock:
            if root not in self._vals:
                return  # already failed or completed (e.g. an ack after a fail)
            if touched:
                self._touched.setdefault(root, set()).update(touched)
            current = self._vals[root] ^ value
            if current:
                self._vals[root] = current
                return
            del self._vals[root]
            del self._born[root]
            self._touched.pop(root, None)
            tracker = self._trackers.pop(root)
            self.completed += 1
        tracker.ack()

    def fail(self, root: int) -> None:
        """Fail ``root``: its group is reported FAILED (and replayed by the sender)."""
        with self._lock:
            tracker = self._pop(root)
        if tracker is not None:
            tracker.fail()

    def _pop(self, root: int) -> GroupTracker | None:
        # Caller holds the lock.
        self._vals.pop(root, None)
        self._born.pop(root, None)
        self._touched.pop(root, None)
        tracker = self._trackers.pop(root, None)
        if tracker is not None:
            self.failed += 1
        return tracker

    def expire(self, timeout_s: float) -> int:
        """Fail the roots pending longer than ``timeout_s`` (Storm's message timeout); return how many."""
        limit = time.monotonic() - timeout_s
        failed = []
        with self._lock:
            while self._born:
                root = next(iter(self._born))
                if self._born[root] > limit:
                    break
                tracker = self._pop(root)
                if tracker is not None:
                    failed.append(tracker)
            self.timed_out += len(failed)
        for tracker in failed:
            tracker.fail()
        return len(failed)

    def peer_lost(self, worker: int) -> int:
        """Fail the trees that passed through worker ``worker`` (an id), whose connection dropped; return how many."""
        with self._lock:
            roots = [r for r, workers in self._touched.items() if worker in workers]
            trackers = [t for t in (self._pop(r) for r in roots) if t is not None]
            self.failed_on_peer_loss += len(trackers)
        for tracker in trackers:
            tracker.fail()
        return len(trackers)
