"""The worker's receive path, transfer path and executors, without processes or sockets.

A WorkerState is built for a plan over two slots with the in-process ``local`` transport;
executors are built but not started (the tests drive them on their own thread), so
every queue and message can be inspected.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pytest

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.payloads import arrow_payload, columnar_metadata, pack_tuples, unpack_bolt
from spark_storm.codec.tuples import Tuple
from spark_storm.config import Config
from spark_storm.errors import GroupRejectedError
from spark_storm.messaging import BackpressureStatus, MessageBatch, TaskMessage
from spark_storm.messaging.wire import (
    ACCEPTED,
    FAILED,
    PROCESSED,
    BatchHeader,
    FrameDecoder,
    LoadMetrics,
    encode_control,
)
from spark_storm.topology import Slot, plan, topology_from_dict
from spark_storm.worker.acker import GroupTracker, new_edge
from spark_storm.worker.checkpoint import CheckpointManager
from spark_storm.worker.executor import BatchExecutor, TupleExecutor
from spark_storm.worker.settings import WorkerSettings
from spark_storm.worker.state import WorkerState
from tests.support import wait_until

A, B = Slot("h", 1), Slot("h", 2)
TOPOLOGY = {
    "name": "paths",
    "components": [
        # sorted: bin(1) in(2) mid(3,4) out(5,6); executors round-robin over [A, B]:
        # bin->A, in->B, mid[3]->A, mid[4]->B, out[5]->A, out[6]->B
        {"id": "bin", "source": True, "bolt": "spark_storm.worker.bolt:PassThroughBatchBolt", "fields": ["key", "n"]},
        {"id": "in", "source": True, "fields": ["key", "n"]},
        {
            "id": "mid",
            "bolt": "spark_storm.worker.bolt:PassThroughBolt",
            "fields": ["key", "n"],
            "parallelism": 2,
            "inputs": [{"from": "in"}, {"from": "bin"}],
        },
        {
            "id": "out",
            "bolt": "tests.integration.bolts:BatchRecordingBolt",
            "parallelism": 2,
            "inputs": [{"from": "mid", "grouping": "fields", "fields": ["key"]}],
        },
    ],
}


class World:
    """Worker state for slot A (or B) plus the transfer path and a receiver."""

    def __init__(self, slot: Slot = A, **conf: Any) -> None:
        topo = topology_from_dict(TOPOLOGY)
        self.plan = plan(topo, [A, B])
        self.conf = Config.of({"storm.messaging.transport": "local", "record.dir": ".", **conf})
        self.settings = WorkerSettings.from_conf(self.conf)
        self.stops: list[str] = []
        self.state = WorkerState(
            self.plan, slot, self.conf, self.settings, lambda reason, failure=True: self.stops.append(reason)
        )
        self.receiver = self.state.receiver
        self.transfer = self.state.transfer
        self.state.route_to({spec: self.state.build_executor(spec) for spec in self.plan.executors_of(slot)})

    def queued(self, task: int) -> list[Any]:
        queue = self.state.queue_of(task)
        assert queue is not None
        return queue.take(1 << 30, 0)

    def close(self) -> None:
        self.state.context.term()


@pytest.fixture
def world() -> Any:
    w = World()
    yield w
    w.close()


def _rows(n: int) -> list[list[Any]]:
    return [[f"k{i % 3}", i] for i in range(n)]


def test_msgpack_rows_to_a_tuple_source_become_one_item_of_tuples_in_order() -> None:
    w = World(B)  # "in" (task 2) runs on B
    try:
        payloads = [msgpack.packb(r) for r in _rows(5)]
        assert w.receiver.transfer_local([2] * 5, payloads) == 5
        [(task, tuples)] = w.queued(2)
        assert task == 2
        assert [t.values for t in tuples] == _rows(5)
        assert {t.source_component for t in tuples} == {"__client"}
        assert tuples[0].get("n") == 0
        assert w.receiver.counters["source_tuples_in"] == 5
    finally:
        w.close()


def test_arrow_to_a_batch_source_stays_columnar_with_fields_picked_by_name(world: World) -> None:
    data = pa.record_batch({"n": [1, 2, 3], "key": ["a", "b", "c"], "extra": [0, 0, 0]})
    world.receiver.transfer_local([1], [arrow_payload(data)])
    [(task, batch)] = world.queued(1)
    assert task == 1
    assert isinstance(batch, ColumnarBatch)
    assert batch.data.schema.names == ["key", "n"]
    assert batch.column("key").to_pylist() == ["a", "b", "c"]


def test_msgpack_rows_to_a_batch_source_are_assembled_into_one_batch(world: World) -> None:
    world.receiver.transfer_local([1, 1, 1], [msgpack.packb(r) for r in _rows(3)])
    [(_, batch)] = world.queued(1)
    assert batch.data.to_pylist() == [{"key": "k0", "n": 0}, {"key": "k1", "n": 1}, {"key": "k2", "n": 2}]


def test_a_bad_payload_is_dropped_alone_or_rejects_a_whole_group(world: World) -> None:
    good = msgpack.packb(["k", 1])
    world.receiver.transfer_local([1, 1, 1], [good, b"\xc1garbage", msgpack.packb(["only-one-field"])])
    [(_, batch)] = world.queued(1)
    assert batch.num_rows == 1
    assert world.receiver.counters["bad_payload"] == 2
    with pytest.raises(GroupRejectedError):
        world.receiver.transfer_local([1, 1], [good, b"\xc1"], atomic=True)
    assert world.queued(1) == []  # nothing of the group was queued


def test_bolt_tuples_carry_their_anchors_and_their_origin(world: World) -> None:
    rows = [["a", 1], ["b", 2]]
    anchors = [[(0, 11, 12)], []]
    world.receiver.transfer_local([3], [pack_tuples(world.state.serializer, 4, "default", rows, anchors)])
    [(_, tuples)] = world.queued(3)
    assert [t.values for t in tuples] == rows
    assert tuples[0].anchors == [(0, 11, 12)]
    assert tuples[1].anchors == []
    assert (tuples[0].source_component, tuples[0].source_task) == ("mid", 4)
    world.receiver.transfer_local([3], [pack_tuples(world.state.serializer, 4, "default", [["too", 1, "many"]], None)])
    world.receiver.transfer_local([3], [pack_tuples(world.state.serializer, 999, "default", rows, None)])
    assert world.queued(3) == []
    assert world.receiver.counters["bad_payload"] == 2


def test_unknown_tasks_are_dead_lettered_and_moved_tasks_forwarded(tmp_path: Path) -> None:
    dead = tmp_path / "dead.jsonl"
    w = World(A, **{"topology.worker.dead.letter.file": str(dead)})
    try:
        w.receiver.transfer_local([999, 4], [b"lost", b"for B"])
        assert json.loads(dead.read_text())["task"] == 999
        assert w.receiver.counters["unknown_task"] == 1
        assert w.receiver.counters["forwarded"] == 1
        [(message, weight)] = w.transfer.queue.take(10, 0)
        assert message == TaskMessage(4, b"for B")
        assert weight == 1
    finally:
        w.close()


def test_a_processed_group_roots_one_tree_per_tuple_and_per_arrow_batch(world: World) -> None:
    statuses: list[int] = []
    header = BatchHeader("q", 7, 0, 0, 2, PROCESSED)
    batch = MessageBatch([1, 1], [arrow_payload(pa.record_batch({"key": ["a", "b"], "n": [1, 2]}))] * 2)
    world.receiver.recv_group(header, batch, statuses.append)
    assert statuses == [ACCEPTED]
    assert len(world.state.acker) == 2  # one root per Arrow payload sent to a batch source
    items = world.queued(1)
    for _, columnar in items:
        for worker_id, root, edge in columnar.anchors:
            world.state.acker_ops(worker_id, [[1, root, edge]])
    assert statuses == [ACCEPTED, PROCESSED]
    [writer] = world.receiver.writers.snapshot()
    assert (writer["query_id"], writer["last_batch_id"], writer["rows"], writer["groups"]) == ("q", 7, 4, 1)


def test_a_queue_over_its_capacity_reports_load_1_which_peers_accept() -> None:
    # A group larger than a whole executor queue enters it when it is empty (it would never
    # fit otherwise), as the first micro-batch after a slow start does: the queue is full,
    # and its load is 1.0.  A load over 1.0 made every client of the worker take the load
    # frame for a protocol error and reconnect, and acks died with the old connections.
    w = World(A, **{"topology.executor.receive.buffer.size": 4})
    try:
        rows = pa.record_batch({"key": [f"k{i}" for i in range(10)], "n": list(range(10))})
        statuses: list[int] = []
        w.receiver.recv_group(BatchHeader("q", 1, 0, 0, 1), MessageBatch([1], [arrow_payload(rows)]), statuses.append)
        assert statuses == [ACCEPTED]
        queue = w.state.queue_of(1)
        assert queue is not None
        assert len(queue) == 10 > queue.capacity
        loads = w.state.task_loads()
        assert loads[1] == 1.0
        assert w.state.get_load([1]) == {1: 1.0}
        assert FrameDecoder(1 << 16).feed(encode_control(LoadMetrics(loads))) == [LoadMetrics(loads)]
    finally:
        w.close()


@contextlib.contextmanager
def _sending_to_b_with_task_4_backpressured(
    world: World,
) -> Iterator[tuple[list[TaskMessage], Callable[[], None], threading.Thread]]:
    """A running transfer thread of ``world`` connected to B, whose task 4 is backpressured.

    Yields what B received, a call that clears task 4's backpressure, and the thread.
    """
    got: list[TaskMessage] = []
    server = world.state.context.bind("paths", B.port, got.extend)
    conn = world.state.context.connect("paths", B.host, B.port)
    world.state.set_connections({B: conn})
    runner = threading.Thread(target=world.transfer.run, daemon=True)
    runner.start()
    try:
        server.send_backpressure_status(BackpressureStatus("B", frozenset({4})))
        wait_until(lambda: conn.backpressure_tasks() == {4}, what="B's backpressure to reach the client")
        yield got, lambda: server.send_backpressure_status(BackpressureStatus("B", frozenset(), frozenset({4}))), runner
    finally:
        world.transfer.queue.close()
        runner.join(5)


def test_transfer_groups_by_worker_and_holds_backpressured_tasks_in_order(world: World) -> None:
    with _sending_to_b_with_task_4_backpressured(world) as (got, clear, _):
        world.transfer.publish([TaskMessage(4, b"a1"), TaskMessage(6, b"b1")], [1, 1])
        wait_until(lambda: got == [TaskMessage(6, b"b1")], what="the free task's message")
        world.transfer.publish([TaskMessage(4, b"a2")], [1])
        wait_until(lambda: world.transfer.held == 2, what="later messages to be held behind the first")
        clear()
        wait_until(lambda: len(got) == 3, what="the held messages")
        assert got == [TaskMessage(6, b"b1"), TaskMessage(4, b"a1"), TaskMessage(4, b"a2")]
        assert world.transfer.idle


def _publish_as_consumer(world: World, message: TaskMessage) -> None:
    """Publish as the transfer queue's consumer would (the transfer thread), from this thread."""
    world.transfer.queue.consumer = threading.get_ident()
    world.transfer.publish([message], [1])


