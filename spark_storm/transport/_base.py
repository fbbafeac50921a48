"""What every transport's server and client share.

The pull queue, callback registration, the delivery ledger, load tables and counters
(servers); acks, loads and backpressure status heard from the server (clients).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Self, TypeVar

from spark_storm.backoff import backoff_from_conf
from spark_storm.config import (
    STORM_LEDGER_MAX,
    STORM_LEDGER_MAX_BYTES,
    STORM_LEDGER_REDELIVER_MS,
    STORM_SERVER_RECEIVE_QUEUE_SIZE,
    Config,
)
from spark_storm.errors import (
    ConnectionBrokenError,
    ConnectionClosedError,
    RequestTimeoutError,
    TransportError,
    UnsupportedOperationError,
)
from spark_storm.messaging.api import (
    RECV_BLOCK,
    RECV_NOBLOCK,
    REQUEST_FAILED,
    REQUEST_UNHANDLED,
    CallbackLike,
    GroupKey,
    IClient,
    IConnection,
    IConnectionCallback,
    IContext,
    IServer,
    as_callback,
)
from spark_storm.messaging.message import BackpressureStatus, ConnectionStatus, MessageBatch, TaskMessage
from spark_storm.messaging.wire import ACCEPTED, FAILED, BatchAck, BatchHeader, ControlReply, ControlRequest
from spark_storm.transport._ledger import DeliveryLedger, Reply

__all__ = ["ClientBase", "ServerBase", "TrackingContext", "as_batch"]

logger = logging.getLogger(__name__)

_MAX_UNCLAIMED_ACKS = 100_000
_C = TypeVar("_C", bound=IConnection)


def as_batch(messages: TaskMessage | Iterable[TaskMessage]) -> list[TaskMessage]:
    """Normalise ``send``'s argument (one message or an iterable) to a list."""
    if isinstance(messages, TaskMessage):
        return [messages]
    if isinstance(messages, tuple) and len(messages) == 2 and isinstance(messages[0], int):
        return [TaskMessage(messages[0], messages[1])]
    return messages if isinstance(messages, list) else list(messages)


