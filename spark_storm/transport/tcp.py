"""TCP transport: Storm's Netty client/server, in Python with threads and selectors.

Features
--------
* Server: one I/O thread per bound port multiplexes every client with :mod:`selectors`;
  a malformed or unauthenticated client is logged, counted and closed alone.
* Client: one I/O thread per connection connects in the background with bounded
  exponential backoff and jitter, batches frames up to ``transfer.batch.size`` bytes,
  flushes a partial batch after ``flush.interval.ms``, and resends after a reconnect
  everything the server had not acknowledged (see ``_session``), so a reconnect loses
  nothing that ``send`` accepted.
* Write watermarks bound the client's memory; ``close()`` flushes under
  ``flush.timeout.ms`` and logs, with the count, anything it could not deliver.

Why threads and selectors rather than asyncio: ``send`` is called from plain threads
(executor and Spark writer threads); a selector thread takes their batches through a
lock-protected outbox with no event-loop hop per call, and bench/transport.py shows
this reaches the raw-socket baseline target.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import selectors
import socket
import threading
import time
from collections import deque
from typing import ClassVar

from spark_storm.config import (
    STORM_BIND_HOST,
    STORM_HANDSHAKE_TIMEOUT_MS,
    STORM_MAX_FRAME_BYTES,
    STORM_SERVER_SESSIONS_MAX,
    TCP_BACKLOG,
    TCP_BUFFER_SIZE,
    TCP_CONNECT_TIMEOUT_MS,
    TCP_FLUSH_INTERVAL_MS,
    TCP_MAX_RETRIES,
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
from spark_storm.transport._client import SessionClient
from spark_storm.transport._server import IOThreadServer
from spark_storm.transport._session import ClientProtocol, ServerPeer, SessionTable

__all__ = ["Context"]

logger = logging.getLogger(__name__)

_READ_SIZE = 262144


class _ServerConn:
    __slots__ = ("deadline", "out", "peer", "proto", "sock")
    proto: ServerPeer  # set right after construction: it needs the connection for its replies

    def __init__(self, sock: socket.socket, peer: str, deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.out = bytearray()
        self.deadline = deadline


class TcpServer(IOThreadServer):
    """A listening socket and the I/O thread that serves its clients."""

    def __init__(self, context: Context, topology_id: str, port: int, callback: CallbackLike | None) -> None:
        conf = context.conf
        super().__init__(context, conf, topology_id, callback)
        self._secret = conf.auth_secret()
        self._max_frame = conf.get_int(STORM_MAX_FRAME_BYTES, minimum=64)
        self._handshake_s = conf.get_int(STORM_HANDSHAKE_TIMEOUT_MS, minimum=1) / 1000
        self._sessions = SessionTable(conf.get_int(STORM_SERVER_SESSIONS_MAX, minimum=1))
        host = conf.get_str(STORM_BIND_HOST)
        if not is_loopback_host(host) and self._secret is None:
            logger.warning(
                "SECURITY: binding %s on non-loopback host %s WITHOUT authentication: anyone who can "
                "reach this port can inject tuples. Set storm.messaging.auth.secret(.file).",
                topology_id,
                host,
            )
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
        except OSError as exc:
            listener.close()
            self._waker.close()
            msg = f"cannot bind {topology_id} to {host}:{port}: {exc.strerror}"
            raise TransportError(msg) from exc
        listener.listen(conf.get_int(TCP_BACKLOG, minimum=1))
        listener.setblocking(False)
        self._bufsize = conf.get_int(TCP_BUFFER_SIZE, minimum=4096)
        self._listener = listener
        self._host = host
        self._port: int = listener.getsockname()[1]
        self._conns: dict[socket.socket, _ServerConn] = {}
        self._directed: deque[tuple[_ServerConn, bytes]] = deque()
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._waker.reader, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name=f"spark-storm-tcp-server-{self._port}", daemon=True)
        self._thread.start()
        logger.info("tcp server for %s listening on %s:%d", topology_id, host, self._port)

    @property
    def port(self) -> int:
        return self._port

    def describe(self) -> str:
        return f"tcp server {self.topology_id}@{self._host}:{self._port}"

    # --- I/O thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self.closed:
                for key, mask in self._sel.select(timeout=0.5):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._waker.drain()
                        self._broadcast_commands()
                    else:
                        conn: _ServerConn = key.data
                        if mask & selectors.EVENT_READ:
                            self._read(conn)
                        if mask & selectors.EVENT_WRITE and conn.sock in self._conns:
                            self._write(conn)
                if self._directed:
                    self._broadcast_commands()
                self._expire_handshakes()
        except Exception as exc:
            logger.exception("%s: I/O thread failed (%r); closing the server", self.describe(), exc)
        finally:
            self._shutdown()

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                logger.warning("%s: accept failed: %s", self.describe(), exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._bufsize)
            peer = f"{addr[0]}:{addr[1]}"
            conn = _ServerConn(sock, peer, time.monotonic() + self._handshake_s)
            conn.proto = ServerPeer(
                self,
                self._sessions,
                self._secret,
                peer,
                self._max_frame,
                functools.partial(self._reply_to, conn),
            )
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)
            self.count("accepted")
            logger.debug("%s: accepted %s", self.describe(), peer)

    def _read(self, conn: _ServerConn) -> None:
        try:
            data = conn.sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            logger.info("%s: connection from %s failed: %s", self.describe(), conn.peer, exc)
            self._drop(conn)
            return
        if not data:
            try:
                conn.proto.check_eof()
            except WireFormatError as exc:
                self._reject(conn, exc, "protocol_errors")
                return
            logger.debug("%s: %s disconnected", self.describe(), conn.peer)
            self._drop(conn)
            return
        try:
            replies = conn.proto.on_bytes(data)
        except AuthenticationError as exc:
            self._reject(conn, exc, "auth_failures")
            return
        except WireFormatError as exc:
            self._reject(conn, exc, "protocol_errors")
            return
        if conn.proto.closed_by_peer:
            self._drop(conn)
            return
        if replies:
            conn.out += b"".join(replies)
            self._write(conn)

    def _reject(self, conn: _ServerConn, exc: Exception, counter: str) -> None:
        self.count(counter)
        logger.warning("%s: closing connection from %s: %s", self.describe(), conn.peer, exc)
        with contextlib.suppress(OSError):  # the peer may be gone already; the reason is logged
            conn.sock.send(ServerPeer.failure_frame(str(exc)))
        self._drop(conn)

    def _write(self, conn: _ServerConn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            logger.info("%s: write to %s failed: %s", self.describe(), conn.peer, exc)
            self._drop(conn)
            return
        del conn.out[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        self._sel.modify(conn.sock, events, conn)

    def _reply_to(self, conn: _ServerConn, frame: bytes) -> None:
        # From any thread (acks come from executor threads): the I/O thread writes it.
        self._directed.append((conn, frame))
        self._waker.poke()

    def _broadcast_commands(self) -> None:
        while self._directed:
            conn, frame = self._directed.popleft()
            if conn.sock in self._conns:
                conn.out += frame
                self._write(conn)
        while self._commands:
            frame = self._commands.popleft()
            for conn in list(self._conns.values()):
                if conn.proto.ready:
                    conn.out += frame
                    self._write(conn)

    def _expire_handshakes(self) -> None:
        now = time.monotonic()
        for conn in list(self._conns.values()):
            if not conn.proto.ready and now > conn.deadline:
                self._reject(conn, WireFormatError("handshake not completed in time"), "protocol_errors")

    def _drop(self, conn: _ServerConn) -> None:
        self._conns.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()

    def _shutdown(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._listener.close()
        self._waker.close()
        self._sel.close()

    # --- IConnection ----------------------------------------------------------------
    def ready_clients(self) -> int:
        return sum(1 for c in list(self._conns.values()) if c.proto.ready)


class TcpClient(SessionClient):
    """One client connection with its own I/O thread (connect, handshake, write, reconnect)."""

    def __init__(self, context: Context, topology_id: str, host: str, port: int) -> None:
        super().__init__(context, topology_id, host, port, f"{host}:{port}")
        conf = context.conf
        self._flush_interval = conf.get_int(TCP_FLUSH_INTERVAL_MS, minimum=0) / 1000
        self._connect_timeout = conf.get_int(TCP_CONNECT_TIMEOUT_MS, minimum=1) / 1000
        self._max_retries = conf.get_int(TCP_MAX_RETRIES, minimum=-1)
        self._bufsize = conf.get_int(TCP_BUFFER_SIZE, minimum=4096)
        self._start(f"spark-storm-tcp-client-{self._peer}")

    # --- I/O thread -------------------------------------------------------------------
    def _run(self) -> None:
        attempt = 0
        try:
            while not self._closing.is_set():
                sock = self._connect()
                if sock is None:
                    attempt += 1
                    if 0 <= self._max_retries < attempt:
                        logger.error(
                            "%s: giving up after %d connect attempts (%s); last error: %s",
                            self.describe(),
                            attempt,
                            TCP_MAX_RETRIES,
                            self.last_error,
                        )
                        break
                    delay = self._backoff.delay_ms(attempt - 1)
                    logger.info(
                        "%s: connect attempt %d failed (%s); next in %d ms",
                        self.describe(),
                        attempt,
                        self.last_error,
                        delay,
                    )
                    self._closing.wait(delay / 1000)
                    continue
                attempt = 0
                try:
                    self._serve(sock)
                except (ConnectionBrokenError, WireFormatError, OSError) as exc:
                    self.last_error = str(exc)
                    if isinstance(exc, AuthenticationError):
                        logger.error("%s: %s", self.describe(), exc)
                        attempt += 1
                        self._closing.wait(self._backoff.delay_ms(attempt) / 1000)
                    elif not self._closing.is_set():
                        logger.warning("%s: connection lost: %s; reconnecting", self.describe(), exc)
                finally:
                    sock.close()
                    self._mark_connecting()
        except Exception as exc:
            logger.exception("%s: I/O thread failed (%r)", self.describe(), exc)
        finally:
            self._finish()

    def _connect(self) -> socket.socket | None:
        try:
            sock = socket.create_connection((self.host, self._port), timeout=self._connect_timeout)
        except OSError as exc:
            self.last_error = f"{self._peer}: {exc.strerror or exc}"
            return None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._bufsize)
        sock.setblocking(False)
        return sock

    def _serve(self, sock: socket.socket) -> None:
        proto = ClientProtocol(self, self._session, self._secret, self._peer, self._max_frame)
        out = bytearray(proto.hello())
        sel = selectors.DefaultSelector()
        sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, "sock")
        sel.register(self._waker.reader, selectors.EVENT_READ, "wake")
        handshake_deadline = time.monotonic() + self._handshake_s
        flush_at: float | None = None
        close_deadline: float | None = None
        try:
            while True:
                now = time.monotonic()
                if not proto.ready and now > handshake_deadline:
                    msg = f"handshake with {self._peer} timed out"
                    raise ConnectionBrokenError(msg)
                if self._closing.is_set():
                    if not proto.ready:
                        return
                    if close_deadline is None:
                        close_deadline = now + self._flush_timeout
                        flush_at = now
                    if (self._session.pending == 0 and not out) or now > close_deadline:
                        self._say_goodbye(sock, out)
                        return
                if proto.ready:
                    while self._control_out:
                        out += self._control_out.popleft()
                    if flush_at is not None and now >= flush_at:
                        self._wake_pending = False
                        chunks = self._session.take_outbox()
                        if chunks:
                            out += b"".join(chunks)
                        flush_at = None
                if out:
                    try:
                        sent = sock.send(out)
                    except (BlockingIOError, InterruptedError):
                        sent = 0
                    del out[:sent]
                timeout = self._select_timeout(out, flush_at, close_deadline, handshake_deadline, proto.ready)
                sel.modify(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0), "sock")
                for key, _mask in sel.select(timeout):
                    if key.data == "wake":
                        self._waker.drain()
                        if flush_at is None:
                            flush_at = self._next_flush()
                    else:
                        self._read(sock, proto, out)
                if proto.ready and self._status is not ConnectionStatus.READY:
                    self._mark_ready()
                    flush_at = time.monotonic()  # replay the resend buffer now
                elif proto.ready and flush_at is None and self._session.outbox_bytes:
                    flush_at = self._next_flush()
        finally:
            sel.close()

    def _next_flush(self) -> float:
        if self._session.outbox_bytes >= self._batch_bytes:
            return time.monotonic()
        return time.monotonic() + self._flush_interval

    @staticmethod
    def _select_timeout(
        out: bytearray, flush_at: float | None, close_deadline: float | None, hs_deadline: float, ready: bool
    ) -> float:
        now = time.monotonic()
        candidates = [1.0]
        if flush_at is not None and ready:
            candidates.append(flush_at - now)
        if close_deadline is not None:
            candidates.append(min(0.05, close_deadline - now))
        if not ready:
            candidates.append(hs_deadline - now)
        return max(0.0, min(candidates))

    def _read(self, sock: socket.socket, proto: ClientProtocol, out: bytearray) -> None:
        try:
            data = sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            msg = f"server {self._peer} closed the connection"
            raise ConnectionBrokenError(msg)
        for reply in proto.on_bytes(data):
            out += reply
        self._received += 1

    def _say_goodbye(self, sock: socket.socket, out: bytearray) -> None:
        while self._control_out:  # e.g. a commit sent just before close()
            out += self._control_out.popleft()
        out += encode_control(Close())
        sock.setblocking(True)
        sock.settimeout(1.0)
        try:
            sock.sendall(out)
            sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                logger.debug("%s: goodbye failed: %s", self.describe(), exc)


class Context(TrackingContext):
    """The tcp transport's context: tracks its servers and clients so ``term()`` closes them."""

    alias: ClassVar[str] = "tcp"
    crosses_processes: ClassVar[bool] = True

    def _new_server(self, topology_id: str, port: int, callback: CallbackLike | None) -> IConnection:
        return TcpServer(self, topology_id, port, callback)

    def _new_client(self, topology_id: str, host: str, port: int) -> IConnection:
        return TcpClient(self, topology_id, host, port)