def test_at_the_hold_limit_only_emits_for_held_tasks_wait_and_the_rest_is_sent() -> None:
    # Two workers whose bolts each fed a backpressured task on the other deadlocked when the
    # transfer thread stopped draining at the limit: each bolt blocked on its full transfer
    # queue and so never drained the queue the other waited on (a replay of the arrow
    # wordcount's logs hung there). Now only a publish for a held task waits.
    world = World(A, **{"topology.backpressure.hold.max.size": 2})
    try:
        with _sending_to_b_with_task_4_backpressured(world) as (got, clear, runner):
            world.transfer.publish([TaskMessage(4, b"a1"), TaskMessage(4, b"a2")], [1, 1])
            wait_until(lambda: world.transfer.held == 2, what="task 4's messages to be held, at the limit")
            world.transfer.publish([TaskMessage(6, b"b1")], [1])  # another task: does not wait
            wait_until(lambda: got == [TaskMessage(6, b"b1")], what="the free task's message, past the held ones")
            waiting = threading.Thread(target=world.transfer.publish, args=([TaskMessage(4, b"a3")], [1]), daemon=True)
            waiting.start()
            waiting.join(0.3)
            assert waiting.is_alive(), "a publish for a task held at the limit waits before queueing"
            assert world.transfer.held == 2
            # ... but not the transfer thread's own (a local delivery forwarding what moved on):
            # it is the thread that releases the held messages, so it must never wait for them
            assert world.transfer.queue.consumer == runner.ident
            own = threading.Thread(target=lambda: _publish_as_consumer(world, TaskMessage(4, b"a0")), daemon=True)
            own.start()
            own.join(5)
            assert not own.is_alive(), "the queue's consumer never waits"
            world.transfer.queue.consumer = runner.ident
            clear()
            waiting.join(5)
            assert not waiting.is_alive()
            wait_until(lambda: len(got) == 5, what="every message for task 4")
            assert got[0] == TaskMessage(6, b"b1")
            assert got[1:3] == [TaskMessage(4, b"a1"), TaskMessage(4, b"a2")]  # the held ones first, in order
            assert sorted(m.payload for m in got[3:]) == [b"a0", b"a3"]
    finally:
        world.close()


