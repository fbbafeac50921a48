"""The worker's receive path: bytes off the server -> tuples or columnar batches -> executor queues.

Storm 2.x's ``DeserializingConnectionCallback`` hands each batch the server read to
``WorkerState.transferLocal``, which deserializes and publishes to executor queues.
Here the same happens per *batch* of messages:

1. messages are grouped by destination task (one pass; a batch for a single task — the
   usual case — is not even split);
2. each task's payloads are decoded in bulk by the codec's decoders
   (:class:`~spark_storm.codec.SourceDecoder` for what clients send to source tasks,
   :class:`~spark_storm.codec.BoltDecoder` for what bolts send each other), into one list
   of :class:`~spark_storm.codec.Tuple` per message run, or one
   :class:`~spark_storm.codec.ColumnarBatch` per Arrow payload when the task runs a batch
   bolt (Spark's Arrow never becomes Python rows then);
3. tracked source tuples root their tuple trees, and every executor's share is published
   with one ``publish``.

This module only routes: every check on the bytes happens in the decoders.

Unknown task ids are counted, logged (rate-limited) and dropped or dead-lettered; tasks
that moved to another worker (a newer plan) are forwarded there.  Delivery groups
(:meth:`Receiver.recv_group`) are decoded whole before anything is queued, so a bad
payload rejects the group and nothing of it runs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.decoder import BoltDecoder, SourceDecoder
from spark_storm.codec.payloads import salvage_anchors
from spark_storm.codec.tuples import BROADCAST_TASK, Tuple
from spark_storm.errors import ConnectionClosedError, GroupRejectedError, WireFormatError
from spark_storm.messaging import IConnectionCallback, IServer, MessageBatch, TaskMessage
from spark_storm.messaging.api import GroupKey
from spark_storm.messaging.wire import ACCEPTED, FAILED, PROCESSED, BatchHeader
from spark_storm.reports import WriterCounts, WriterMetrics
from spark_storm.worker.acker import ACKER_TASK, GroupTracker, anchors_of, fail_ops
from spark_storm.worker.checkpoint.participant import CheckpointManager
from spark_storm.worker.queue import BatchQueue, QueueItem
from spark_storm.worker.stats import LatencyHistogram

if TYPE_CHECKING:
    from spark_storm.worker.state import WorkerState

__all__ = [
    "DeserializingConnectionCallback",
    "Receiver",
    "WriterStats",
]

logger = logging.getLogger(__name__)


class WriterStats:
    """What one worker sees of the Spark writers feeding it (per query id)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queries: dict[str, WriterCounts] = {}
        self._seen: dict[str, set[tuple[int, int, int]]] = {}
        self._latency: dict[str, LatencyHistogram] = {}

    def group(self, header: BatchHeader) -> float:
        """Record a group's arrival; return its arrival time (for :meth:`finished`)."""
        key = (header.batch_id, header.partition, header.sequence)
        with self._lock:
            q = self._queries.get(header.query_id)
            if q is None:
                q = self._queries[header.query_id] = {
                    "query_id": header.query_id,
                    "last_batch_id": header.batch_id,
                    "rows": 0,
                    "groups": 0,
                    "replays": 0,
                    "failed": 0,
                }
                self._seen[header.query_id] = set()
                self._latency[header.query_id] = LatencyHistogram()
                if len(self._queries) > 64:  # bounded: forget the oldest query
                    oldest = next(iter(self._queries))
                    for table in (self._queries, self._seen, self._latency):
                        table.pop(oldest, None)
            seen = self._seen[header.query_id]
            if key in seen:
                q["replays"] += 1
            else:
                if len(seen) >= 100_000:
                    seen.clear()
                seen.add(key)
            q["last_batch_id"] = max(q["last_batch_id"], header.batch_id)
            q["groups"] += 1  # its rows are added once decoded (add_rows)
        return time.monotonic()

    def add_rows(self, header: BatchHeader, rows: int) -> None:
        """Add a group's rows once they are decoded."""
        with self._lock:
            q = self._queries.get(header.query_id)
            if q is not None:
                q["rows"] += rows

    def finished(self, header: BatchHeader, status: int, since: float) -> None:
        """Record a group's final ack (ack latency from its arrival)."""
        with self._lock:
            q = self._queries.get(header.query_id)
            if q is None:
                return
            if status == FAILED:
                q["failed"] += 1
            else:
                self._latency[header.query_id].record(time.monotonic() - since)

    def snapshot(self) -> list[WriterMetrics]:
        with self._lock:
            out: list[WriterMetrics] = []
            for qid, q in self._queries.items():
                hist = self._latency[qid]
                p50, p99 = hist.percentile(50), hist.percentile(99)
                out.append(
                    {
                        **q,
                        "ack_latency_p50_ms": None if p50 is None else round(p50 * 1000, 3),
                        "ack_latency_p99_ms": None if p99 is None else round(p99 * 1000, 3),
                    }
                )
            return out