class ServerBase(IServer):
    """Server-side behaviour common to every transport.

    The transport's receive thread calls :meth:`deliver`; this class routes batches to
    the registered callback (push) or to a bounded queue for :meth:`recv` (pull).
    """

    def __init__(self, conf: Config, topology_id: str, callback: CallbackLike | None) -> None:
        self.topology_id = topology_id
        self._capacity = conf.get_int(STORM_SERVER_RECEIVE_QUEUE_SIZE, minimum=1)
        self._cond = threading.Condition()
        self._queue: deque[TaskMessage] = deque()
        self._callback = as_callback(callback) if callback is not None else None
        self._closed = False
        self._peer_loads: dict[int, float] = {}
        self.ledger = DeliveryLedger(
            conf.get_int(STORM_LEDGER_MAX, minimum=1),
            conf.get_int(STORM_LEDGER_REDELIVER_MS, minimum=0) / 1000,
            conf.get_int(STORM_LEDGER_MAX_BYTES, minimum=1024),
        )
        self._counters: dict[str, int] = {
            "received": 0,
            "duplicates": 0,
            "callback_errors": 0,
            "protocol_errors": 0,
            "auth_failures": 0,
            "accepted": 0,
        }

    # --- called by the transport ------------------------------------------------------
    def deliver(self, batch: MessageBatch) -> None:
        """Hand one batch to the callback, or queue it for ``recv`` (blocking while full)."""
        if not batch:
            return
        with self._cond:
            self._counters["received"] += len(batch)
            callback = self._callback
            if callback is None:
                self._enqueue(batch)
                return
        self._call(callback, batch)

    def _enqueue(self, batch: MessageBatch) -> None:
        # Caller holds self._cond.  Blocks the receive thread while the queue is full:
        # the sender is held back (TCP flow control), nothing is dropped.
        pos = 0
        while pos < len(batch):
            while len(self._queue) >= self._capacity and self._callback is None and not self._closed:
                self._cond.wait()
            if self._closed:
                return
            if self._callback is not None:
                rest = batch[pos:]
                self._cond.release()
                try:
                    self._call(self._callback, rest)
                finally:
                    self._cond.acquire()
                return
            room = self._capacity - len(self._queue)
            self._queue.extend(batch[pos : pos + room])
            pos += room
            self._cond.notify_all()

    def _call(self, callback: IConnectionCallback, batch: MessageBatch) -> None:
        try:
            callback.recv(batch)
        except Exception as exc:
            with self._cond:
                self._counters["callback_errors"] += 1
            logger.exception(
                "receive callback %r raised %r on a batch of %d messages (%s); the batch counts as delivered",
                callback,
                exc,
                len(batch),
                self.describe(),
            )

    def deliver_group(self, header: BatchHeader, batch: MessageBatch, reply: Reply) -> None:
        """Deliver one delivery-protocol group, unless the ledger says it is a replay."""
        if not self.ledger.begin(header, reply):
            return

        def done(status: int) -> None:
            self.ledger.finish(header, status)

        with self._cond:
            self._counters["received"] += len(batch)
            callback = self._callback
            if callback is None:
                self._enqueue(batch)
        if callback is None:
            done(ACCEPTED)  # pull mode: queued for recv(); PROCESSED needs push mode
            return
        try:
            callback.recv_group(header, batch, done)
        except Exception as exc:
            self.count("callback_errors")
            logger.exception("receive callback failed on group %s (%s): %r", header.key, self.describe(), exc)
            done(FAILED)

    def request(self, frame: ControlRequest, send: Callable[[ControlReply], None]) -> None:
        """Hand a coordination request to the callback; its answer goes back through ``send``."""

        def reply(status: int, body: bytes = b"") -> None:
            send(ControlReply(frame.request_id, status, body))

        callback = self._callback
        if callback is None:
            reply(REQUEST_UNHANDLED, f"{self.describe()} has no callback registered (pull mode)".encode())
            return
        try:
            callback.recv_request(frame.op, frame.body, reply)
        except Exception as exc:  # the callback's bug must not take the connection down: say it to the client
            self.count("callback_errors")
            logger.exception("receive callback failed on request op %d (%s)", frame.op, self.describe())
            reply(REQUEST_FAILED, f"{type(exc).__name__}: {exc}".encode())

    def commit(self, query_id: str, batch_id: int) -> None:
        """Forget the groups of a committed batch (and older ones of the query)."""
        forgotten = self.ledger.forget(query_id, batch_id)
        logger.debug("%s: commit %s/%d forgot %d groups", self.describe(), query_id, batch_id, forgotten)

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name``."""
        with self._cond:
            self._counters[name] = self._counters.get(name, 0) + n

    def update_peer_loads(self, loads: Mapping[int, float]) -> None:
        """Record load metrics a client sent."""
        with self._cond:
            self._peer_loads.update(loads)

    def mark_closed(self) -> bool:
        """Flag closed and wake ``recv``; returns False if it already was."""
        with self._cond:
            if self._closed:
                return False
            self._closed = True
            self._cond.notify_all()
            return True

    @property
    def closed(self) -> bool:
        return self._closed

    # --- IServer --------------------------------------------------------------------
    def register_recv(self, callback: CallbackLike) -> None:
        cb = as_callback(callback)
        with self._cond:
            if self._closed:
                msg = f"register_recv on closed {self.describe()}"
                raise ConnectionClosedError(msg)
            # Deliver what was queued first, under the lock, so a batch arriving now waits
            # and lands after it: order is preserved across the switch.
            while self._queue:
                backlog = MessageBatch.of(self._queue)
                self._queue.clear()
                self._call(cb, backlog)
            self._callback = cb
            self._cond.notify_all()

    def recv(self, flags: int = RECV_BLOCK) -> TaskMessage | None:
        if flags not in (RECV_BLOCK, RECV_NOBLOCK):
            msg = f"recv flags must be 0 (block) or 1 (no block), got {flags!r}"
            raise ValueError(msg)
        with self._cond:
            if self._callback is not None:
                msg = f"recv() on {self.describe()}, which delivers to a callback (push mode)"
                raise UnsupportedOperationError(msg)
            while not self._queue:
                if self._closed:
                    msg = f"recv() on closed {self.describe()}"
                    raise ConnectionClosedError(msg)
                if flags == RECV_NOBLOCK:
                    return None
                self._cond.wait()
            message = self._queue.popleft()
            self._cond.notify_all()
            return message

    def recv_batch(self, max_messages: int, timeout: float | None = None) -> list[TaskMessage]:
        """Pull up to ``max_messages`` at once, waiting up to ``timeout`` s for the first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._queue:
                if self._closed:
                    msg = f"recv_batch() on closed {self.describe()}"
                    raise ConnectionClosedError(msg)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return []
                self._cond.wait(remaining)
            n = min(max_messages, len(self._queue))
            out = [self._queue.popleft() for _ in range(n)]
            self._cond.notify_all()
            return out

    def describe(self) -> str:
        """Short text naming this connection, for logs and errors."""
        return f"server port {self.port}"

    def get_load(self, tasks: Iterable[int]) -> dict[int, float]:
        with self._cond:
            return {t: self._peer_loads[t] for t in tasks if t in self._peer_loads}

    @property
    def status(self) -> ConnectionStatus:
        return ConnectionStatus.CLOSED if self._closed else ConnectionStatus.READY

    def metrics(self) -> dict[str, Any]:
        with self._cond:
            out: dict[str, Any] = dict(self._counters)
            out.update(
                replayed_groups=self.ledger.replayed_groups,
                replayed_messages=self.ledger.replayed_messages,
                ledger_size=len(self.ledger),
                ledger_bytes=self.ledger.size_bytes,
            )
            out.update(
                pending=len(self._queue),
                dest=self.describe(),
                src=self.topology_id,
                status=self.status.value,
            )
            return out