def test_the_receive_path_waits_for_room_a_bounded_time_then_takes_the_batch_past_capacity() -> None:
    # The waiting thread is the transport's I/O thread: blocked for good it could not send the
    # backpressure OFF that lets a peer's bolts, and through them this queue's, drain.
    w = World(B, **{"topology.executor.receive.buffer.size": 4, "topology.receiver.full.wait.ms": 200})
    try:
        payloads = [msgpack.packb(r) for r in _rows(3)]
        assert w.receiver.transfer_local([2] * 3, payloads) == 3  # room: no wait
        started = time.monotonic()
        assert w.receiver.transfer_local([2] * 3, payloads) == 3  # 6 > 4 and nobody takes
        assert 0.2 <= time.monotonic() - started < 5
        assert w.receiver.counters["admitted_past_capacity"] == 3
        queue = w.state.queue_of(2)
        assert queue is not None
        assert len(queue) == 6
        assert [t.values for _, tuples in w.queued(2) for t in tuples] == _rows(3) * 2  # in order, nothing lost
    finally:
        w.close()


def test_queued_messages_for_a_task_that_moved_here_are_delivered_here_in_order(world: World) -> None:
    # Emitted while task 5 was remote, taken by the transfer thread after a refresh moved it
    # here: delivered through the receive path, not held for a connection to ourselves.
    first, second = (pack_tuples(world.state.serializer, 3, "default", [[f"k{i}", i]], None) for i in (1, 2))
    world.transfer.queue.publish([(TaskMessage(5, first), 1), (TaskMessage(5, second), 1)], [1, 1])
    world.transfer.queue.close()
    runner = threading.Thread(target=world.transfer.run, daemon=True)  # ends once drained, nothing held
    runner.start()
    runner.join(10)
    assert not runner.is_alive(), f"the transfer thread still holds {world.transfer.held} tuples"
    assert [t.values for _, tuples in world.queued(5) for t in tuples] == [["k1", 1], ["k2", 2]]


