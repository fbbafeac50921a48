"""The worker's transfer path (Storm's ``WorkerTransfer``) and backpressure tracking.

Executors hand their emits for remote tasks to the bounded transfer queue — one message
per (emitting task, stream, destination task) and executor batch, weighted by its tuple
count.  The transfer thread drains it, groups the messages by destination worker and
calls ``send`` once per worker.  A message for a task its worker reports backpressured
is *held* (never dropped) and retried every few milliseconds; while any message for a
task is held, later ones for that task are held behind it, so nothing overtakes
anything per (source task, destination task).  When the held messages reach
``topology.backpressure.hold.max.size`` tuples, a ``publish`` with a message for a held
task waits before queueing (as Storm 2's executors keep such emits pending), and the
thread goes on draining and sending the rest: messages for other tasks never wait behind
a backpressured one.  (Stopping the whole queue instead deadlocked two workers whose
bolts each fed a backpressured task on the other: each one's bolt, blocked on its full
transfer queue, stopped draining the very queue the other was waiting on.)

:class:`BackPressureTracker` (Storm's name) is the other direction: it turns this
worker's executor queues crossing their watermarks into backpressure status for the
clients that send to it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_storm.errors import ConnectionClosedError, StormError
from spark_storm.messaging import BackpressureStatus, IServer, TaskMessage
from spark_storm.topology.assignment import ExecutorSpec, Slot
from spark_storm.worker.queue import BatchQueue
from spark_storm.worker.settings import WorkerSettings

if TYPE_CHECKING:
    from spark_storm.worker.state import WorkerState

__all__ = ["BackPressureTracker", "WorkerTransfer"]

logger = logging.getLogger(__name__)

#: A transfer queue item: a message and the tuples it carries.
Outbound = tuple[TaskMessage, int]


class WorkerTransfer:
    """Remote emits -> grouped by destination worker -> ``send`` (one thread).

    Parameters
    ----------
    host : WorkerState
    settings : WorkerSettings
    """

    def __init__(self, host: WorkerState, settings: WorkerSettings) -> None:
        self._host = host
        self.queue: BatchQueue[Outbound] = BatchQueue(settings.transfer_queue_size, "transfer")
        self._drain = settings.transfer_batch_size
        self._hold_max = settings.hold_max
        self._held: list[Outbound] = []
        self._held_tuples = 0
        #: The held tasks while the held tuples are at the limit (else empty): what ``publish``
        #: waits on.  Replaced whole by the transfer thread under ``_room``, read by publishers.
        self._blocked: frozenset[int] = frozenset()
        self._room = threading.Condition()
        self._held_tasks: set[int] = set()
        self._unconnected: set[Slot] = set()  # reported once until a connection to it appears
        self._done = 0
        self._clear: threading.Event | None = None
        self._thread_alive: Callable[[], bool] | None = None

    def clear(self, timeout: float = 5.0) -> bool:
        """Drop what is queued and held (a rollback: it belongs to the old generation).

        The transfer thread does it at its next turn, and this waits for that: after a
        rollback resumes, the queue holds the new generation's messages, which must not be
        cleared.  Whatever the thread sends meanwhile carries the old generation and is
        dropped on arrival.  Returns False if the thread did not get to it in time.
        """
        done = threading.Event()
        self._clear = done
        if self._thread_alive is not None and not self._thread_alive():
            return True
        return done.wait(timeout)

    def publish(self, messages: list[TaskMessage], weights: list[int]) -> None:
        """Queue messages for remote tasks.

        Waits while the queue is full, and while a message is for a task whose held tuples
        reached the limit (until the task clears, or the held tuples drop below it).  The
        transfer thread itself (its local deliveries forward what moved on) never waits: it
        is the one that releases what is held and drains the queue.
        """
        if self._blocked and threading.get_ident() != self.queue.consumer:
            self._wait_unblocked(messages)
        if not self.queue.publish(list(zip(messages, weights, strict=True)), weights):
            logger.error(
                "worker %s: transfer queue closed; %d messages (%d tuples) not sent",
                self._host.slot,
                len(messages),
                sum(weights),
            )

    def _wait_unblocked(self, messages: list[TaskMessage]) -> None:
        with self._room:
            while not self.queue.closed:
                blocked = self._blocked
                if not blocked or not any(m.task in blocked for m in messages):
                    return
                self._room.wait(0.05)

    def _update_blocked(self) -> None:
        """Publish which tasks publishers must wait for (the transfer thread, after each change)."""
        blocked = frozenset(self._held_tasks) if self._held_tuples >= self._hold_max else frozenset()
        if blocked != self._blocked:
            with self._room:
                self._blocked = blocked
                self._room.notify_all()

    @property
    def held(self) -> int:
        """Tuples held for backpressured (or unreachable) tasks."""
        return self._held_tuples

    @property
    def idle(self) -> bool:
        q = self.queue
        return len(q) == 0 and q.consumed == self._done and not self._held

    def run(self) -> None:
        """Drain, group and send until the queue is closed and nothing is held (the transfer thread)."""
        retry_at = 0.0
        queue = self.queue
        current = threading.current_thread()
        self._thread_alive = current.is_alive
        queue.consumer = threading.get_ident()  # its own publishes (a forward) never wait: see publish
        while True:
            cleared = self._clear
            if cleared is not None:
                self._clear = None
                queue.clear()
                self._held, self._held_tuples, self._held_tasks = [], 0, set()
                cleared.set()
            if self._held and time.monotonic() >= retry_at:
                # Retry held messages on a short interval, not on every pass: while the
                # destination stays backpressured, re-checking each pass would only spin.
                self._release_held()
                retry_at = time.monotonic() + 0.002
            # At the limit, publishers wait for the held tasks; this thread keeps taking, so
            # what other tasks are sent is not stuck behind them (see the module docstring).
            if self._blocked or self._held_tuples >= self._hold_max:
                self._update_blocked()
            items = queue.take(self._drain, 0.002 if self._held else 0.05)
            if not items:
                if queue.closed and not self._held and len(queue) == 0:
                    return
                continue
            self._send_grouped(items)
            self._done += sum(w for _, w in items)

    def _hold(self, item: Outbound) -> None:
        self._held.append(item)
        self._held_tuples += item[1]
        self._held_tasks.add(item[0].task)

    def _send_grouped(self, items: list[Outbound]) -> None:
        host = self._host
        task_slot = host.plan.task_slot
        connections = host.connections
        by_slot: dict[Slot, list[Outbound]] = {}
        unknown: list[TaskMessage] = []
        for item in items:
            slot = task_slot.get(item[0].task)
            if slot is None:
                unknown.append(item[0])
                continue
            group = by_slot.get(slot)
            if group is None:
                by_slot[slot] = [item]
            else:
                group.append(item)
        if unknown:
            host.unknown(unknown)
        held_tasks = self._held_tasks
        for slot, group in by_slot.items():
            if slot == host.slot:
                # Emitted for a remote task that a refresh has since moved here: what is held for
                # it went through here first (held items are retried before new ones), so the
                # order per (source, destination) task holds.
                host.deliver_local([m for m, _ in group])
                continue
            conn = connections.get(slot)
            if conn is None:
                if slot not in self._unconnected:  # retried every few ms: say it once
                    self._unconnected.add(slot)
                    logger.error("worker %s: no connection to %s; holding its messages", host.slot, slot)
                for item in group:
                    self._hold(item)
                continue
            self._unconnected.discard(slot)
            bp = conn.backpressure_tasks()
            if bp or held_tasks:
                ready = []
                for item in group:
                    task = item[0].task
                    if task in bp or task in held_tasks:
                        self._hold(item)  # behind what is held for it already: order kept
                    else:
                        ready.append(item)
                group = ready
            if not group:
                continue
            try:
                conn.send([m for m, _ in group])
            except StormError as exc:
                logger.error("worker %s: send to %s failed (%s); holding %d messages", host.slot, slot, exc, len(group))
                for item in group:
                    self._hold(item)

    def _release_held(self) -> None:
        held, self._held = self._held, []
        self._held_tuples = 0
        self._held_tasks = set()
        self._send_grouped(held)


class BackPressureTracker:
    """Which local tasks are over their queue's high watermark; reported to the clients.

    Parameters
    ----------
    worker_id : str
        ``host:port`` of this worker (in the status messages).
    server : callable
        Returns the worker's server connection (None before it is bound).
    """

    def __init__(self, worker_id: str, server: Callable[[], IServer | None]) -> None:
        self._worker_id = worker_id
        self._server = server
        self._lock = threading.Lock()  # decides and sends each status: the last word is the truth
        self._tasks: set[int] = set()
        self._known: set[int] = set()

    @property
    def tasks(self) -> list[int]:
        with self._lock:
            return sorted(self._tasks)

    def update(self, spec: ExecutorSpec, queue: BatchQueue[Any]) -> None:
        """Tell the clients whether ``spec``'s queue is over its high watermark (it just crossed one).

        Decided from the queue's state now and sent under one lock, not from which crossing
        called: a publisher crossing the high watermark and the consumer draining under the
        low one call from two threads in either order, and the last status sent must be the
        queue's (docs/design/threads.md).
        """
        tasks = frozenset(spec.tasks)
        with self._lock:
            on = queue.over_high
            self._known |= tasks
            if on:
                self._tasks |= tasks
            else:
                self._tasks -= tasks
            self._send(BackpressureStatus(self._worker_id, tasks if on else frozenset(), frozenset() if on else tasks))
        logger.debug("worker %s: backpressure %s for %s", self._worker_id, "on" if on else "off", spec)

    def resend(self) -> None:
        """Send every task's status again (the timer): a client that missed one learns it now."""
        with self._lock:
            if self._known:
                held = frozenset(self._tasks)
                self._send(BackpressureStatus(self._worker_id, held, frozenset(self._known - held)))

    def _send(self, status: BackpressureStatus) -> None:
        # Caller holds self._lock.
        server = self._server()
        if server is not None:
            try:
                server.send_backpressure_status(status)
            except ConnectionClosedError:
                return
