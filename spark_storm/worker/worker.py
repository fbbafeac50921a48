"""The worker process: WorkerState, receive path, transfer path and lifecycle.

One worker runs the executors the plan assigns to its slot (``host:port``):

* **receive** — push (Storm 2.x): the server callback deserializes each message into an
  ``AddressedTuple`` and ``transfer_local`` publishes each executor's share in one call;
  pull (Storm 0.8): a receive thread blocks for a message, takes up to
  ``topology.receiver.buffer.size`` more without blocking, and hands them over the same
  way.  Unknown task ids are counted, logged and dropped (or dead-lettered).
* **transfer** — emits for local tasks go straight to their executor queue; the rest
  go to the bounded transfer queue, whose thread groups a batch by destination worker
  and calls ``send`` once per destination, holding (never dropping) messages for tasks
  the destination reports as backpressured.
* **lifecycle** — connections to the other workers are made first, executors activate
  when all are ready, a timer writes heartbeats and sends load metrics, and ``stop``
  runs the ordered shutdown under one deadline.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from spark_storm.config import Config
from spark_storm.errors import ConfigError, ConnectionClosedError, StormError, WireFormatError
from spark_storm.messaging import (
    BackpressureStatus,
    IConnection,
    IConnectionCallback,
    IContext,
    MessageBatch,
    TaskMessage,
)
from spark_storm.messaging.wire import ACCEPTED, FAILED, PROCESSED, BatchHeader
from spark_storm.topology.assignment import ExecutorSpec, Plan, Slot
from spark_storm.topology.model import DEFAULT_STREAM
from spark_storm.transport import make_context
from spark_storm.worker.acker import ACKER_TASK, Acker
from spark_storm.worker.executor import ACK_OP, EmitBuffer, Executor, vars_of
from spark_storm.worker.payloads import ARROW_STREAM_MAGIC, arrow_rows
from spark_storm.worker.queue import RingQueue
from spark_storm.worker.serializer import make_serializer
from spark_storm.worker.tuples import BROADCAST_TASK, AddressedTuple, GroupTracker, Tuple

__all__ = ["CLIENT_COMPONENT", "Worker"]

logger = logging.getLogger(__name__)
_new = tuple.__new__

#: ``source_component`` of tuples that external clients (Spark) send to source tasks.
CLIENT_COMPONENT = "__client"


class GroupRejected(StormError):
    """A delivery group held a payload the worker cannot decode; nothing of it was queued."""


class _DeserializingCallback(IConnectionCallback):
    """Storm 2.x's DeserializingConnectionCallback: bytes -> AddressedTuple -> executor queues."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def recv(self, batch: MessageBatch) -> None:
        self._worker.transfer_local(batch.tasks, batch.payloads)

    def recv_group(self, header: BatchHeader, batch: MessageBatch, done: Callable[[int], None]) -> None:
        self._worker.recv_group(header, batch, done)