def test_emits_leave_as_one_message_per_destination_task_and_local_ones_as_one_item(world: World) -> None:
    mid = next(e for s, e in world.state.executors.items() if s.component == "mid")  # mid[3] on A
    mid.emitter.owner = threading.get_ident()
    mid._prepare()
    tuples = [Tuple(v, world.state.source_of(2, "default")) for v in _rows(60)]
    mid.process([(3, tuples)])
    mid.emitter.flush()
    local = world.queued(5)  # out[5] is on A
    remote = world.transfer.queue.take(1 << 30, 0)  # out[6] is on B
    assert len(local) == 1
    assert len(remote) == 1
    [(task, local_tuples)] = local
    assert task == 5
    [(message, weight)] = remote
    src, stream, remote_rows, anchors, _generation = unpack_bolt(world.state.serializer, message.payload)
    assert (src, stream, anchors, message.task) == (3, "default", None, 6)
    assert weight == len(remote_rows)
    assert sorted([t.values for t in local_tuples] + remote_rows) == sorted(_rows(60))
    assert mid.stats[3].emitted == 60


def test_the_pass_through_forwards_a_list_as_its_execute_would_tuple_by_tuple() -> None:
    """The executor's forward path for PassThroughBolt: same emits, acks, order and counts as ``execute``.

    Untracked tuples go in one call; a tracked tuple and values of the wrong arity go
    through ``execute`` (the wrong arity is the bolt's error, as before), and what follows
    them goes on in order.
    """

    class Tracker:
        def ack(self) -> None:  # pragma: no cover - trees stay open here
            pass

        def fail(self) -> None:  # pragma: no cover
            pass

    def run(forward: bool) -> tuple[dict[Any, list[list[Any]]], dict[Any, Any], dict[int, list[Any]], tuple[int, ...]]:
        w = World()
        try:
            mid = next(e for s, e in w.state.executors.items() if s.component == "mid")  # mid[3] on A
            assert isinstance(mid, TupleExecutor)
            mid.emitter.owner = threading.get_ident()
            mid._prepare()
            assert (3 in mid._forward) is True
            if not forward:
                mid._forward.clear()
            source = w.state.source_of(2, "default")
            root, edge = w.state.acker.root(Tracker())  # type: ignore[arg-type]
            tracked = Tuple(["k1", 100], source)
            tracked.anchors = [(w.state.worker_id, root, edge)]
            tuples = [Tuple(v, source) for v in _rows(30)] + [tracked, Tuple(["short"], source)]
            tuples += [Tuple(v, source) for v in _rows(12)]
            mid.process([(3, tuples)])
            rows = {k: [list(v) for v in vs] for k, vs in mid.emitter.rows.items()}
            anchors = {k: [list(a) for a in vs] for k, vs in mid.emitter.anchors.items()}
            acks = {k: list(v) for k, v in mid.emitter.acks.items()}
            stats = mid.stats[3]
            return rows, anchors, acks, (stats.executed, stats.acked, stats.errors)
        finally:
            w.close()

    fast, slow = run(True), run(False)
    assert fast[0] == slow[0]  # the same rows to the same destinations, in the same order
    assert fast[2].keys() == slow[2].keys()  # the tracked tuple's ack goes out either way
    assert [len(v) for v in fast[1].values()] == [len(v) for v in slow[1].values()]
    assert fast[3] == slow[3] == (44, 43, 1)
    assert sum(len(v) for v in fast[0].values()) == 43