class ClientBase(IClient):
    """Client-side behaviour common to every transport: acks, loads, backpressure."""

    def __init__(self, topology_id: str, host: str, port: int) -> None:
        self.topology_id = topology_id
        self.host = host
        self._port = port
        self._state_lock = threading.Lock()
        self._loads: dict[int, float] = {}
        self._bp_tasks: frozenset[int] = frozenset()
        self._acks: OrderedDict[GroupKey, int] = OrderedDict()
        self._ack_cond = threading.Condition()
        self._replies: dict[int, ControlReply | None] = {}
        self._link = 0  # bumped when the connection drops: requests in flight will get no answer
        self._server_life = 0  # bumped when the server restarted: groups it had received are gone
        self._sent_in: OrderedDict[GroupKey, int] = OrderedDict()  # group -> server life it was sent in

    def update_ack(self, ack: BatchAck) -> None:
        """Record a BatchAck the server sent: the latest status per group, but never ACCEPTED over a final one.

        A server answers a group from two threads (its receive thread says ACCEPTED, the
        thread that completes or fails the group's trees says PROCESSED or FAILED), and sends
        each outside the lock that orders them, so ACCEPTED may come after the final status.
        A group sent again starts afresh (:meth:`clear_ack`).
        """
        with self._ack_cond:
            heard = self._acks.get(ack.key)
            if ack.status != ACCEPTED or heard is None or heard == ACCEPTED:
                self._acks[ack.key] = ack.status
            self._acks.move_to_end(ack.key)
            while len(self._acks) > _MAX_UNCLAIMED_ACKS:
                self._acks.popitem(last=False)  # acks nobody waits for (e.g. of a dead task)
            self._ack_cond.notify_all()

    def clear_ack(self, key: GroupKey) -> None:
        """Forget what was heard of group ``key``: it is being sent (again), and will be answered anew.

        An ack nobody took (a task that gave up, an answer to a query after a reconnect) must
        not answer the retry that sends the group again.
        """
        with self._ack_cond:
            self._acks.pop(key, None)

    def wait_acks(self, keys: Iterable[GroupKey], status: int, timeout: float) -> dict[GroupKey, int]:
        wanted = list(keys)
        deadline = time.monotonic() + timeout
        with self._ack_cond:
            while True:
                for k in wanted:  # sent to a server that restarted since: no (further) ack will come
                    if self._sent_in.get(k, self._server_life) < self._server_life:
                        got = self._acks.get(k)
                        if got is None or (got < status and got != FAILED):
                            self._acks[k] = FAILED
                done = all(k in self._acks and (self._acks[k] >= status or self._acks[k] == FAILED) for k in wanted)
                remaining = deadline - time.monotonic()
                if done or remaining <= 0:
                    for k in wanted:
                        self._sent_in.pop(k, None)
                    return {k: self._acks.pop(k) for k in wanted if k in self._acks}
                self._ack_cond.wait(min(remaining, 0.5))

    def group_sent(self, key: GroupKey) -> None:
        """Note that group ``key`` went to the server's current life (transports call this in send_group)."""
        with self._ack_cond:
            self._sent_in[key] = self._server_life
            self._sent_in.move_to_end(key)
            while len(self._sent_in) > _MAX_UNCLAIMED_ACKS:
                self._sent_in.popitem(last=False)

    def server_restarted(self) -> None:
        """Note that the server lost the session (it restarted): groups sent before will never be acknowledged."""
        with self._ack_cond:
            self._server_life += 1
            self._ack_cond.notify_all()
        logger.warning(
            "%s: the server restarted; groups it had received are reported FAILED (resend them)", self.describe()
        )

    def request(self, op: int, body: bytes, timeout: float) -> tuple[int, bytes]:
        request_id = random.getrandbits(63)
        with self._ack_cond:
            self._replies[request_id] = None
            link = self._link
        try:
            self._send_request(ControlRequest(request_id, op, body))
            deadline = time.monotonic() + timeout
            with self._ack_cond:
                while (answer := self._replies[request_id]) is None:
                    if self._link != link:
                        msg = f"the connection dropped before {self.describe()} answered request op {op}"
                        raise ConnectionBrokenError(msg)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        msg = f"no answer to request op {op} from {self.describe()} within {timeout:.1f}s"
                        raise RequestTimeoutError(msg)
                    self._ack_cond.wait(min(remaining, 0.5))
                return answer.status, answer.body
        finally:
            with self._ack_cond:
                self._replies.pop(request_id, None)

    def _send_request(self, frame: ControlRequest) -> None:
        raise NotImplementedError  # pragma: no cover - every transport's client overrides it

    def link_lost(self) -> None:
        """Fail the requests waiting for an answer: the connection dropped (the transport calls this)."""
        with self._ack_cond:
            self._link += 1
            self._ack_cond.notify_all()

    def update_reply(self, reply: ControlReply) -> None:
        """Record the server's answer to a request (ignored if nobody waits for it any more)."""
        with self._ack_cond:
            if reply.request_id in self._replies:
                self._replies[reply.request_id] = reply
                self._ack_cond.notify_all()

    @property
    def port(self) -> int:
        return self._port

    def describe(self) -> str:
        return f"client to {self.host}:{self._port} ({self.topology_id})"

    def update_loads(self, loads: Mapping[int, float]) -> None:
        """Record load metrics the server sent."""
        with self._state_lock:
            self._loads.update(loads)

    def update_backpressure(self, status: BackpressureStatus) -> None:
        """Apply a backpressure status the server sent."""
        with self._state_lock:
            self._bp_tasks = (self._bp_tasks | status.bp_tasks) - status.non_bp_tasks

    def get_load(self, tasks: Iterable[int]) -> dict[int, float]:
        with self._state_lock:
            return {t: self._loads[t] for t in tasks if t in self._loads}

    def backpressure_tasks(self) -> frozenset[int]:
        return self._bp_tasks


