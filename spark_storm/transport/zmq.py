"""ZeroMQ transport (Storm 0.8's zmq messaging), on pyzmq.

Features
--------
* Client DEALER -> server ROUTER for data (Storm 0.8 used PUSH/PULL); the ROUTER's
  return path carries the handshake, receipts, load metrics and backpressure to each
  client by its routing id.
* The same session layer as tcp: handshake with optional HMAC auth, sequenced batches,
  a bounded resend buffer replayed after the server restarts, duplicates dropped.
* ``zmq.threads``, ``zmq.linger.millis`` and ``zmq.hwm`` from config; ``ipc://`` sockets
  when ``storm.local.mode.zmq`` is true.

Each socket is used by exactly one thread (its I/O thread); other threads reach it
through a deque and a wake-up socketpair that the zmq poller watches.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import tempfile
import threading
import time
from collections import OrderedDict, deque
from typing import ClassVar

import zmq
from zmq.utils.monitor import recv_monitor_message

from spark_storm.config import (
    STORM_BIND_HOST,
    STORM_LOCAL_MODE_ZMQ,
    STORM_MAX_FRAME_BYTES,
    STORM_SERVER_SESSIONS_MAX,
    ZMQ_HWM,
    ZMQ_IPC_DIR,
    ZMQ_LINGER_MILLIS,
    ZMQ_THREADS,
    Config,
    is_loopback_host,
)
from spark_storm.errors import (
    AuthenticationError,
    ConnectionBrokenError,
    TransportError,
    WireFormatError,
)
from spark_storm.messaging.api import CallbackLike, IConnection
from spark_storm.messaging.message import ConnectionStatus
from spark_storm.messaging.wire import Close, encode_control
from spark_storm.transport._base import TrackingContext
from spark_storm.transport._client import JOIN_TIMEOUT_S, SessionClient
from spark_storm.transport._server import IOThreadServer
from spark_storm.transport._session import ClientProtocol, ServerPeer, SessionTable

__all__ = ["Context"]

logger = logging.getLogger(__name__)

_MONITOR_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


class ZmqServer(IOThreadServer):
    """A ROUTER socket and the I/O thread that serves its clients."""

    def __init__(self, context: Context, topology_id: str, port: int, callback: CallbackLike | None) -> None:
        conf = context.conf
        super().__init__(context, conf, topology_id, callback)
        self._secret = conf.auth_secret()
        self._max_frame = conf.get_int(STORM_MAX_FRAME_BYTES, minimum=64)
        self._sessions = SessionTable(conf.get_int(STORM_SERVER_SESSIONS_MAX, minimum=1))
        self._max_peers = conf.get_int(STORM_SERVER_SESSIONS_MAX, minimum=1)
        self._peers: OrderedDict[bytes, ServerPeer] = OrderedDict()
        sock = context.zmq.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, context.linger_ms)
        sock.setsockopt(zmq.RCVHWM, context.hwm)
        sock.setsockopt(zmq.SNDHWM, context.hwm)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        try:
            self._endpoint, self._port = context.bind_socket(sock, topology_id, port)
        except zmq.ZMQError as exc:
            sock.close(0)
            self._waker.close()
            msg = f"cannot bind {topology_id} on port {port}: {exc}"
            raise TransportError(msg) from exc
        self._sock = sock
        self._directed: deque[tuple[bytes, bytes]] = deque()
        self._thread = threading.Thread(target=self._run, name=f"spark-storm-zmq-server-{self._port}", daemon=True)
        self._thread.start()
        logger.info("zmq server for %s bound at %s", topology_id, self._endpoint)

    @property
    def port(self) -> int:
        return self._port

    def describe(self) -> str:
        return f"zmq server {self.topology_id}@{self._endpoint}"

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._waker.reader.fileno(), zmq.POLLIN)
        try:
            while not self.closed:
                events = dict(poller.poll(500))
                if self._waker.reader.fileno() in events:
                    self._waker.drain()
                    self._broadcast()
                if self._sock in events:
                    for _ in range(256):  # bounded, so commands and close are not starved
                        try:
                            ident, payload = self._sock.recv_multipart(zmq.NOBLOCK, copy=True)
                        except zmq.Again:
                            break
                        except ValueError:
                            self.count("protocol_errors")
                            continue
                        self._on_message(ident, payload)
                if self._directed:
                    self._broadcast()
        except zmq.ContextTerminated:
            pass
        except Exception as exc:
            logger.exception("%s: I/O thread failed (%r); closing the server", self.describe(), exc)
        finally:
            self._sock.close()
            self._waker.close()

    def _on_message(self, ident: bytes, payload: bytes) -> None:
        peer = self._peers.get(ident)
        label = f"zmq peer {ident.hex()[:8]}"
        if peer is None:
            peer = ServerPeer(
                self,
                self._sessions,
                self._secret,
                label,
                self._max_frame,
                functools.partial(self._reply_later, ident),
            )
            self._peers[ident] = peer
            self.count("accepted")
            while len(self._peers) > self._max_peers:
                self._peers.popitem(last=False)
        try:
            replies = peer.on_bytes(payload)
            peer.check_eof()  # a zmq message holds whole frames; leftovers mean truncation
        except (AuthenticationError, WireFormatError) as exc:
            self.count("auth_failures" if isinstance(exc, AuthenticationError) else "protocol_errors")
            logger.warning("%s: refusing %s: %s", self.describe(), label, exc)
            self._peers.pop(ident, None)
            self._reply(ident, ServerPeer.failure_frame(str(exc)))
            return
        if peer.closed_by_peer:
            self._peers.pop(ident, None)
        if replies:
            self._reply(ident, b"".join(replies))

    def _reply(self, ident: bytes, data: bytes) -> None:
        try:
            self._sock.send_multipart([ident, data], zmq.NOBLOCK)
        except zmq.Again:
            logger.warning("%s: reply to a client dropped: its queue is full (zmq.hwm)", self.describe())

    def _reply_later(self, ident: bytes, frame: bytes) -> None:
        # From any thread: only the I/O thread may touch the socket.
        self._directed.append((ident, frame))
        self._waker.poke()

    def _broadcast(self) -> None:
        while self._directed:
            ident, frame = self._directed.popleft()
            self._reply(ident, frame)
        while self._commands:
            frame = self._commands.popleft()
            for ident, peer in list(self._peers.items()):
                if peer.ready:
                    self._reply(ident, frame)

    def ready_clients(self) -> int:
        return sum(1 for p in list(self._peers.values()) if p.ready)


class ZmqClient(SessionClient):
    """A DEALER socket with its own I/O thread; zmq reconnects, we re-handshake and resend."""

    def __init__(self, context: Context, topology_id: str, host: str, port: int) -> None:
        endpoint = context.endpoint_for(topology_id, host, port)
        super().__init__(context, topology_id, host, port, endpoint)
        self._endpoint = endpoint
        sock = context.zmq.socket(zmq.DEALER)
        # Routing ids must not start with a zero byte (reserved by libzmq).
        sock.setsockopt(zmq.ROUTING_ID, b"S" + self._session.session_id)
        sock.setsockopt(zmq.LINGER, context.linger_ms)
        sock.setsockopt(zmq.SNDHWM, context.hwm)
        sock.setsockopt(zmq.RCVHWM, context.hwm)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.RECONNECT_IVL, max(1, self._backoff.min_ms))
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, max(1, self._backoff.max_ms))
        self._monitor = sock.get_monitor_socket(_MONITOR_EVENTS)
        sock.connect(endpoint)
        self._sock = sock
        self._start(f"spark-storm-zmq-client-{endpoint}")

    def describe(self) -> str:
        return f"zmq client to {self._endpoint} ({self.topology_id})"

    # --- I/O thread -------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        poller.register(self._waker.reader.fileno(), zmq.POLLIN)
        proto: ClientProtocol | None = None
        connected = False
        retry_at: float | None = None
        hs_deadline = 0.0
        close_deadline: float | None = None
        out: deque[bytes] = deque()
        attempt = 0
        try:
            while True:
                now = time.monotonic()
                if self._closing.is_set():
                    if proto is None or not proto.ready:
                        break
                    if close_deadline is None:
                        close_deadline = now + self._flush_timeout
                    if (self._session.pending == 0 and not out) or now > close_deadline:
                        while self._control_out:  # e.g. a commit sent just before close()
                            self._try_send(self._control_out.popleft())
                        self._try_send(encode_control(Close()))
                        break
                if connected and (proto is None or (retry_at is not None and now >= retry_at)):
                    proto = ClientProtocol(self, self._session, self._secret, self._peer, self._max_frame)
                    out.clear()
                    out.append(proto.hello())
                    hs_deadline = now + self._handshake_s
                    retry_at = None
                elif proto is not None and not proto.ready and retry_at is None and now > hs_deadline:
                    self.last_error = f"handshake with {self._peer} timed out"
                    retry_at = now
                    continue
                if proto is not None and proto.ready:
                    self._wake_pending = False
                    while self._control_out:
                        out.append(self._control_out.popleft())
                    out.extend(self._session.take_outbox())  # one zero-copy message a batch
                while out:
                    if not self._try_send(out[0]):
                        break
                    out.popleft()
                poller.modify(self._sock, zmq.POLLIN | (zmq.POLLOUT if out else 0))
                timeout_ms = 1000 if close_deadline is None else 20
                if proto is not None and not proto.ready:
                    until = (retry_at if retry_at is not None else hs_deadline) - time.monotonic()
                    timeout_ms = max(0, min(timeout_ms, int(until * 1000) + 1))
                events = dict(poller.poll(timeout_ms))
                if self._waker.reader.fileno() in events:
                    self._waker.drain()
                if self._monitor in events:
                    connected, proto = self._on_monitor(connected, proto)
                if self._sock in events and events[self._sock] & zmq.POLLIN:
                    try:
                        proto, retry_at, attempt = self._read_all(proto, retry_at, attempt, out)
                    except (ConnectionBrokenError, WireFormatError) as exc:
                        self.last_error = str(exc)
                        logger.warning("%s: %s; handshaking again", self.describe(), exc)
                        proto = None
                        self._mark_connecting()
        except zmq.ContextTerminated:
            pass
        except Exception as exc:
            logger.exception("%s: I/O thread failed (%r)", self.describe(), exc)
        finally:
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._sock.close()
            self._finish()

    def _try_send(self, data: bytes) -> bool:
        try:
            self._sock.send(data, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True

    def _on_monitor(self, connected: bool, proto: ClientProtocol | None) -> tuple[bool, ClientProtocol | None]:
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return connected, proto
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                connected = True
                proto = None  # a fresh transport connection: handshake again
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                connected = False
                proto = None
                if self._status is ConnectionStatus.READY:
                    logger.warning("%s: disconnected; zmq reconnects, we will resend", self.describe())
                self._mark_connecting()

    def _read_all(
        self, proto: ClientProtocol | None, retry_at: float | None, attempt: int, out: deque[bytes]
    ) -> tuple[ClientProtocol | None, float | None, int]:
        while True:
            try:
                data = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return proto, retry_at, attempt
            self._received += 1
            if proto is None:
                continue  # a reply to a handshake we already abandoned
            try:
                out.extend(proto.on_bytes(data))
            except AuthenticationError as exc:
                attempt += 1
                self.last_error = str(exc)
                logger.error("%s: %s", self.describe(), exc)
                return proto, time.monotonic() + self._backoff.delay_ms(attempt) / 1000, attempt
            if proto.ready and self._status is not ConnectionStatus.READY:
                attempt = 0
                self._mark_ready()


class Context(TrackingContext):
    """The zmq transport's context: one ``zmq.Context`` and the connections made with it."""

    alias: ClassVar[str] = "zmq"
    crosses_processes: ClassVar[bool] = True

    def __init__(self, conf: Config) -> None:
        super().__init__(conf)
        self.zmq = zmq.Context(io_threads=conf.get_int(ZMQ_THREADS, minimum=1))
        self.linger_ms = conf.get_int(ZMQ_LINGER_MILLIS, minimum=-1)
        self.hwm = conf.get_int(ZMQ_HWM, minimum=0)
        self.local_mode = conf.get_bool(STORM_LOCAL_MODE_ZMQ)
        self.bind_host = conf.get_str(STORM_BIND_HOST)
        self._ipc_dir = conf.get_optional_str(ZMQ_IPC_DIR) or tempfile.gettempdir()

    def _ipc_endpoint(self, topology_id: str, port: int) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in topology_id)
        return f"ipc://{os.path.join(self._ipc_dir, f'spark-storm-{safe}-{port}')}"

    def endpoint_for(self, topology_id: str, host: str, port: int) -> str:
        """Return the endpoint a client connects to."""
        if self.local_mode:
            return self._ipc_endpoint(topology_id, port)
        return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"

    def bind_socket(self, sock: zmq.Socket[bytes], topology_id: str, port: int) -> tuple[str, int]:
        """Bind ``sock`` and return (endpoint, port actually bound)."""
        if self.local_mode:
            if port == 0:
                rng = random.Random()
                for _ in range(1000):
                    port = rng.randrange(49152, 65536)
                    if not os.path.exists(self._ipc_endpoint(topology_id, port)[6:]):
                        break
            endpoint = self._ipc_endpoint(topology_id, port)
            sock.bind(endpoint)
            return endpoint, port
        host = self.bind_host
        if not is_loopback_host(host) and self.conf.auth_secret() is None:
            logger.warning(
                "SECURITY: binding %s on non-loopback host %s WITHOUT authentication: anyone who "
                "can reach this port can inject tuples. Set storm.messaging.auth.secret(.file).",
                topology_id,
                host,
            )
        shown = f"[{host}]" if ":" in host else host
        if port == 0:
            bound = sock.bind_to_random_port(f"tcp://{shown}", min_port=20000, max_port=65000, max_tries=200)
            return f"tcp://{shown}:{bound}", bound
        sock.bind(f"tcp://{shown}:{port}")
        return f"tcp://{shown}:{port}", port

    def _new_server(self, topology_id: str, port: int, callback: CallbackLike | None) -> IConnection:
        return ZmqServer(self, topology_id, port, callback)

    def _new_client(self, topology_id: str, host: str, port: int) -> IConnection:
        return ZmqClient(self, topology_id, host, port)

    def _release(self) -> None:
        # Every socket was closed by its own thread; term() returns once they are.
        done = threading.Thread(target=self.zmq.term, name="spark-storm-zmq-term", daemon=True)
        done.start()
        done.join(JOIN_TIMEOUT_S)
        if done.is_alive():
            logger.error("zmq context did not terminate within %.0fs; a socket was left open", JOIN_TIMEOUT_S)