class Receiver:
    """Decodes what the server delivers and publishes it to executor queues.

    Parameters
    ----------
    host : WorkerState
        The worker's state.
    dead_letter_file : str, optional
        Where messages for unknown tasks go (JSON lines); dropped when None.
    """

    def __init__(self, host: WorkerState, dead_letter_file: str | None = None) -> None:
        self._host = host
        self._sources = SourceDecoder(host.serializer)
        self._bolts = BoltDecoder(host.serializer, host.source_of, lambda: host.generation, self._fail_stale)
        self._dead_letter_path = dead_letter_file
        self._lock = threading.Lock()
        self._last_unknown_log = 0.0
        self.writers = WriterStats()
        self.busy = False
        self.counters = {
            "replayed_tuples": 0,
            "received": 0,
            "tuples_in": 0,
            "source_tuples_in": 0,
            "unknown_task": 0,
            "forwarded": 0,
            "bad_payload": 0,
            "bad_acker_updates": 0,
            "lost_payloads": 0,
            "lost_tuples": 0,
            "dead_lettered": 0,
            "admitted_past_capacity": 0,
        }
        self._full_wait_s = host.settings.receiver_full_wait_s

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` (any thread)."""
        if n:
            with self._lock:
                self.counters[name] += n

    # --- entry points ---------------------------------------------------------------
    def transfer_local(
        self,
        tasks: list[int],
        payloads: list[bytes],
        tracker: GroupTracker | None = None,
        atomic: bool = False,
        key: GroupKey | None = None,
    ) -> int:
        """Decode messages and publish each executor's share with one ``publish``.

        Returns how many tuples (rows) were published.  With a ``tracker`` every
        source tuple (or source batch) roots a tuple tree that reports to it.
        ``atomic`` (delivery groups): a bad payload rejects the whole group before
        anything is queued (:class:`GroupRejectedError`); otherwise it is dropped, counted
        and logged.  In a stateful topology what source tasks accept goes to their input
        logs first (``key``: the delivery group's), and while a rollback replays those
        logs it is only logged: the replay publishes it (docs/design/state.md).
        """
        checkpoints = self._host.checkpoints
        if not isinstance(checkpoints, CheckpointManager):
            return self._transfer(tasks, payloads, tracker, atomic, None, True)
        with checkpoints.gate:
            return self._transfer(tasks, payloads, tracker, atomic, key, not checkpoints.inputs.replaying)

    def _transfer(
        self,
        tasks: list[int],
        payloads: list[bytes],
        tracker: GroupTracker | None,
        atomic: bool,
        key: GroupKey | None,
        publish_sources: bool,
    ) -> int:
        n = len(tasks)
        if not n:
            return 0
        self.count("received", n)
        if tasks.count(tasks[0]) == n:
            by_task: dict[int, list[bytes]] = {tasks[0]: payloads}
        else:
            by_task = {}
            for task, payload in zip(tasks, payloads, strict=True):
                group = by_task.get(task)
                if group is None:
                    by_task[task] = [payload]
                else:
                    group.append(payload)
        host = self._host
        plan = host.plan
        checkpoints = host.checkpoints
        stateful = isinstance(checkpoints, CheckpointManager)
        publish: dict[int, tuple[BatchQueue[QueueItem], list[QueueItem], list[int]]] = {}
        broadcast: list[tuple[QueueItem, int]] = []
        reroute: list[tuple[QueueItem, int]] = []
        to_log: list[tuple[int, list[bytes]]] = []
        published = from_clients = 0
        for task, group in by_task.items():
            kind = host.kind_of(task)
            if kind is None:
                if task == ACKER_TASK:
                    for payload in group:
                        self._acker_updates(payload)
                elif task == BROADCAST_TASK:
                    broadcast.extend(self._decode_bolt(task, group, atomic))
                elif task in plan.task_slot and atomic:
                    # a delivery group planned before the task moved: its tracking cannot follow
                    # the rows, so the sender retries the group with the current assignment
                    msg = f"task {task} moved to worker {plan.task_slot[task]}; resend the group there"
                    self._bad(task, WireFormatError(msg), atomic, group[0], False)
                elif task in plan.task_slot:
                    self._forward(task, group)
                else:
                    for payload in group:
                        self._unknown(task, payload)
                continue
            if plan.topology.components[plan.task_component[task]].source:
                items = self._decode_source(task, group, kind, tracker if publish_sources else None, atomic)
                if stateful:
                    to_log.append((task, group))
                if not publish_sources:
                    continue
                from_clients += sum(w for _, w in items)
            else:
                items = self._decode_bolt(task, group, atomic)
            if not items:
                continue
            queue = host.queue_of(task)
            if queue is None:  # a refresh moved the task away since kind_of(): deliver where it is now
                reroute.extend(items)
                continue
            entry = publish.get(id(queue))
            if entry is None:
                entry = publish[id(queue)] = (queue, [], [])
            for item, weight in items:
                entry[1].append(item)
                entry[2].append(weight)
                published += weight
        if to_log:  # the whole message decoded: log it before anything is queued or acked
            assert isinstance(checkpoints, CheckpointManager)  # only stateful topologies log
            try:
                checkpoints.log_group(key, to_log)
            except Exception as exc:  # the disk or the backend: nothing of it is queued, its sender retries
                if atomic:
                    msg = f"the input log refused the group: {type(exc).__name__}: {exc}"
                    raise GroupRejectedError(msg) from exc
                rows = sum(len(group) for _, group in to_log)
                self._host.data_lost(
                    f"{rows} payloads a client sent could not be logged ({type(exc).__name__}: {exc})",
                    task=to_log[0][0],
                    payloads=rows,
                )
                return 0
        if reroute:
            host.reroute([item for item, _ in reroute], [weight for _, weight in reroute])
            published += sum(weight for _, weight in reroute)
        # A paused worker's executors take nothing until its RESUME, which needs the gate this
        # thread holds: waiting for room here would hold the RESUME off for good (D11: a peer
        # resumed first and sent its replay's output). So while paused, queues take what comes
        # past their capacity; the PAUSE before emptied them, and the RESUME's executors drain it.
        wait = not (isinstance(checkpoints, CheckpointManager) and checkpoints.paused)
        for item, weight in broadcast:
            for queue in host.all_queues():
                if not self._publish(queue, [item], [weight], wait):  # its executor stopped (a refresh moved it)
                    host.data_lost(
                        f"a broadcast of {weight} tuples for a stopped executor ({queue.name})",
                        task=BROADCAST_TASK,
                        tuples=weight,
                        anchors=anchors_of(item[1]),
                    )
        for queue, items_, weights in publish.values():
            if not self._publish(queue, items_, weights, wait):  # its executor stopped (a refresh moved it)
                host.reroute(items_, weights)
        with self._lock:  # several receive threads (and the transfer thread's deliver_local) count here
            self.counters["tuples_in"] += published
            self.counters["source_tuples_in"] += from_clients
        return published

    def _publish(self, queue: BatchQueue[QueueItem], items: list[QueueItem], weights: list[int], wait: bool) -> bool:
        """Publish into an executor queue, waiting for room at most ``topology.receiver.full.wait.ms``.

        Then the items go in past the queue's capacity: this thread is the transport's I/O
        thread (push mode), which also writes the backpressure statuses and acks this worker
        sends.  Blocked for good, it would keep a stale status at a peer whose bolts, held
        back by it, in turn hold up the bolts that drain this very queue (two workers feeding
        each other deadlocked so, docs/design/threads.md row 19).  Peers stop sending to a
        backpressured task, so what goes past the capacity is what was in flight; a client
        that ignores backpressure gains one batch per wait.  Returns False if the queue is
        closed (its executor stopped).
        """
        if not wait:
            return queue.publish(items, weights, wait=False)
        if queue.publish(items, weights, timeout=self._full_wait_s):
            return True
        if queue.closed:
            return False
        self.count("admitted_past_capacity", sum(weights))
        return queue.publish(items, weights, wait=False)

    def decode_replay(self, task: int, payloads: list[bytes]) -> list[tuple[QueueItem, int]]:
        """Decode input-log payloads of source task ``task`` for a rollback's replay (untracked)."""
        host = self._host
        kind = host.kind_of(task)
        if kind is None:
            logger.error("worker %s: cannot replay input of task %d: it no longer runs here", host.slot, task)
            return []
        return self._decode_source(task, payloads, kind, None, False)

    def publish_replay(self, task: int, items: list[tuple[QueueItem, int]]) -> BatchQueue[QueueItem] | None:
        """Publish what :meth:`decode_replay` made if its queue has room now; else return that queue.

        Never waits: the replay publishes under the checkpoint gate and waits for room
        outside it, so a PAUSE is never held up by a full queue (docs/design/threads.md).
        """
        host = self._host
        batch, weights = [item for item, _ in items], [w for _, w in items]
        queue = host.queue_of(task)
        if queue is not None and not queue.publish(batch, weights, timeout=0):
            if not queue.closed:
                return queue  # full: nothing published
            queue = None
        if queue is None:  # the task moved, or its executor stopped: deliver where it is now
            host.reroute(batch, weights)
        self.count("replayed_tuples", sum(weights))
        return None

    def recv_group(self, header: BatchHeader, batch: MessageBatch, done: Callable[[int], None]) -> None:
        """Queue a delivery group's tuples and ack ACCEPTED (PROCESSED once every tree completed).

        In a stateful topology a group is logged before it is acked, so a group seen again
        (committed, or in an input log) is acked at once, and a tree that fails does not
        make the sender resend: the worker marks its state dirty and the next checkpoint
        round replays the logs (the group is processed exactly once before its epoch commits).
        """
        since = self.writers.group(header)
        checkpoints = self._host.checkpoints

        def finish(status: int) -> None:
            if status == FAILED and checkpoints.stateful and not rejected:
                checkpoints.mark_dirty("a tuple tree of a delivery group failed")
                status = header.required
            if status != ACCEPTED or header.required != PROCESSED:
                self.writers.finished(header, status, since)
            done(status)

        rejected = False
        if isinstance(checkpoints, CheckpointManager):
            inputs = checkpoints.inputs
            with inputs.gate:
                if inputs.group_seen(header.key):
                    finish(header.required)
                    return
                replaying = inputs.replaying
                tracker = GroupTracker(finish) if header.required == PROCESSED and not replaying else None
                try:
                    rows = self.transfer_local(batch.tasks, batch.payloads, tracker, atomic=True, key=header.key)
                except GroupRejectedError:
                    rejected = True
                    finish(FAILED)
                    return
                inputs.note_group(header)
            if replaying:  # logged; the replay publishes it
                self.writers.add_rows(header, rows)
                finish(header.required)
                return
        else:
            tracker = GroupTracker(finish) if header.required == PROCESSED else None
            try:
                rows = self.transfer_local(batch.tasks, batch.payloads, tracker, atomic=True)
            except GroupRejectedError:
                rejected = True
                finish(FAILED)
                return
        self.writers.add_rows(header, rows)
        finish(ACCEPTED)
        if tracker is not None:
            tracker.sealed()

    def recv_request(self, op: int, body: bytes, reply: Callable[[int, bytes], None]) -> None:
        """Answer the checkpoint coordinator (docs/design/state.md); a topology without state says so."""
        self._host.checkpoints.handle(op, body, reply)

    def pull_loop(self, server: IServer, buffer_size: int) -> None:
        """Storm 0.8's receive thread: block for a message, take up to ``buffer_size`` more."""
        while True:
            try:
                first = server.recv(0)  # blocks; close() at shutdown is Storm's "task -1" notice
                if first is None:
                    continue
                self.busy = True
                more = server.recv_batch(buffer_size - 1, 0) if buffer_size > 1 else []
            except ConnectionClosedError:
                return  # closed and drained
            try:
                self.transfer_local([first.task] + [m.task for m in more], [first.payload] + [m.payload for m in more])
            finally:
                self.busy = False

    # --- decoding ---------------------------------------------------------------------
    def _bad(self, task: int, exc: Exception, atomic: bool, payload: bytes, from_worker: bool) -> None:
        """Reject the group of a payload no decoder reads, or fail what it carried (never only a log line).

        ``from_worker``: it came from another worker's bolts (or a client using the bolt
        form), so its tuples were part of the topology already: losing them is a hole
        (:meth:`WorkerState.data_lost`).  A plain client's bad payload for a source task was
        never accepted: it is refused, counted and logged.
        """
        self.count("bad_payload")
        if atomic:
            logger.error("worker %s: rejecting a whole group: bad payload for task %d: %s", self._host.slot, task, exc)
            raise GroupRejectedError(str(exc)) from exc
        if from_worker:
            self._host.data_lost(
                f"a payload of {len(payload)} bytes for task {task} could not be decoded ({exc})",
                task=task,
                payloads=1,
                anchors=salvage_anchors(self._host.serializer, payload),
            )
            return
        logger.warning("worker %s: refusing a bad payload a client sent to task %d: %s", self._host.slot, task, exc)

    def _decode_source(
        self, task: int, payloads: list[bytes], kind: str, tracker: GroupTracker | None, atomic: bool
    ) -> list[tuple[QueueItem, int]]:
        """Payloads a client sent to source task ``task``; with a tracker each tuple (batch) roots a tree."""
        items = self._sources.decode(
            payloads,
            self._host.client_source(task),
            kind == "batch",
            lambda exc, payload: self._bad(task, exc, atomic, payload, False),
        )
        if tracker is not None:
            acker, worker_id = self._host.acker, self._host.worker_id
            for payload, _weight in items:
                if isinstance(payload, ColumnarBatch):  # the whole batch is one root: one edge, acked at once
                    tracker.expect(1)
                    root, edge = acker.root(tracker)
                    payload.anchors = [(worker_id, root, edge)]
                    continue
                assert isinstance(payload, list)  # a source decoder makes tuples or batches, never barriers
                tracker.expect(len(payload))
                for tup in payload:  # each source tuple roots a tuple tree (Storm's acker)
                    root, edge = acker.root(tracker)
                    tup.anchors = [(worker_id, root, edge)]
        return [((task, payload), weight) for payload, weight in items]

    def _fail_stale(self, dropped: list[Tuple] | ColumnarBatch) -> None:
        """Fail the trees of tuples a rollback voided (a restarted peer still at an older generation).

        Their senders' delivery groups end at once, as FAILED trees: a stateful worker then
        acks the group and marks itself dirty, so the next round rolls everyone back and
        replays the logs, instead of waiting for the message timeout.
        """
        host = self._host

        def sink(worker: int, op: list[Any]) -> None:
            host.acker_ops(worker, [op])

        for item in dropped if isinstance(dropped, list) else [dropped]:
            if item.anchors:
                fail_ops(item, sink)

    def _decode_bolt(self, task: int, payloads: list[bytes], atomic: bool) -> list[tuple[QueueItem, int]]:
        """Payloads from bolts (or clients using the bolt form) for task ``task``."""
        items = self._bolts.decode(payloads, lambda exc, payload: self._bad(task, exc, atomic, payload, True))
        return [((task, payload), weight) for payload, weight in items]

    # --- acker, forwarding, unknown tasks ---------------------------------------------
    def _acker_updates(self, payload: bytes) -> None:
        """Apply another worker's acker updates; any that cannot be read is a failure, not a log line.

        The well-formed ops of a payload are applied; a payload (or op) that cannot be read
        leaves trees that would never complete, so it counts as lost (:meth:`WorkerState.data_lost`):
        a stateful worker rolls back and replays at the next round, and a stateless one's
        trees fail at ``topology.message.timeout.secs``.
        """
        checked: list[list[Any]] = []
        error: str | None = None
        try:
            ops = self._host.serializer.loads(payload)
            if type(ops) is not list:
                msg = f"acker updates are an array of ops, got {type(ops).__name__}"
                raise ValueError(msg)
        except (WireFormatError, ValueError) as exc:
            ops, error = [], str(exc)
        bad_ops = 0
        for op in ops:
            try:
                if type(op) is not list or len(op) not in (3, 4):
                    msg = "an acker update is [op, root, value] or [op, root, value, [workers touched]]"
                    raise ValueError(msg)
                entry: list[Any] = [int(op[0]), int(op[1]), int(op[2])]
                if len(op) == 4:
                    entry.append([int(w) for w in op[3]])
            except (ValueError, TypeError) as exc:
                bad_ops += 1
                error = error or str(exc)
                continue
            checked.append(entry)
        if checked:
            self._host.acker_ops(self._host.worker_id, checked)
        if error is not None:
            self.count("bad_acker_updates")
            what = f"{bad_ops} of {len(ops)} ops" if bad_ops else f"a payload of {len(payload)} bytes"
            self._host.data_lost(f"acker updates could not be read ({what}: {error})", task=ACKER_TASK, payloads=1)

    def _forward(self, task: int, payloads: list[bytes]) -> None:
        with self._lock:
            self.counters["forwarded"] += len(payloads)
        self._host.forward([TaskMessage(task, p) for p in payloads])

    def _unknown(self, task: int, payload: bytes) -> None:
        with self._lock:
            self.counters["unknown_task"] += 1
            count = self.counters["unknown_task"]
            now = time.monotonic()
            should_log = now - self._last_unknown_log >= 1.0
            if should_log:
                self._last_unknown_log = now
            if self._dead_letter_path:
                record = {"ts": time.time(), "worker": str(self._host.slot), "task": task, "payload_hex": payload.hex()}
                try:
                    with open(self._dead_letter_path, "a", encoding="utf-8") as f:
                        f.write(json.dumps(record) + "\n")
                    self.counters["dead_lettered"] += 1
                except OSError as exc:
                    logger.error(
                        "worker %s: cannot write dead letter to %s: %s", self._host.slot, self._dead_letter_path, exc
                    )
        if should_log:
            where = f"written to {self._dead_letter_path}" if self._dead_letter_path else "dropped"
            logger.warning(
                "worker %s: message for task %d, which this worker does not run (nor does any other), %s (%d so far)",
                self._host.slot,
                task,
                where,
                count,
            )

    def unknown(self, messages: list[TaskMessage]) -> None:
        """Messages the transfer path found no worker for."""
        for m in messages:
            self._unknown(m.task, m.payload)


class DeserializingConnectionCallback(IConnectionCallback):
    """Storm 2.x's DeserializingConnectionCallback: the server's push receive into the worker."""

    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver

    def recv(self, batch: MessageBatch) -> None:
        self._receiver.transfer_local(batch.tasks, batch.payloads)

    def recv_group(self, header: BatchHeader, batch: MessageBatch, done: Callable[[int], None]) -> None:
        self._receiver.recv_group(header, batch, done)

    def recv_request(self, op: int, body: bytes, reply: Callable[[int, bytes], None]) -> None:
        self._receiver.recv_request(op, body, reply)