class TrackingContext(IContext):
    """Context base for the socket transports: builds connections, tracks them, closes them in term()."""

    def __init__(self, conf: Config) -> None:
        self.conf = conf
        conf.auth_secret()  # fail now, not on the first connection, when the secret file is bad
        backoff_from_conf(conf)  # likewise for reconnect bounds that cannot hold
        self._lock = threading.Lock()
        self._connections: list[IConnection] = []
        self._terminated = False

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> Self:
        return cls(Config.of(conf))

    def _new_server(self, topology_id: str, port: int, callback: CallbackLike | None) -> IServer:
        raise NotImplementedError  # pragma: no cover - every subclass overrides it

    def _new_client(self, topology_id: str, host: str, port: int) -> IClient:
        raise NotImplementedError  # pragma: no cover - every subclass overrides it

    def _release(self) -> None:
        """Free transport-wide resources after every connection closed (hook)."""

    def _check_open(self, call: str) -> None:
        if self._terminated:
            msg = f"{call} on a terminated {self.alias} context"
            raise ConnectionClosedError(msg)

    def _track(self, conn: _C) -> _C:
        with self._lock:
            if self._terminated:
                conn.close()
                msg = f"the {self.alias} context was terminated"
                raise ConnectionClosedError(msg)
            self._connections.append(conn)
        return conn

    def forget(self, conn: IConnection) -> None:
        """Stop tracking a connection that closed itself."""
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)

    def bind(self, topology_id: str, port: int, callback: CallbackLike | None = None) -> IServer:
        self._check_open("bind")
        return self._track(self._new_server(topology_id, port, callback))

    def connect(self, topology_id: str, host: str, port: int) -> IClient:
        self._check_open("connect")
        if not 0 < port <= 65535:
            msg = f"cannot connect to port {port}: ports are 1..65535"
            raise TransportError(msg)
        return self._track(self._new_client(topology_id, host, port))

    def term(self) -> None:
        with self._lock:
            if self._terminated:
                return
            self._terminated = True
            conns = list(self._connections)
        for conn in conns:
            conn.close()
        self._release()