def test_a_batch_becomes_rows_and_rows_a_batch_with_the_tree_kept_whole(world: World) -> None:
    acker = world.state.acker
    done: list[int] = []

    class Tracker:
        def ack(self) -> None:
            done.append(PROCESSED)

        def fail(self) -> None:  # pragma: no cover - not expected
            done.append(-1)

    root, edge = acker.root(Tracker())  # type: ignore[arg-type]
    # columnar batch (one edge) -> a tuple executor: one edge per row, one update
    mid = next(e for s, e in world.state.executors.items() if s.component == "mid")
    assert isinstance(mid, TupleExecutor)
    mid.emitter.owner = threading.get_ident()
    batch = ColumnarBatch(pa.record_batch({"key": ["a", "b"], "n": [1, 2]}), world.state.source_of(1, "default"))
    batch.anchors = [(world.state.worker_id, root, edge)]
    rows = mid._rows_of(batch)
    mid.emitter.flush()
    assert [len(t.anchors) for t in rows] == [1, 1]
    assert not done
    # the rows -> a batch executor: assembled into one batch with one new edge, one update
    out = next(e for s, e in world.state.executors.items() if s.component == "out")
    assert isinstance(out, BatchExecutor)
    out.emitter.owner = threading.get_ident()
    assembled = out._assemble(5, rows)
    out.emitter.flush()
    assert assembled is not None
    assert assembled.data.to_pylist() == [{"key": "a", "n": 1}, {"key": "b", "n": 2}]
    assert not done
    [(worker_id, same_root, batch_edge)] = assembled.anchors
    assert same_root == root
    world.state.acker_ops(worker_id, [[1, root, batch_edge]])  # the batch bolt acks it
    assert done == [PROCESSED]


