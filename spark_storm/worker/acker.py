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
import os
import random
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from spark_storm.codec.tuples import NO_ANCHORS, Anchor
from spark_storm.messaging.wire import FAILED as FAILED_STATUS
from spark_storm.messaging.wire import PROCESSED as PROCESSED_STATUS

__all__ = [
    "ACKER_TASK",
    "ACK_OP",
    "FAIL_OP",
    "TOUCHED",
    "Acker",
    "GroupTracker",
    "OpSink",
    "ack_ops",
    "anchors_of",
    "batch_edge",
    "child_anchors",
    "fail_ops",
    "new_edge",
    "one_child",
    "row_edges",
    "split_edges",
    "worker_id",
]

logger = logging.getLogger(__name__)

#: Wire task id of a worker's acker (topologies use task ids below it).
ACKER_TASK: Final = 0x7FFF
#: Acker update opcodes: ``[ACK_OP, root, value, (workers touched)]`` and ``[FAIL_OP, root, 0]``.
ACK_OP: Final = 1
FAIL_OP: Final = 2
#: Key of a parent's ``pending`` dict holding the ids of the workers its anchored children
#: went to (a frozenset); they travel with the parent's ack to the roots' ackers, so a
#: worker that loses a peer fails exactly the trees that passed through it.
TOUCHED: Final = (-1, -1)

#: ``sink(worker_id, op)``: where an acker update goes (the executor batches them per worker).
OpSink = Callable[[int, list[Any]], None]

#: Edge and root ids: Mersenne Twister seeded from the OS (as Storm's acker uses a
#: java.util.Random), 15 times cheaper per id than SystemRandom's read of os.urandom, and
#: every tracked emit draws one.  ``getrandbits`` is one C call under the GIL, so threads
#: share it safely; a forked child reseeds, so parent and child never draw the same ids.
_rng = random.Random()
os.register_at_fork(after_in_child=_rng.seed)


def new_edge() -> int:
    """Return a random non-zero 63-bit id."""
    return _rng.getrandbits(63) or 1


def worker_id(slot: object) -> int:
    """Name a worker in tuple-tree anchors: a 31-bit CRC-32 of its ``host:port``.

    Stable across plan changes (a position in the slot list is not: a slot added or
    removed shifts the others), the same in every process, and small on the wire.
    """
    return zlib.crc32(str(slot).encode("utf-8")) & 0x7FFFFFFF


class GroupTracker:
    """Counts the acks of one delivery group's tuple trees; reports PROCESSED when all are in.

    The worker calls :meth:`expect` while decoding, :meth:`sealed` once every tuple is
    queued; the acker calls :meth:`ack` / :meth:`fail` as trees complete.  The first fail
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

    def release(self) -> None:
        """Report PROCESSED now, whatever is pending (a rollback dropped the trees; the input log replays them)."""
        with self._lock:
            finished = self._failed or (self._sealed and self._pending == 0)
            self._failed = True  # nothing reports again
            self._pending = 0
        if not finished:
            self._done(PROCESSED_STATUS)


class Acker:
    """The roots of one worker: value per root, its group tracker, and when it was born.

    Parameters
    ----------
    clock : callable, optional
        Seconds on a monotonic clock (tests pass their own; default ``time.monotonic``).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
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
            self._born[root] = self._clock()
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
        limit = self._clock() - timeout_s
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

    def release_all(self) -> int:
        """Drop every pending tree, reporting its group PROCESSED (a rollback); return how many groups."""
        with self._lock:
            trackers = {id(t): t for t in self._trackers.values()}
            self._vals.clear()
            self._trackers.clear()
            self._born.clear()
            self._touched.clear()
        for tracker in trackers.values():
            tracker.release()
        return len(trackers)

    def peer_lost(self, worker: int) -> int:
        """Fail the trees that passed through worker ``worker`` (an id), whose connection dropped; return how many."""
        with self._lock:
            roots = [r for r, workers in self._touched.items() if worker in workers]
            trackers = [t for t in (self._pop(r) for r in roots) if t is not None]
            self.failed_on_peer_loss += len(trackers)
        for tracker in trackers:
            tracker.fail()
        return len(trackers)


# --- the XOR algebra of tuple trees (every place an edge is made, split, merged or acked) ---


