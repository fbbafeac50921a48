"""The XOR acker: completion in any order, the message timeout, trees failed with a lost peer."""

from __future__ import annotations

from spark_storm.messaging.wire import FAILED, PROCESSED
from spark_storm.worker.acker import Acker, GroupTracker, new_edge


def _tracked(acker: Acker) -> tuple[list[int], int, int]:
    statuses: list[int] = []
    tracker = GroupTracker(statuses.append)
    tracker.expect(1)
    tracker.sealed()
    root, edge = acker.root(tracker)
    return statuses, root, edge


def test_a_tree_completes_when_every_edge_was_created_and_acked_in_any_order() -> None:
    acker = Acker()
    statuses, root, edge = _tracked(acker)
    child = new_edge()
    acker.update(root, child)  # the child's own ack arrives first
    assert statuses == []
    acker.update(root, edge ^ child)  # the parent's ack, carrying the child's creation
    assert statuses == [PROCESSED]
    assert (len(acker), acker.completed) == (0, 1)


def test_roots_pending_past_the_message_timeout_fail_oldest_first() -> None:
    now = [100.0]
    acker = Acker(clock=lambda: now[0])
    old, old_root, _ = _tracked(acker)
    now[0] += 0.05
    young, _, _ = _tracked(acker)
    now[0] += 0.02  # the old root is 70 ms old, the young one 20 ms: only the old passed 30 ms
    assert acker.expire(0.03) == 1
    assert (old, young) == ([FAILED], [])
    assert acker.timed_out == 1
    acker.update(old_root, 123)  # a late ack of a failed root is ignored
    assert len(acker) == 1


def test_a_lost_peer_fails_only_the_trees_that_passed_through_it() -> None:
    acker = Acker()
    through_2, root_a, edge_a = _tracked(acker)
    through_1, root_b, edge_b = _tracked(acker)
    local_only, root_c, _ = _tracked(acker)
    child_a, child_b = new_edge(), new_edge()
    acker.update(root_a, edge_a ^ child_a, touched=[2002])  # its child went to the worker with id 2002
    acker.update(root_b, edge_b ^ child_b, touched=[1001])
    acker.update(root_c, 0)
    assert acker.peer_lost(2002) == 1
    assert (through_2, through_1, local_only) == ([FAILED], [], [])
    assert acker.failed_on_peer_loss == 1
    acker.update(root_b, child_b)  # the other trees still complete
    assert through_1 == [PROCESSED]


def test_one_child_gives_the_anchors_and_pending_edges_child_anchors_gives() -> None:
    """The single-parent, single-copy emit path draws the same ids into the same places."""
    import random

    from spark_storm.codec.tuples import Tuple, TupleSource
    from spark_storm.worker import acker

    source = TupleSource("c", 1, "default", ["v"])
    for worker in (-1, 7):
        fast, slow = Tuple([1], source), Tuple([1], source)
        fast.anchors = slow.anchors = [(3, 99, 5)]
        for tup in (fast, slow):  # an earlier child already touched worker 4
            tup.pending = {(3, 99): 11, acker.TOUCHED: frozenset({4})}
        saved = acker._rng
        try:
            acker._rng = random.Random(1)
            got = acker.one_child(fast, worker)
            acker._rng = random.Random(1)
            want = acker.child_anchors([slow, Tuple([2], source)], [worker])  # the general path
        finally:
            acker._rng = saved
        assert want is not None
        assert got == want[0]
        assert fast.pending == slow.pending


def test_edge_ids_differ_in_a_forked_child() -> None:
    import os

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, new_edge().to_bytes(8, "big"))
        os._exit(0)
    os.close(write)
    child = int.from_bytes(os.read(read, 8), "big")
    os.waitpid(pid, 0)
    os.close(read)
    assert child != new_edge()