def test_columnar_payload_metadata_round_trips() -> None:
    from spark_storm.codec.payloads import read_arrow

    data = pa.record_batch({"key": ["x"], "n": [1]})
    edge = new_edge()
    payload = arrow_payload(data, columnar_metadata(3, "s", [(0, 1, edge)]))
    decoded, origin = read_arrow(payload)
    assert decoded.to_pylist() == data.to_pylist()
    assert origin == (3, "s", [(0, 1, edge)], 0)
    assert read_arrow(arrow_payload(data))[1] is None


def test_items_a_stopped_executor_refuses_go_where_their_task_is_now() -> None:
    w = World(B)
    try:
        # the plan moved task 3 (mid[3], on A) ... it is remote for B already: what B holds for it
        # (as a refresh leaves items published to a stopped queue) goes to A as a bolt payload
        tuples = [Tuple(v, w.state.source_of(2, "default")) for v in _rows(4)]
        w.state.reroute([(3, tuples)], [4])
        [(message, weight)] = w.transfer.queue.take(10, 0)
        src, stream, rows, anchors, _generation = unpack_bolt(w.state.serializer, message.payload)
        assert (message.task, weight, src, stream, rows, anchors) == (3, 4, 2, "default", _rows(4), None)
        # a local executor's closed queue refuses a publish; the receive path reroutes it
        queue = w.state.queue_of(2)
        assert queue is not None
        queue.close()
        w.receiver.transfer_local([2], [msgpack.packb(["k", 1])])
        assert w.transfer.queue.take(10, 0) == []  # task 2 is this worker's: dropped, logged
    finally:
        w.close()


def test_a_delivery_group_for_a_task_that_moved_is_refused_so_the_sender_replans(world: World) -> None:
    statuses: list[int] = []
    header = BatchHeader("q", 1, 0, 0, 1, PROCESSED)
    world.receiver.recv_group(header, MessageBatch([4], [msgpack.packb(["k", 1])]), statuses.append)  # task 4 is B's
    assert statuses == [FAILED]
    assert world.transfer.queue.take(10, 0) == []  # not forwarded: its tracking could not follow


@pytest.mark.parametrize("metadata", [None, b"\x93\x03\xa1s\xc0"])
def test_arrow_payload_is_the_stream_pyarrow_writes(metadata: bytes | None) -> None:
    data = pa.record_batch({"key": ["x", None, "zz", "w"], "n": [1, 2, 3, 4]}).slice(1, 2)
    schema = data.schema if metadata is None else data.schema.with_metadata({b"storm": metadata})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(data.replace_schema_metadata(schema.metadata))
    assert arrow_payload(data, metadata) == sink.getvalue().to_pybytes()
    assert pa.ipc.open_stream(arrow_payload(data, metadata)).read_all().to_pylist() == data.to_pylist()


def test_arrow_payloads_keep_each_schemas_own_metadata() -> None:
    # pyarrow's schema == ignores metadata: nothing may be shared between schemas that differ only there
    plain = pa.record_batch({"n": [1]})
    tagged = plain.replace_schema_metadata({b"origin": b"spark"})
    for data in (plain, tagged, plain):
        assert pa.ipc.open_stream(arrow_payload(data)).schema.metadata == data.schema.metadata


