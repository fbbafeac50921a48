"""In-process transport (Storm's local mode).

Features: push and pull receive, load metrics both ways, backpressure status, clients
that connect before their server binds.  A client whose server is not bound yet holds
messages in a bounded pending buffer (``storm.messaging.local.pending.max.size``) and
flushes it, in order, the moment the server binds (Storm's ``flushPending``, without its
5 s timer).  All state belongs to the context instance: two contexts never see each other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from spark_storm.config import (
    STORM_LOCAL_PENDING_MAX,
    STORM_OVERFLOW_POLICY,
    STORM_SEND_TIMEOUT_MS,
    Config,
)
from spark_storm.errors import ConnectionClosedError, SendTimeoutError, TransportError
from spark_storm.messaging.api import CallbackLike, IClient, IContext, IServer
from spark_storm.messaging.message import BackpressureStatus, ConnectionStatus, MessageBatch, TaskMessage
from spark_storm.messaging.wire import BatchHeader, ControlRequest, check_messages
from spark_storm.netutil import FIRST_EPHEMERAL_PORT
from spark_storm.transport._base import ClientBase, ServerBase, as_batch

__all__ = ["Context"]

logger = logging.getLogger(__name__)

_Key = tuple[str, int]


class LocalServer(ServerBase):
    """A server registered in its context under (topology id, port)."""

    def __init__(self, context: Context, topology_id: str, port: int, callback: CallbackLike | None) -> None:
        super().__init__(context.conf, topology_id, callback)
        self._context = context
        self._port = port

    @property
    def port(self) -> int:
        return self._port

    def describe(self) -> str:
        return f"local server {self.topology_id}:{self._port}"

    def send_load_metrics(self, loads: Mapping[int, float]) -> None:
        for client in self._context.clients_of((self.topology_id, self._port)):
            client.update_loads(loads)

    def send_backpressure_status(self, status: BackpressureStatus) -> None:
        for client in self._context.clients_of((self.topology_id, self._port)):
            client.update_backpressure(status)

    def close(self) -> None:
        if self.mark_closed():
            self._context.unbind(self)
            logger.info("closed %s", self.describe())


class LocalClient(ClientBase):
    """A client that delivers straight into its server, holding messages while it is unbound."""

    def __init__(self, context: Context, topology_id: str, host: str, port: int) -> None:
        super().__init__(topology_id, host, port)
        self._context = context
        self._key: _Key = (topology_id, port)
        conf = context.conf
        self._limit = conf.get_int(STORM_LOCAL_PENDING_MAX, minimum=1)
        self._policy = conf.get_choice(STORM_OVERFLOW_POLICY, ("block", "drop"))
        timeout_ms = conf.get_int(STORM_SEND_TIMEOUT_MS, minimum=-1)
        self._timeout = None if timeout_ms < 0 else timeout_ms / 1000
        self._pending: list[TaskMessage] = []
        self._closed = False
        self._sent = 0
        self._lost = 0
        # Held while delivering, so one client's batches reach the server in send order.
        self._send_lock = threading.Lock()

    def describe(self) -> str:
        return f"local client to {self.topology_id}:{self._port}"

    @property
    def status(self) -> ConnectionStatus:
        if self._closed:
            return ConnectionStatus.CLOSED
        if self._context.server_for(self._key) is None:
            return ConnectionStatus.CONNECTING
        return ConnectionStatus.READY

    def send(self, messages: TaskMessage | Iterable[TaskMessage]) -> None:
        batch = as_batch(messages)
        check_messages(batch)
        if not batch:
            return
        with self._send_lock:
            if self._closed:
                msg = f"send on closed {self.describe()}"
                raise ConnectionClosedError(msg)
            server = self._context.server_for(self._key)
            if server is not None and self._pending:
                self._flush_pending_locked(server)
            if server is None:
                self._hold(batch)
                return
            server.deliver(MessageBatch.of(batch))
            self._sent += len(batch)

    def _hold(self, batch: list[TaskMessage]) -> None:
        # Caller holds _send_lock.
        if len(self._pending) + len(batch) > self._limit:
            if self._policy == "drop":
                self._lost += len(batch)
                logger.error(
                    "dropping %d messages: %s holds %d pending (limit %d, %s) and its server is not bound",
                    len(batch),
                    self.describe(),
                    len(self._pending),
                    self._limit,
                    STORM_LOCAL_PENDING_MAX,
                )
                return
            server = self._wait_for_server()
            self._flush_pending_locked(server)
            server.deliver(MessageBatch.of(batch))
            self._sent += len(batch)
            return
        self._pending.extend(batch)

    def _wait_for_server(self) -> LocalServer:
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            server = self._context.wait_for_server(self._key, deadline, lambda: self._closed)
            if server is not None:
                return server
            if self._closed or self._context.terminated:
                msg = f"{self.describe()} closed while send() waited for its server to bind"
                raise ConnectionClosedError(msg)
            msg = (
                f"send on {self.describe()} waited {self._timeout}s for the server to bind with "
                f"{len(self._pending)} messages pending (limit {STORM_LOCAL_PENDING_MAX}={self._limit})"
            )
            raise SendTimeoutError(msg)

    def _flush_pending_locked(self, server: LocalServer) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            server.deliver(MessageBatch.of(pending))
            self._sent += len(pending)

    def flush_pending(self, server: LocalServer) -> None:
        """Deliver what was held; the context calls this when our server binds."""
        with self._send_lock:
            if not self._closed:
                self._flush_pending_locked(server)

    def send_group(self, header: BatchHeader, messages: Sequence[TaskMessage]) -> None:
        if len(messages) != header.count:
            msg = f"group {header.key} announces {header.count} messages but {len(messages)} were given"
            raise ValueError(msg)
        check_messages(messages)
        with self._send_lock:
            if self._closed:
                msg = f"send_group on closed {self.describe()}"
                raise ConnectionClosedError(msg)
            server = self._context.server_for(self._key)
            if server is None:
                server = self._wait_for_server()  # groups are not held: the sender waits for its ack anyway
            self._flush_pending_locked(server)
            server.deliver_group(header, MessageBatch.of(messages), self.update_ack)
            self._sent += len(messages)

    def send_commit(self, query_id: str, batch_id: int) -> None:
        server = self._context.server_for(self._key)
        if server is not None:
            server.commit(query_id, batch_id)

    def _send_request(self, frame: ControlRequest) -> None:
        with self._send_lock:
            if self._closed:
                msg = f"request on closed {self.describe()}"
                raise ConnectionClosedError(msg)
        server = self._context.server_for(self._key) or self._wait_for_server()
        server.request(frame, self.update_reply)

    def send_load_metrics(self, loads: Mapping[int, float]) -> None:
        server = self._context.server_for(self._key)
        if server is not None:
            server.update_peer_loads(loads)

    def flush(self, timeout: float | None = None) -> bool:
        return self.wait_ready(timeout) and not self._pending

    def wait_ready(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        server = self._context.wait_for_server(self._key, deadline, lambda: self._closed)
        if server is None:
            return False
        with self._send_lock:
            self._flush_pending_locked(server)
        return not self._closed

    def metrics(self) -> dict[str, Any]:
        return {
            "sent": self._sent,
            "received": 0,
            "lost": self._lost,
            "pending": len(self._pending),
            "reconnects": 0,
            "dest": f"{self.topology_id}:{self._port}",
            "src": "local",
            "status": self.status.value,
        }

    def close(self) -> None:
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
            if self._pending:
                self._lost += len(self._pending)
                logger.error(
                    "dropping %d pending messages: %s closed before its server bound",
                    len(self._pending),
                    self.describe(),
                )
                self._pending = []
        self._context.forget_client(self)


class Context(IContext):
    """The local transport's context: a registry of servers keyed by (topology id, port)."""

    alias: ClassVar[str] = "local"
    crosses_processes: ClassVar[bool] = False

    def __init__(self, conf: Config) -> None:
        self.conf = conf
        self._cond = threading.Condition()
        self._servers: dict[_Key, LocalServer] = {}
        self._clients: list[LocalClient] = []
        self._next_port = FIRST_EPHEMERAL_PORT
        self.terminated = False

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> Context:
        return cls(Config.of(conf))

    def bind(self, topology_id: str, port: int, callback: CallbackLike | None = None) -> IServer:
        if not 0 <= port <= 65535:
            msg = f"port {port} is outside 0..65535"
            raise TransportError(msg)
        with self._cond:
            if self.terminated:
                msg = "bind on a terminated local context"
                raise ConnectionClosedError(msg)
            if port == 0:
                while (topology_id, self._next_port) in self._servers:
                    self._next_port += 1
                port = self._next_port
                self._next_port += 1
            key = (topology_id, port)
            if key in self._servers:
                msg = f"local port {port} is already bound for topology {topology_id!r}; close that server first"
                raise TransportError(msg)
            server = LocalServer(self, topology_id, port, callback)
            self._servers[key] = server
            waiting = [c for c in self._clients if c._key == key]
            self._cond.notify_all()
        logger.info("bound %s", server.describe())
        for client in waiting:
            client.flush_pending(server)
        return server

    def connect(self, topology_id: str, host: str, port: int) -> IClient:
        with self._cond:
            if self.terminated:
                msg = "connect on a terminated local context"
                raise ConnectionClosedError(msg)
            client = LocalClient(self, topology_id, host, port)
            self._clients.append(client)
        return client

    def server_for(self, key: _Key) -> LocalServer | None:
        return self._servers.get(key)

    def wait_for_server(self, key: _Key, deadline: float | None, stop: Any) -> LocalServer | None:
        with self._cond:
            while True:
                server = self._servers.get(key)
                if server is not None or self.terminated or stop():
                    return server
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def clients_of(self, key: _Key) -> list[LocalClient]:
        with self._cond:
            return [c for c in self._clients if c._key == key]

    def unbind(self, server: LocalServer) -> None:
        with self._cond:
            key = (server.topology_id, server.port)
            if self._servers.get(key) is server:
                del self._servers[key]

    def forget_client(self, client: LocalClient) -> None:
        with self._cond:
            if client in self._clients:
                self._clients.remove(client)
            self._cond.notify_all()

    def term(self) -> None:
        with self._cond:
            if self.terminated:
                return
            self.terminated = True
            servers = list(self._servers.values())
            clients = list(self._clients)
            self._cond.notify_all()
        for client in clients:
            client.close()
        for server in servers:
            server.close()