class Worker:
    """One worker: the state, threads and connections of a slot of a topology.

    Parameters
    ----------
    plan : Plan
        The topology's assignment (the same on every worker and on the Spark side).
    slot : Slot
        Which slot this worker is.
    conf : Config
        Messaging and ``topology.*`` configuration.
    """

    def __init__(self, plan: Plan, slot: Slot, conf: Config) -> None:
        if slot not in plan.slots:
            msg = f"worker {slot} is not one of the plan's slots ({', '.join(map(str, plan.slots))})"
            raise ConfigError(msg)
        self.plan = plan
        self.slot = slot
        self.conf = conf.with_overrides(plan.topology.conf) if plan.topology.conf else conf
        self.topology_id = plan.topology.name
        self.serializer = make_serializer(self.conf)
        self.local_tasks = frozenset(plan.tasks_of(slot))
        self.slot_index = plan.slots.index(slot)
        self.acker = Acker()
        self._lock = threading.RLock()
        self._bp_tasks: set[int] = set()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self.stop_reason: str | None = None
        self.failed = False
        self.counters = {
            "unknown_task": 0,
            "bad_payload": 0,
            "dead_lettered": 0,
            "source_tuples_in": 0,
            "received": 0,
            "tuples_in": 0,
        }
        capacity = self.conf.get_int("topology.executor.receive.buffer.size", minimum=1)
        high = float(self.conf["topology.backpressure.high.watermark"])
        low = float(self.conf["topology.backpressure.low.watermark"])
        if not 0 < low < high <= 1:
            msg = f"backpressure watermarks need 0 < low < high <= 1, got low={low} high={high}"
            raise ConfigError(msg)
        self.executors: dict[ExecutorSpec, Executor] = {}
        self.task_queue: dict[int, RingQueue[AddressedTuple]] = {}
        for spec in plan.executors_of(slot):
            queue: RingQueue[AddressedTuple] = RingQueue(
                capacity,
                f"{spec}",
                high,
                low,
                on_high=functools.partial(self._backpressure, spec, True),
                on_low=functools.partial(self._backpressure, spec, False),
            )
            self.executors[spec] = Executor(self, spec, queue)
            for t in spec.tasks:
                self.task_queue[t] = queue
        self.transfer_queue: RingQueue[TaskMessage] = RingQueue(
            self.conf.get_int("topology.transfer.buffer.size", minimum=1), "transfer"
        )
        self._transfer_batch = self.conf.get_int("topology.transfer.batch.size", minimum=1)
        self._hold_max = self.conf.get_int("topology.backpressure.hold.max.size", minimum=1)
        self._held: list[TaskMessage] = []
        self._dead_letter_path = self.conf.get_optional_str("topology.worker.dead.letter.file")
        self._last_unknown_log = 0.0
        self.context: IContext = make_context(self.conf)
        self.server: IConnection | None = None
        self.connections: dict[Slot, IConnection] = {}
        self._threads: list[threading.Thread] = []
        self.metrics_port: int | None = None
        self._http: Any = None
        hb_dir = self.conf.get_optional_str("worker.heartbeat.dir") or tempfile.gettempdir()
        self.heartbeat_path = Path(hb_dir) / f"{self.topology_id}-{slot.port}.json"
        self.started_at = time.time()
        self._quiet_s = self.conf.get_int("topology.worker.shutdown.quiet.ms", minimum=0) / 1000
        self._pull_thread: threading.Thread | None = None
        self._pull_busy = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Bind, connect, start threads; executors activate once connections are ready."""
        mode = self.conf.get_choice("topology.receiver.mode", ("push", "pull"))
        if mode == "push":
            self.server = self.context.bind(self.topology_id, self.slot.port, _DeserializingCallback(self))
        else:
            self.server = self.context.bind(self.topology_id, self.slot.port)
            self._pull_thread = self._spawn(self._pull_loop, "receive")
        logger.info(
            "worker %s of %s listening (%s receive); tasks %s",
            self.slot,
            self.topology_id,
            mode,
            sorted(self.local_tasks),
        )
        for executor in self.executors.values():
            executor.start()
        self.connections = self._connect_all(self.plan)
        self._spawn(self._transfer_loop, "transfer")
        self._spawn(self._timer_loop, "timer")
        self._start_metrics_http()
        self._spawn(self._activate_when_ready, "activate")

    def _spawn(self, target: Any, name: str) -> threading.Thread:
        t = threading.Thread(target=target, name=f"spark-storm-{name}-{self.slot.port}", daemon=True)
        t.start()
        self._threads.append(t)
        return t

    def _connect_all(self, plan: Plan) -> dict[Slot, IConnection]:
        conns = {}
        for slot in plan.slots:
            if slot != self.slot and any(plan.task_slot[t] == slot for t in plan.task_slot):
                conns[slot] = self.context.connect(self.topology_id, slot.host, slot.port)
        return conns

    def _activate_when_ready(self) -> None:
        timeout = self.conf.get_int("topology.worker.connections.ready.timeout.ms", minimum=0) / 1000
        deadline = time.monotonic() + timeout
        for slot, conn in list(self.connections.items()):
            remaining = max(0.0, deadline - time.monotonic())
            if not conn.wait_ready(remaining) and not self._stopping.is_set():
                logger.warning(
                    "worker %s: connection to %s not ready after %.0fs; activating anyway",
                    self.slot,
                    slot,
                    timeout,
                )
        if not self._stopping.is_set():
            self.activate()

    def activate(self) -> None:
        """Let executors consume (Storm's activate)."""
        for executor in self.executors.values():
            executor.active.set()
        logger.info("worker %s: executors active", self.slot)

    def deactivate(self) -> None:
        """Pause executors; their queues fill and hold back senders (Storm's deactivate)."""
        for executor in self.executors.values():
            executor.active.clear()
        logger.info("worker %s: executors deactivated", self.slot)

    @property
    def active(self) -> bool:
        return all(e.active.is_set() for e in self.executors.values())

    def refresh_connections(self, plan: Plan) -> None:
        """Switch to a new assignment: new connections first, then an atomic swap, then close the old."""
        if self.slot not in plan.slots:
            msg = f"new assignment does not include this worker's slot {self.slot}"
            raise ConfigError(msg)
        wanted = {s for s in plan.slots if s != self.slot}
        with self._lock:
            current = dict(self.connections)
        fresh = {s: self.context.connect(self.topology_id, s.host, s.port) for s in wanted - set(current)}
        timeout = self.conf.get_int("topology.worker.connections.ready.timeout.ms", minimum=0) / 1000
        for s, conn in fresh.items():
            if not conn.wait_ready(timeout):
                logger.warning("worker %s: new connection to %s not ready yet; swapping anyway", self.slot, s)
        merged = {s: c for s, c in current.items() if s in wanted} | fresh
        with self._lock:
            self.plan = _replan(self.plan, plan, self.slot)
            self.connections = merged
        for s, conn in current.items():
            if s not in wanted:
                conn.close()
        logger.info("worker %s: connections refreshed: %s", self.slot, ", ".join(map(str, sorted(merged))))

    def request_stop(self, reason: str, *, failure: bool = True) -> None:
        """Ask for an ordered shutdown (from any thread: a failing bolt, a signal)."""
        if not self._stopping.is_set():
            self.stop_reason = reason
            self.failed = failure
            log = logger.error if failure else logger.info
            log("worker %s: stopping: %s", self.slot, reason)
            self._stopping.set()

    @property
    def stopping(self) -> threading.Event:
        return self._stopping

    def stop(self, timeout: float | None = None) -> bool:
        """Ordered shutdown under one deadline; returns False if the deadline cut it short.

        1. drain with the server still open until the worker is quiet: queues empty,
           transfer queue empty, every outbound message acknowledged, and nothing new
           arrived for ``topology.worker.shutdown.quiet.ms`` (so the workers of a topology
           that stop together still deliver what they send each other);
        2. stop accepting (close the server: unacknowledged client data stays with the
           clients, who resend it to the restarted worker);
        3. drain what is left through the bolts, stop the executors (bolt ``cleanup``);
        4. flush the transfer queue and the connections, then ``term()`` the context.
        """
        if self._stopped.is_set():
            return True
        self._stopping.set()
        if timeout is None:
            timeout = self.conf.get_int("topology.worker.shutdown.timeout.ms", minimum=0) / 1000
        deadline = time.monotonic() + timeout
        if not self.active:
            self.activate()  # a deactivated worker still drains what it accepted
        clean = self._wait_quiet(deadline, self._quiet_s)
        if self.server is not None:
            self.server.close()
        if self._pull_thread is not None:
            self._pull_thread.join(max(0.0, deadline - time.monotonic()))
        clean &= self._wait_quiet(deadline, 0.0)
        for executor in self.executors.values():
            executor.stop()
        for executor in self.executors.values():
            executor.join(max(0.0, deadline - time.monotonic()))
            clean &= not executor.alive
        self.transfer_queue.close()
        for t in self._threads:
            t.join(max(0.0, min(5.0, deadline - time.monotonic())))
        for conn in list(self.connections.values()):
            clean &= conn.flush(max(0.0, deadline - time.monotonic()))
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        self.context.term()
        self._write_heartbeat("stopped")
        self._stopped.set()
        if not clean:
            logger.error("worker %s: shutdown deadline of %.1fs passed before everything drained", self.slot, timeout)
        logger.info("worker %s stopped", self.slot)
        return clean

    def _idle(self) -> bool:
        server = self.server
        return (
            not self._pull_busy
            and (server is None or server.metrics().get("pending", 0) == 0)
            and all(len(e.queue) == 0 and not e.busy for e in self.executors.values())
            and len(self.transfer_queue) == 0
            and not self._held
            and all(c.metrics().get("pending", 0) == 0 for c in list(self.connections.values()))
        )

    def _wait_quiet(self, deadline: float, quiet_s: float) -> bool:
        """Wait until idle with no new arrivals for ``quiet_s`` (and at least 3 checks)."""
        calm_since: float | None = None
        checks = 0
        seen = self.counters["received"]
        while time.monotonic() < deadline:
            now = time.monotonic()
            arrived = self.counters["received"] != seen
            seen = self.counters["received"]
            if self._idle() and not arrived:
                calm_since = calm_since if calm_since is not None else now
                checks += 1
                if checks >= 3 and now - calm_since >= quiet_s:
                    return True
            else:
                calm_since, checks = None, 0
            time.sleep(0.01)
        return False

    # ------------------------------------------------------------------ receive path
    def transfer_local(
        self,
        tasks: list[int],
        payloads: list[bytes],
        tracker: GroupTracker | None = None,
        atomic: bool = False,
    ) -> int:
        """Deserialize messages and publish each executor's share with one ``publish``.

        Returns how many tuples were published (an Arrow payload to a source task carries
        many rows); with a ``tracker``, every source tuple reports its ack/fail to it.
        ``atomic`` (delivery groups): a bad payload rejects the whole group before anything
        is queued (:class:`GroupRejected`); otherwise it is dropped, counted and logged.
        """
        by_queue: dict[int, tuple[RingQueue[AddressedTuple], list[AddressedTuple]]] = {}
        queue_of = self.task_queue
        published = 0
        from_clients = 0
        with self._lock:
            self.counters["received"] += len(tasks)
        decoded: list[tuple[int, list[Tuple]]] = []
        for task, payload in zip(tasks, payloads, strict=True):
            if task == ACKER_TASK:
                self._apply_acker_ops(payload)
                continue
            if task not in queue_of and task != BROADCAST_TASK:
                self._unknown(task, payload)
                continue
            try:
                decoded.append((task, self._decode(task, payload, tracker)))
            except (WireFormatError, ValueError, TypeError, KeyError) as exc:
                with self._lock:
                    self.counters["bad_payload"] += 1
                if atomic:
                    logger.error(
                        "worker %s: rejecting a whole group: bad payload for task %d: %s",
                        self.slot,
                        task,
                        exc,
                    )
                    raise GroupRejected(str(exc)) from exc
                logger.warning("worker %s: dropping a bad payload for task %d: %s", self.slot, task, exc)
        for task, tuples in decoded:
            queue = queue_of.get(task)
            if task == BROADCAST_TASK:
                for q in {id(q): q for q in queue_of.values()}.values():
                    q.publish([AddressedTuple(BROADCAST_TASK, t) for t in tuples])
                continue
            assert queue is not None
            entry = by_queue.get(id(queue))
            if entry is None:
                entry = by_queue[id(queue)] = (queue, [])
            # tuple.__new__ skips the NamedTuple's Python-level __new__: this runs per row
            entry[1].extend([_new(AddressedTuple, (task, t)) for t in tuples])
            published += len(tuples)
            if tuples and tuples[0].source_component == CLIENT_COMPONENT:
                from_clients += len(tuples)
        for q, items in by_queue.values():
            q.publish(items)
        with self._lock:
            self.counters["tuples_in"] += published
            self.counters["source_tuples_in"] += from_clients
        return published

    def _decode(self, task: int, payload: bytes, tracker: GroupTracker | None) -> list[Tuple]:
        if task == BROADCAST_TASK:
            return [self._bolt_tuple(self.serializer.loads(payload))]
        comp = self.plan.topology.components[self.plan.task_component[task]]
        if not comp.source:
            return [self._bolt_tuple(self.serializer.loads(payload))]
        fields = comp.fields_of(DEFAULT_STREAM)
        if payload[:4] == ARROW_STREAM_MAGIC:
            rows = arrow_rows(payload, fields)
        else:
            values = self.serializer.loads(payload)
            if not isinstance(values, list):
                msg = f"a source tuple must be an array of values, got {type(values).__name__}"
                raise WireFormatError(msg)
            rows = [values]
        out = [Tuple(r, fields, CLIENT_COMPONENT, -1, DEFAULT_STREAM) for r in rows]
        if tracker is not None:
            tracker.expect(len(out))
            for t in out:  # each source tuple roots a tuple tree (Storm's acker)
                root, edge = self.acker.root(tracker)
                t.anchors = [(self.slot_index, root, edge)]
        return out

    def recv_group(self, header: BatchHeader, batch: MessageBatch, done: Callable[[int], None]) -> None:
        """Queue a delivery group's tuples and ack ACCEPTED (PROCESSED once the entry bolts acked all)."""
        tracker = GroupTracker(done) if header.required == PROCESSED else None
        try:
            self.transfer_local(batch.tasks, batch.payloads, tracker, atomic=True)
        except GroupRejected:
            done(FAILED)
            return
        done(ACCEPTED)
        if tracker is not None:
            tracker.sealed()

    def _bolt_tuple(self, decoded: Any) -> Tuple:
        if len(decoded) == 4:  # anchored in tuple trees: [src, stream, values, [[slot, root, edge], ...]]
            src_task, stream, values, anchors = decoded
            tup = self._bolt_tuple([src_task, stream, values])
            tup.anchors = [(int(s), int(r), int(e)) for s, r, e in anchors]
            return tup
        src_task, stream, values = decoded
        src_comp = self.plan.task_component.get(src_task, CLIENT_COMPONENT)
        fields = (
            self.plan.topology.components[src_comp].fields_of(stream)
            if src_comp in self.plan.topology.components
            else ()
        )
        return Tuple(list(values), fields, src_comp, int(src_task), str(stream))

    def _unknown(self, task: int, payload: bytes) -> None:
        with self._lock:
            self.counters["unknown_task"] += 1
            count = self.counters["unknown_task"]
            now = time.monotonic()
            should_log = now - self._last_unknown_log >= 1.0
            if should_log:
                self._last_unknown_log = now
            if self._dead_letter_path:
                record = {
                    "ts": time.time(),
                    "worker": str(self.slot),
                    "task": task,
                    "payload_hex": payload.hex(),
                }
                with open(self._dead_letter_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
                self.counters["dead_lettered"] += 1
        if should_log:
            where = f"written to {self._dead_letter_path}" if self._dead_letter_path else "dropped"
            logger.warning(
                "worker %s: message for task %d, which this worker does not run, %s (%d such so far)",
                self.slot,
                task,
                where,
                count,
            )

    def _pull_loop(self) -> None:
        server = self.server
        assert server is not None
        size = self.conf.get_int("topology.receiver.buffer.size", minimum=1)
        recv_batch = getattr(server, "recv_batch", None)
        while True:
            try:
                first = server.recv(0)  # blocks; close() at shutdown is Storm's "task -1" notice
                if first is None:
                    continue
                self._pull_busy = True
                more = recv_batch(size - 1, 0) if recv_batch is not None else []
            except ConnectionClosedError:
                return  # closed and drained
            try:
                tasks = [first.task] + [m.task for m in more]
                payloads = [first.payload] + [m.payload for m in more]
                self.transfer_local(tasks, payloads)
            finally:
                self._pull_busy = False

    # ------------------------------------------------------------------ transfer path
    def acker_ops(self, slot_index: int, ops: list[list[int]]) -> None:
        """Apply acker updates to the worker at ``slot_index`` (this one, or over its connection)."""
        if slot_index == self.slot_index:
            for kind, root, value in ops:
                if kind == ACK_OP:
                    self.acker.update(root, value)
                else:
                    self.acker.fail(root)
            return
        slot = self.plan.slots[slot_index]
        conn = self.connections.get(slot)
        if conn is None:
            logger.error("worker %s: no connection to %s for %d acker updates", self.slot, slot, len(ops))
            return
        conn.send([TaskMessage(ACKER_TASK, self.serializer.dumps(ops))])

    def _apply_acker_ops(self, payload: bytes) -> None:
        try:
            ops = self.serializer.loads(payload)
            self.acker_ops(self.slot_index, [[int(k), int(r), int(v)] for k, r, v in ops])
        except (WireFormatError, ValueError, TypeError) as exc:
            with self._lock:
                self.counters["bad_payload"] += 1
            logger.warning("worker %s: dropping bad acker updates: %s", self.slot, exc)

    def transfer(self, component: str, src_task: int, stream: str, values: list[Any], targets: list[int]) -> None:
        """Send an emitted tuple to ``targets`` now (local ones straight to their queue)."""
        buffer = EmitBuffer(self)
        buffer.add(component, src_task, stream, values, targets)
        buffer.flush()

    def _transfer_loop(self) -> None:
        retry_at = 0.0
        while True:
            if self._held and time.monotonic() >= retry_at:
                # Retry held messages on a short interval, not on every pass: while the
                # destination stays backpressured, re-checking each pass would only spin.
                self._release_held()
                retry_at = time.monotonic() + 0.002
            if len(self._held) >= self._hold_max:
                time.sleep(0.002)  # every destination is backpressured: stop taking, hold the emitters
                continue
            if not self.transfer_queue.wait_for_items(0.05):
                if self.transfer_queue._closed and not self._held:
                    return
                continue
            batch: list[TaskMessage] = []
            self.transfer_queue.consume_batch(functools.partial(_collect, batch), self._transfer_batch)
            self._send_grouped(batch)

    def _send_grouped(self, batch: list[TaskMessage]) -> None:
        by_slot: dict[Slot, list[TaskMessage]] = {}
        task_slot = self.plan.task_slot
        for m in batch:
            slot = task_slot.get(m.task)
            if slot is None:
                self._unknown(m.task, m.payload)
                continue
            by_slot.setdefault(slot, []).append(m)
        for slot, msgs in by_slot.items():
            conn = self.connections.get(slot)
            if conn is None:
                logger.error("worker %s: no connection to %s; holding %d messages", self.slot, slot, len(msgs))
                self._held.extend(msgs)
                continue
            bp = conn.backpressure_tasks()
            if bp:
                ready = [m for m in msgs if m.task not in bp]
                self._held.extend(m for m in msgs if m.task in bp)
                msgs = ready
            if msgs:
                try:
                    conn.send(msgs)
                except StormError as exc:
                    logger.error(
                        "worker %s: send to %s failed (%s); holding %d messages",
                        self.slot,
                        slot,
                        exc,
                        len(msgs),
                    )
                    self._held.extend(msgs)

    def _release_held(self) -> None:
        held, self._held = self._held, []
        self._send_grouped(held)

    # ------------------------------------------------------------------ backpressure, load
    def _backpressure(self, spec: ExecutorSpec, on: bool) -> None:
        tasks = frozenset(spec.tasks)
        with self._lock:
            if on:
                self._bp_tasks |= tasks
            else:
                self._bp_tasks -= tasks
        status = BackpressureStatus(str(self.slot), tasks if on else frozenset(), frozenset() if on else tasks)
        server = self.server
        if server is not None:
            try:
                server.send_backpressure_status(status)
            except ConnectionClosedError:
                return
        logger.debug("worker %s: backpressure %s for %s", self.slot, "on" if on else "off", spec)

    def task_loads(self) -> dict[int, float]:
        """Load of every local task: its executor queue's fill (0..1)."""
        return {t: len(q) / q.capacity for t, q in self.task_queue.items()}

    def get_load(self, tasks: Iterable[int]) -> Mapping[int, float]:
        """Load of ``tasks`` (local from queues, remote from what their workers report)."""
        tasks = list(tasks)
        out = {t: len(self.task_queue[t]) / self.task_queue[t].capacity for t in tasks if t in self.task_queue}
        for slot, conn in self.connections.items():
            remote = [t for t in tasks if self.plan.task_slot.get(t) == slot]
            if remote:
                out.update(conn.get_load(remote))
        return out

    # ------------------------------------------------------------------ timer: heartbeat + load
    def _timer_loop(self) -> None:
        hb_every = self.conf.get_int("worker.heartbeat.frequency.secs", minimum=1)
        load_every = self.conf.get_int("topology.load.metrics.interval.ms", minimum=1) / 1000
        next_hb = next_load = time.monotonic()
        while not self._stopping.is_set():
            now = time.monotonic()
            if now >= next_hb:
                self._write_heartbeat("running" if self.active else "inactive")
                next_hb = now + hb_every
            if now >= next_load:
                server = self.server
                if server is not None:
                    try:
                        server.send_load_metrics(self.task_loads())
                    except ConnectionClosedError:
                        return
                next_load = now + load_every
            self._stopping.wait(max(0.0, min(next_hb, next_load) - time.monotonic()))

    def _write_heartbeat(self, status: str) -> None:
        record = {
            "topology": self.topology_id,
            "worker": str(self.slot),
            "pid": os.getpid(),
            "status": status,
            "time": time.time(),
            "uptime_s": round(time.time() - self.started_at, 3),
            "executors": [str(e) for e in self.executors],
            "received": self.counters["received"],
            "metrics_port": self.metrics_port,
        }
        tmp = self.heartbeat_path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(record), encoding="utf-8")
            tmp.replace(self.heartbeat_path)
        except OSError as exc:
            logger.warning("worker %s: cannot write heartbeat %s: %s", self.slot, self.heartbeat_path, exc)

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict[str, Any]:
        """Everything countable: worker counters, connections, queues, bolts."""
        with self._lock:
            counters = dict(self.counters)
            bp = sorted(self._bp_tasks)
        return {
            "worker": str(self.slot),
            "topology": self.topology_id,
            "active": self.active,
            "counters": counters,
            "backpressure_tasks": bp,
            "acker": {"pending": len(self.acker), "completed": self.acker.completed, "failed": self.acker.failed},
            "held": len(self._held),
            "server": self.server.metrics() if self.server is not None else {},
            "connections": {str(s): c.metrics() for s, c in self.connections.items()},
            "transfer_queue": self.transfer_queue.metrics(),
            "executors": {
                str(spec): {
                    "component": spec.component,
                    "queue": e.queue.metrics(),
                    "tasks": {t: vars_of(st) for t, st in e.stats.items()},
                }
                for spec, e in self.executors.items()
            },
        }

    def _start_metrics_http(self) -> None:
        port = self.conf.get_int("topology.worker.metrics.port", minimum=-1)
        if port < 0:
            return
        from spark_storm.worker.http import start_metrics_server

        self._http, self.metrics_port = start_metrics_server(
            self, self.conf.get_str("topology.worker.metrics.host"), port
        )
        logger.info(
            "worker %s: metrics on http://%s:%d/metrics",
            self.slot,
            self.conf.get_str("topology.worker.metrics.host"),
            self.metrics_port,
        )


def _collect(into: list[TaskMessage], message: TaskMessage, end_of_batch: bool) -> None:
    into.append(message)


def _replan(old: Plan, new: Plan, slot: Slot) -> Plan:
    if old.topology.name != new.topology.name:
        msg = f"cannot refresh {old.topology.name!r} with a plan for {new.topology.name!r}"
        raise ConfigError(msg)
    if old.executors != new.executors or old.executors_of(slot) != new.executors_of(slot):
        msg = (
            "a refresh may move other workers' executors between slots, but not change the "
            f"executors or those of this worker ({slot}); restart the worker for that"
        )
        raise ConfigError(msg)
    return new