def test_a_value_no_codec_carries_fails_its_tuple_alone_and_the_executor_goes_on(world: World) -> None:
    """A bolt forwarding a value that cannot cross to another worker: that tuple's tree fails, nothing else."""
    acker = world.state.acker
    statuses: list[int] = []
    tracker = GroupTracker(statuses.append)
    mid = next(e for s, e in world.state.executors.items() if s.component == "mid")  # mid[3] on A
    mid.emitter.owner = threading.get_ident()
    mid._prepare()
    source = world.state.source_of(2, "default")
    keys = [f"k{i}" for i in range(40)]
    remote_key = next(k for k in keys if mid.collectors[3]._routes["default"].choose([k, 0]) == [6])  # out[6] is on B
    good, bad = Tuple([remote_key, 1], source), Tuple([remote_key, object()], source)
    tracker.expect(2)
    for tup in (good, bad):
        root, edge = acker.root(tracker)
        tup.anchors = [(world.state.worker_id, root, edge)]
    tracker.sealed()
    mid.process([(3, [good, bad])])
    mid.emitter.flush()  # must not raise: the executor thread would die with it
    [(message, weight)] = world.transfer.queue.take(1 << 30, 0)
    assert weight == 1
    assert unpack_bolt(world.state.serializer, message.payload)[2] == [[remote_key, 1]]
    assert statuses == [FAILED]  # the bad tuple's tree failed: the group is replayed
    [error] = list(world.state.errors)
    assert "component 'mid' task 3 stream 'default'" in error["error"]
    assert "field 'n' holds a object" in error["error"]
    assert mid.stats[3].errors == 1


def test_a_bad_payload_from_another_worker_fails_the_trees_it_names_and_counts_as_lost(world: World) -> None:
    """Issue 24: a payload another worker sent that no decoder reads is a failure, never only a log line."""
    statuses: list[int] = []
    tracker = GroupTracker(statuses.append)
    tracker.expect(1)
    root, edge = world.state.acker.root(tracker)
    me = world.state.worker_id
    wrong_arity = pack_tuples(world.state.serializer, 4, "default", [["too", 1, "many"]], [[(me, root, edge)]])
    world.receiver.transfer_local([3], [wrong_arity])
    assert world.queued(3) == []
    assert statuses == [FAILED]  # at once, not at the message timeout
    counters = world.receiver.counters
    assert (counters["bad_payload"], counters["lost_payloads"]) == (1, 1)
    [error] = list(world.state.errors)
    assert error["task"] == 3
    assert "could not be decoded" in error["error"]
    world.receiver.transfer_local([3], [b"\xc1 not msgpack at all"])  # nothing to salvage: counted, reported
    assert (counters["bad_payload"], counters["lost_payloads"]) == (2, 2)
    assert not world.state.checkpoints.stateful  # a stateless topology: its trees time out (Storm's rule)


def test_acker_updates_that_cannot_be_read_apply_what_can_and_count_the_rest_as_lost(world: World) -> None:
    from spark_storm.worker.acker import ACKER_TASK, FAIL_OP

    statuses: list[int] = []
    tracker = GroupTracker(statuses.append)
    tracker.expect(1)
    root, _edge = world.state.acker.root(tracker)
    ops = [[FAIL_OP, root, 0], ["not", "an", "op"]]
    world.receiver.transfer_local([ACKER_TASK], [world.state.serializer.dumps(ops)])
    assert statuses == [FAILED]  # the well-formed op was applied
    world.receiver.transfer_local([ACKER_TASK], [b"\x92\x01"])  # cut short
    counters = world.receiver.counters
    assert (counters["bad_acker_updates"], counters["lost_payloads"]) == (2, 2)
    assert all("acker updates could not be read" in e["error"] for e in world.state.errors)


STATEFUL: dict[str, Any] = {
    "name": "paths-stateful",
    "components": [
        {"id": "in", "source": True, "fields": ["key", "n"]},
        {
            "id": "ledger",
            "bolt": "tests.integration.bolts:LedgerBolt",
            "parallelism": 2,
            "inputs": [{"from": "in", "grouping": "fields", "fields": ["key"]}],
        },
    ],
}


