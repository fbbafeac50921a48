"""Races the thread audit found (docs/design/threads.md, "Found unsafe"), each provoked here as it happened.

Most run two real threads for a bounded time at a 1 µs switch interval, so the interleaving that
broke shows up within the bound; each failed reliably before its fix (the counts in the
docstrings).  The backpressure one is deterministic: it plays the late callback in order.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest

from spark_storm.config import Config
from spark_storm.errors import CheckpointError
from spark_storm.messaging import BackpressureStatus
from spark_storm.topology import Slot, plan, topology_from_dict
from spark_storm.topology.assignment import ExecutorSpec
from spark_storm.worker.checkpoint import CheckpointManager
from spark_storm.worker.queue import BatchQueue
from spark_storm.worker.settings import WorkerSettings
from spark_storm.worker.state import WorkerState
from spark_storm.worker.transfer import BackPressureTracker
from tests.support.windows import Harness

A, B = Slot("h", 1), Slot("h", 2)


@pytest.fixture
def tiny_switch_interval() -> Iterator[None]:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def _race(seconds: float, *threads: Callable[[float], None]) -> None:
    """Run each ``target(deadline)`` on its own thread until the deadline (bounded in time)."""
    deadline = time.monotonic() + seconds
    running = [threading.Thread(target=t, args=(deadline,)) for t in threads]
    for t in running:
        t.start()
    for t in running:
        t.join(seconds + 30)
        assert not t.is_alive()


class _Clients:
    """What the clients end up believing, statuses applied in the order they were sent."""

    def __init__(self) -> None:
        self.backpressured: frozenset[int] = frozenset()

    def send_backpressure_status(self, status: BackpressureStatus) -> None:
        self.backpressured = (self.backpressured | status.bp_tasks) - status.non_bp_tasks


def test_a_late_backpressure_on_after_the_queue_drained_tells_the_clients_off() -> None:
    """A publisher crossing the high watermark calls back after its lock is released; the consumer
    may drain under the low watermark and send OFF first.  The late callback must not leave the
    clients holding the task back (it did in 2 of 129 episodes of two threads)."""
    clients = _Clients()
    tracker = BackPressureTracker("w", lambda: clients)  # type: ignore[arg-type,return-value]
    spec = ExecutorSpec(7, 7, "c")
    callbacks: list[Callable[[], None]] = []
    queue: BatchQueue[int] = BatchQueue(
        1000, "c", 0.9, 0.4, on_high=lambda: callbacks.append(lambda: tracker.update(spec, queue))
    )
    queue.publish([1], [950])  # crosses the high watermark: its callback is late (still in the list)
    assert queue.take(1 << 30, 0) == [1]  # the consumer drains under the low one: OFF goes first
    tracker.update(spec, queue)
    assert clients.backpressured == frozenset()
    callbacks.pop()()  # now the publisher's late callback
    assert clients.backpressured == frozenset(), "the clients hold task 7 back while its queue is empty"
    tracker.resend()
    assert clients.backpressured == frozenset()


STATEFUL = {
    "name": "races",
    "components": [
        {"id": "in", "source": True, "fields": ["word"]},
        {
            "id": "count",
            "bolt": "spark_storm.examples.wordcount:StatefulCountBolt",
            "fields": ["word", "count"],
            "inputs": [{"from": "in", "grouping": "fields", "fields": ["word"]}],
        },
    ],
}


def _stateful(topology: dict[str, Any], slots: list[Slot], slot: Slot, **conf: Any) -> WorkerState:
    the_plan = plan(topology_from_dict(topology), slots)
    config = Config.of({"storm.messaging.transport": "local", "topology.state.provider": "memory", **conf})
    state = WorkerState(the_plan, slot, config, WorkerSettings.from_conf(config), lambda *a, **k: None)
    state.route_to({spec: state.build_executor(spec) for spec in the_plan.executors_of(slot)})
    return state


def test_a_pause_while_the_last_replay_waits_on_a_full_queue_leaves_nothing_of_it_queued() -> None:
    """The replay thread, blocked publishing into a full queue, was woken by PAUSE's clear and
    published a record of the old generation after PAUSE had emptied the queue: the next RESUME
    replayed it again (27 of 27 pauses before the replay published under the gate)."""
    # the source alone on B (executors go round-robin: count -> A, in -> B): no state to restore here
    state = _stateful(STATEFUL, [A, B], B, **{"topology.executor.receive.buffer.size": 4})
    checkpoints = state.checkpoints
    assert isinstance(checkpoints, CheckpointManager)
    checkpoints.open()
    [source] = state.plan.component_tasks["in"]
    for i in range(50):
        checkpoints.log_group(None, [(source, [msgpack.packb([f"w{i}"])])])
    threading.Thread(target=state.transfer.run, daemon=True).start()
    queue = state.queue_of(source)
    assert queue is not None
    generation, left = 0, []
    try:
        for _ in range(8):
            generation += 1
            checkpoints._pause(generation)
            checkpoints._resume(0, generation)  # starts replaying the 50 records: the queue fills
            deadline = time.monotonic() + 10
            while len(queue) < queue.capacity and time.monotonic() < deadline:
                time.sleep(0.0005)
            generation += 1
            checkpoints._pause(generation)  # the next rollback, while the replay waits for room
            time.sleep(0.005)  # the old replay woke: it must see the new generation, not publish
            left.append(len(queue))
            checkpoints._resume(0, generation)
            generation += 1
            checkpoints._pause(generation)  # a clean slate for the next trial
            queue.clear()
    finally:
        state.context.term()
    assert left == [0] * 8, f"tuples of the old replay left queued after PAUSE: {left}"


def test_a_refresh_emptying_the_source_cache_while_the_receive_path_fills_it(tiny_switch_interval: None) -> None:
    """source_of counted a client's streams by iterating the cache other threads insert into:
    'dictionary changed size during iteration' lost a whole network read (1,575 times in 3 s)."""
    state = _stateful(STATEFUL, [A, B], A)
    errors: list[str] = []

    def receive(deadline: float) -> None:
        i = 0
        while time.monotonic() < deadline:
            i += 1
            try:
                state.source_of(-1, f"s{i % 400}")  # more client streams than the cache keeps: it counts
            except RuntimeError as exc:
                errors.append(repr(exc))

    def refresh_and_emit(deadline: float) -> None:
        while time.monotonic() < deadline:
            with state.lock:
                state._sources = {}  # what a refresh's swap does
            for task in state.plan.task_component:
                state.source_of(task, "default")  # the executors' first emits after it

    try:
        _race(2.0, receive, refresh_and_emit)
    finally:
        state.context.term()
    assert errors == []


def test_a_refresh_moving_source_tasks_while_groups_are_checked(tiny_switch_interval: None) -> None:
    """executors_moved added and dropped input logs without the gate while group_seen iterated them
    under it (1,872 RuntimeErrors in 3 s; each failed a delivery group)."""
    components: list[dict[str, Any]] = [{"id": f"in{i}", "source": True, "fields": ["word"]} for i in range(8)]
    components.append(
        {
            "id": "count",
            "bolt": "spark_storm.examples.wordcount:StatefulCountBolt",
            "fields": ["word", "count"],
            "inputs": [{"from": f"in{i}", "grouping": "fields", "fields": ["word"]} for i in range(8)],
        }
    )
    state = _stateful({"name": "logs", "components": components}, [A], A)
    checkpoints = state.checkpoints
    assert isinstance(checkpoints, CheckpointManager)
    checkpoints.open()
    every = state._local_tasks
    sources = sorted(t for t in every if state.plan.topology.components[state.plan.task_component[t]].source)
    errors: list[str] = []

    def receive(deadline: float) -> None:
        while time.monotonic() < deadline:
            with checkpoints.gate:
                try:
                    checkpoints.inputs.group_seen(("q", 99, 0, 0))
                except RuntimeError as exc:
                    errors.append(repr(exc))

    def refresh(deadline: float) -> None:
        i = 0
        while time.monotonic() < deadline:
            i += 1
            state._local_tasks = every - {sources[i % len(sources)]} if i % 2 else every
            checkpoints.executors_moved([], [])

    try:
        _race(2.0, receive, refresh)
    finally:
        state.context.term()
    assert errors == []


@pytest.mark.parametrize(
    ("bolt", "window"),
    [
        (
            "spark_storm.examples.windows:WindowCountTuples",
            {"length": "2s", "sliding": "100ms", "timestamp_field": "ts"},
        ),
        ("spark_storm.examples.windows:WindowCount", {"session_gap": "500ms", "timestamp_field": "ts", "key": "user"}),
    ],
)
def test_health_reads_window_metrics_while_the_executor_changes_the_windows(
    bolt: str, window: dict[str, Any], tiny_switch_interval: None
) -> None:
    """/health and /metrics read the window engine from HTTP threads: 'dictionary changed size' broke
    them at random (1,224 times in 4 s)."""
    harness = Harness(bolt, window)
    errors: list[str] = []
    reads = [0]

    def executor(deadline: float) -> None:
        t, i = 1_700_000_000_000, 0
        while time.monotonic() < deadline:
            i += 1
            t += 37
            harness.send([[t, f"u{i % 50}", i]])

    def http(deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                harness.window_metrics()
                reads[0] += 1
            except RuntimeError as exc:
                errors.append(repr(exc))

    _race(1.5, executor, http)
    assert reads[0] > 100
    assert errors == []


def test_a_resume_below_the_committed_epoch_is_refused_so_the_round_reads_status_again() -> None:
    """bench.chaos seed 14 #16: a Spark driver read STATUS (committed 6, epoch 7 prepared) while the
    interval round committed 7 and truncated its input; the driver's RESUME(6) then lost epoch 7's rows."""
    state = _stateful(STATEFUL, [A, B], B)
    checkpoints = state.checkpoints
    assert isinstance(checkpoints, CheckpointManager)
    checkpoints.open()
    threading.Thread(target=state.transfer.run, daemon=True).start()
    try:
        checkpoints.committed = 7  # what a COMMIT of epoch 7 left
        checkpoints._pause(1)
        with pytest.raises(CheckpointError, match="RESUME to epoch 6, but epoch 7 is committed here"):
            checkpoints._resume(6, 1)
        checkpoints._resume(7, 1)  # the next round, from a fresh STATUS
    finally:
        state.context.term()


def test_a_prepare_answers_at_once_once_the_worker_is_dirty() -> None:
    """bench.chaos seed 1 #10: a lost barrier's PREPARE waited the whole commit timeout though the loss had
    made the worker dirty (the round is spoiled either way)."""
    state = _stateful(STATEFUL, [A, B], A, **{"topology.state.commit.timeout.ms": 60_000})
    checkpoints = state.checkpoints
    assert isinstance(checkpoints, CheckpointManager)
    checkpoints.open()
    try:
        # A driver's PREPARE; the ledger task here never sees its barrier (no executor runs).
        wait = checkpoints._prepare(1, 0, priority=1)
        checkpoints.mark_dirty("a payload from another worker could not be decoded")
        started = time.monotonic()
        assert wait() == {"epoch": 1, "dirty": True, "generation": 0}
        assert time.monotonic() - started < 5
    finally:
        state.context.term()