def child_anchors(parents: Sequence[Any], workers: Sequence[int]) -> list[list[Anchor]] | None:
    """Give each emitted copy a fresh edge in every tree its parents belong to (Storm's acker).

    ``parents``: tuples or batches the copies derive from (their ``pending`` records each
    child's edge, acked with the parent); ``workers``: per copy, the id of the worker it
    goes to (-1: this one).  Returns one anchor list per copy, or None when no parent is tracked.
    """
    if not any(p.anchors for p in parents):
        return None
    touched = frozenset(w for w in workers if w >= 0)
    trees = []
    for _ in workers:
        edge = new_edge()
        child: dict[tuple[int, int], int] = {}
        for parent in parents:
            if not parent.anchors:
                continue
            if parent.pending is None:
                parent.pending = {}
            pending = parent.pending
            if touched:
                pending[TOUCHED] = pending.get(TOUCHED, frozenset()) | touched
            for worker, root, _e in parent.anchors:
                key = (worker, root)
                pending[key] = pending.get(key, 0) ^ edge
                child[key] = child.get(key, 0) ^ edge
        trees.append([(s, r, e) for (s, r), e in child.items()])
    return trees


def one_child(parent: Any, worker: int) -> list[Anchor]:
    """:func:`child_anchors` of one copy of a parent in exactly one tree: the common emit, in fewer steps."""
    ((owner, root, _edge),) = parent.anchors
    edge = new_edge()
    pending = parent.pending
    if pending is None:
        pending = parent.pending = {}
    if worker >= 0:
        pending[TOUCHED] = pending.get(TOUCHED, frozenset()) | {worker}
    key = (owner, root)
    pending[key] = pending.get(key, 0) ^ edge
    return [(owner, root, edge)]


def ack_ops(item: Any, sink: OpSink) -> None:
    """Ack a tuple or batch in every tree it belongs to: ``edge ^ pending`` per root; once only."""
    anchors, item.anchors = item.anchors, NO_ANCHORS  # acking twice must not count twice
    pending = item.pending or {}
    touched = sorted(pending.get(TOUCHED, ()))
    for worker, root, edge in anchors:
        op: list[Any] = [ACK_OP, root, edge ^ pending.get((worker, root), 0)]
        if touched:
            op.append(touched)
        sink(worker, op)


def anchors_of(payload: Any) -> list[Anchor]:
    """Return the anchors of an executor-queue payload: its tuples', or its columnar batch's (barriers: none)."""
    if isinstance(payload, list):
        return [a for tup in payload for a in tup.anchors]
    return list(getattr(payload, "anchors", None) or ())


def fail_ops(item: Any, sink: OpSink) -> None:
    """Fail every tree a tuple or batch belongs to; once only."""
    anchors, item.anchors = item.anchors, NO_ANCHORS
    for worker, root, _edge in anchors:
        sink(worker, [FAIL_OP, root, 0])


def split_edges(anchors: Sequence[Anchor], pieces: int, sink: OpSink) -> list[list[Anchor]]:
    """Replace a batch's edge (per root) by one new edge per piece, in one acker update per root."""
    out: list[list[Anchor]] = [[] for _ in range(pieces)]
    for worker, root, edge in anchors:
        update = edge
        for i in range(pieces):
            new = new_edge()
            update ^= new
            out[i].append((worker, root, new))
        sink(worker, [ACK_OP, root, update])
    return out


def row_edges(anchors: Sequence[Anchor], rows: int, sink: OpSink) -> list[list[Anchor]]:
    """Turn a batch's edge into one edge per row as it becomes ``rows`` tuples (``E ^ e1 ^ ... ^ en``)."""
    return split_edges(anchors, rows, sink) if anchors and rows else [[] for _ in range(rows)]


def batch_edge(items: Iterable[Any], sink: OpSink) -> list[Anchor]:
    """Tuples becoming one batch: their edges are acked and one new edge per root replaces them."""
    roots: dict[tuple[int, int], int] = {}
    for item in items:
        for worker, root, edge in item.anchors:
            key = (worker, root)
            roots[key] = roots.get(key, 0) ^ edge
    anchors: list[Anchor] = []
    for (worker, root), acked in roots.items():
        edge = new_edge()
        anchors.append((worker, root, edge))
        sink(worker, [ACK_OP, root, acked ^ edge])
    return anchors