def test_in_a_stateful_topology_a_lost_payload_marks_the_state_dirty_so_nothing_commits_past_it(
    tmp_path: Path,
) -> None:
    """The issue-24 failure: checkpoints went on committing epochs that lacked the lost tuples."""
    topo = topology_from_dict(STATEFUL)
    the_plan = plan(topo, [A, B])
    conf = Config.of({"storm.messaging.transport": "local", "topology.state.provider": "memory", "record.dir": "."})
    state = WorkerState(the_plan, A, conf, WorkerSettings.from_conf(conf), lambda reason, failure=True: None)
    state.route_to({spec: state.build_executor(spec) for spec in the_plan.executors_of(A)})
    try:
        checkpoints = state.checkpoints
        assert isinstance(checkpoints, CheckpointManager)
        assert checkpoints.dirty_reasons == []
        [ledger_task] = [t for t in the_plan.tasks_of(A) if the_plan.task_component[t] == "ledger"]
        state.receiver.transfer_local([ledger_task], [b"\xc1 corrupt"])
        assert checkpoints.status()["dirty"] is True
        assert any("could not be decoded" in r for r in checkpoints.dirty_reasons)
        refused_from_a_client = state.receiver.counters["bad_payload"]
        [source_task] = the_plan.component_tasks["in"]
        assert the_plan.task_slot[source_task] == A  # executors go round-robin: in -> A, ledger -> B, A
        checkpoints.dirty_reasons.clear()  # a plain client's garbage was never accepted: no hole
        state.receiver.transfer_local([source_task], [b"\xc1 from a client"])
        assert checkpoints.dirty_reasons == []
        assert state.receiver.counters["bad_payload"] == refused_from_a_client + 1
    finally:
        state.context.term()


def test_a_group_whose_input_log_append_fails_part_way_fails_and_its_retry_is_new_input() -> None:
    """A retried group is taken as seen only if every row of it was logged."""
    source, ledger = STATEFUL["components"]
    topo = topology_from_dict({**STATEFUL, "components": [{**source, "parallelism": 2}, ledger]})
    the_plan = plan(topo, [A])
    conf = Config.of({"storm.messaging.transport": "local", "topology.state.provider": "memory", "record.dir": "."})
    state = WorkerState(the_plan, A, conf, WorkerSettings.from_conf(conf), lambda reason, failure=True: None)
    state.route_to({spec: state.build_executor(spec) for spec in the_plan.executors_of(A)})
    try:
        checkpoints = state.checkpoints
        assert isinstance(checkpoints, CheckpointManager)
        first, second = the_plan.component_tasks["in"]
        broken = checkpoints.inputs._open(second)
        append = broken.append

        def refuse(*args: Any) -> None:
            raise OSError(28, "No space left on device")

        broken.append = refuse  # type: ignore[method-assign,assignment]
        header = BatchHeader("q", 4, 0, 0, 2, ACCEPTED, coordinated=True)
        batch = MessageBatch.of(
            [TaskMessage(first, msgpack.packb(["a", 1])), TaskMessage(second, msgpack.packb(["b", 2]))]
        )
        acks: list[int] = []
        state.receiver.recv_group(header, batch, acks.append)
        assert acks == [FAILED]
        assert any("input-log append failed" in r for r in checkpoints.dirty_reasons)
        assert not checkpoints.inputs.group_seen(header.key)  # the first task's share alone is in a log
        assert state.queue_of(first).take(100, 0) == []  # type: ignore[union-attr]  # nothing of it was queued
        broken.append = append  # type: ignore[method-assign]
        state.receiver.recv_group(header, batch, acks.append)  # the sender's retry
        assert acks == [FAILED, ACCEPTED]
        assert checkpoints.inputs.group_seen(header.key)
    finally:
        state.context.term()


def test_remote_worker_of_names_the_other_workers_tasks_and_follows_a_plan_swap(world: World) -> None:
    from spark_storm.worker.acker import worker_id

    state = world.state
    b = worker_id(B)  # tasks 2, 4 and 6 run on B; 7 is no task of the plan
    assert [state.remote_worker_of(t) for t in range(1, 8)] == [-1, b, -1, b, -1, b, -1]
    alone = plan(topology_from_dict(TOPOLOGY), [A])  # every task here now
    state.swap(alone, {}, state.executors)
    assert [state.remote_worker_of(t) for t in range(1, 7)] == [-1] * 6
