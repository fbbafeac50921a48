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
import ssl
import threading
import time
from collections import deque
from traceback import format_exc
from typing import ClassVar

from spark_storm.config import (
    STORM_BIND_HOST,
    STORM_HANDSHAKE_TIMEOUT_MS,
    STORM_SERVER_IDLE_TIMEOUT_MS,
    STORM_SERVER_MAX_CONNECTIONS,
    STORM_SERVER_SESSIONS_MAX,
    TCP_BACKLOG,
    TCP_BUFFER_SIZE,
    TCP_CONNECT_TIMEOUT_MS,
    TCP_FLUSH_INTERVAL_MS,
    TCP_MAX_RETRIES,
)
from spark_storm.errors import (
    AuthenticationError,
    ConnectionBrokenError,
    TransportError,
    WireFormatError,
)
from spark_storm.messaging.api import CallbackLike, IClient, IServer
from spark_storm.messaging.message import ConnectionStatus
from spark_storm.messaging.wire import Close, Eob, encode_control
from spark_storm.transport._base import TrackingContext
from spark_storm.transport._client import SessionClient
from spark_storm.transport._server import IOThreadServer, LogLimiter, warn_if_open
from spark_storm.transport._session import ClientProtocol, PeerLimits, ServerPeer, SessionTable, server_fault
from spark_storm.transport._tls import client_context, server_context, wrap

__all__ = ["Context"]

logger = logging.getLogger(__name__)

_READ_SIZE = 262144
_SWEEP_S = 0.05  # how often deadlines (handshake, idle) are checked
_ACCEPT_BACKOFF_MIN_S = 0.05
_ACCEPT_BACKOFF_MAX_S = 1.0
_ACCEPTS_PER_WAKE = 64
# accept() errors that mean "out of descriptors or kernel memory": retrying at once only spins.
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
_KEEPALIVE = encode_control(Eob())


class _ServerConn:
    __slots__ = ("deadline", "events", "last_read", "out", "peer", "proto", "sock", "tls_pending")
    proto: ServerPeer  # set right after construction: it needs the connection for its replies

    def __init__(self, sock: socket.socket, peer: str, deadline: float, tls_pending: bool) -> None:
        self.sock = sock
        self.peer = peer
        self.out = bytearray()
        self.events = selectors.EVENT_READ  # what the selector watches for it now
        self.deadline = deadline
        self.last_read = time.monotonic()
        self.tls_pending = tls_pending


class TcpServer(IOThreadServer):
    """A listening socket and the I/O thread that serves its clients.

    Against careless and hostile peers it holds at most ``server.max.connections``
    connections (a new one evicts the oldest still in its handshake, or is refused), lets
    a connection send only handshake-sized data before its handshake completed, drops it
    at ``handshake.timeout.ms`` if it did not, closes connections silent for
    ``server.idle.timeout.ms``, and when accept() runs out of file descriptors it stops
    accepting for a growing pause (logging once per interval) instead of spinning.
    """

    def __init__(self, context: Context, topology_id: str, port: int, callback: CallbackLike | None) -> None:
        conf = context.conf
        tls = server_context(conf)  # before anything is opened: a bad TLS setting leaks nothing
        super().__init__(context, conf, topology_id, callback)
        self._secret = conf.auth_secret()
        self._limits = PeerLimits.from_conf(conf)
        self._max_frame = self._limits.max_frame_bytes
        self._handshake_s = conf.get_int(STORM_HANDSHAKE_TIMEOUT_MS, minimum=1) / 1000
        idle_ms = conf.get_int(STORM_SERVER_IDLE_TIMEOUT_MS, minimum=-1)
        self._idle_s = None if idle_ms <= 0 else idle_ms / 1000
        self._max_conns = conf.get_int(STORM_SERVER_MAX_CONNECTIONS, minimum=1)
        self._sessions = SessionTable(conf.get_int(STORM_SERVER_SESSIONS_MAX, minimum=1))
        self._tls = tls
        self._logs = LogLimiter(logger)
        host = conf.get_str(STORM_BIND_HOST)
        warn_if_open(logger, topology_id, host, self._secret is not None)
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
        self._wake_pending = False  # a poke is on its way: replies from other threads need no new one
        self._dirty: dict[_ServerConn, None] = {}  # connections with replies queued this turn of the loop
        self._tls_buffered: set[_ServerConn] = set()
        self._accept_paused_until: float | None = None
        self._accept_backoff = _ACCEPT_BACKOFF_MIN_S
        self._next_sweep = 0.0
        self.count("accept_resource_errors", 0)
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._waker.reader, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name=f"spark-storm-tcp-server-{self._port}", daemon=True)
        self._thread.start()
        logger.info(
            "tcp server for %s listening on %s:%d%s", topology_id, host, self._port, " (TLS)" if self._tls else ""
        )

    @property
    def port(self) -> int:
        return self._port

    def describe(self) -> str:
        return f"tcp server {self.topology_id}@{self._host}:{self._port}"

    # --- I/O thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self.closed:
                timeout = 0.0 if self._tls_buffered else min(0.5, max(0.0, self._next_sweep - time.monotonic()))
                self._dispatch(self._sel.select(timeout=timeout))
                if self._tls_buffered:
                    self._read_tls_buffered()
                # Cleared after the select drained the waker and before the queues are read: a
                # reply queued after this point pokes again, one queued before it is read now.
                self._wake_pending = False
                if self._directed or self._commands:
                    self._queue_commands()
                if self._dirty:
                    self._flush_dirty()
                now = time.monotonic()
                if now >= self._next_sweep:
                    self._next_sweep = now + _SWEEP_S
                    self._sweep(now)
        except Exception as exc:
            logger.exception("%s: I/O thread failed (%r); closing the server", self.describe(), exc)
            self.abandon()
        finally:
            self._shutdown()

    def _read_tls_buffered(self) -> None:
        """Read connections whose decrypted bytes wait inside TLS, where select() cannot see them."""
        for conn in list(self._tls_buffered):
            self._tls_buffered.discard(conn)
            if conn.sock in self._conns:
                self._read(conn)

    def _dispatch(self, events: list[tuple[selectors.SelectorKey, int]]) -> None:
        # A method of its own: no variable of the loop in _run keeps a dropped connection alive.
        for key, mask in events:
            self._on_event(key.data, mask)

    def _on_event(self, data: object, mask: int) -> None:
        if data == "accept":
            self._accept()
        elif data == "wake":
            self._waker.drain()  # the loop queues and writes what the pokes were for
        elif isinstance(data, _ServerConn):
            if data.tls_pending:
                self._tls_handshake(data)
                return
            if mask & selectors.EVENT_READ:
                self._read(data)
            if mask & selectors.EVENT_WRITE and data.sock in self._conns:
                self._write(data)

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRNOS:
                    self._pause_accepting(exc)
                else:
                    self._logs.log(logging.WARNING, "accept", "%s: accept failed: %s", self.describe(), exc)
                return
            self._accept_backoff = _ACCEPT_BACKOFF_MIN_S
            peer = f"{addr[0]}:{addr[1]}"
            if len(self._conns) >= self._max_conns and not self._evict_unauthenticated():
                self.count("refused_connections")
                self._logs.log(
                    logging.WARNING,
                    "full",
                    "%s: refusing %s: %d connections, all authenticated, is the limit (%s)",
                    self.describe(),
                    peer,
                    self._max_conns,
                    STORM_SERVER_MAX_CONNECTIONS,
                )
                sock.close()
                continue
            self._admit(sock, peer)

    def _admit(self, sock: socket.socket, peer: str) -> None:
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._bufsize)
            if self._tls is not None:
                sock = wrap(self._tls, sock, server_side=True)
        except OSError as exc:  # e.g. the client reset the connection before it was accepted
            sock.close()
            self.count("protocol_errors")
            logger.debug("%s: dropping %s before its session began: %s", self.describe(), peer, exc)
            return
        conn = _ServerConn(sock, peer, time.monotonic() + self._handshake_s, self._tls is not None)
        conn.proto = ServerPeer(
            self,
            self._sessions,
            self._secret,
            peer,
            self._limits,
            functools.partial(self._reply_to, conn),
        )
        self._conns[sock] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)
        self.count("accepted")
        logger.debug("%s: accepted %s", self.describe(), peer)
        if conn.tls_pending:
            self._tls_handshake(conn)

    def _evict_unauthenticated(self) -> bool:
        """Make room by dropping the oldest connection still in its handshake; False if none."""
        for conn in self._conns.values():
            if not conn.proto.ready:
                self.count("evicted_connections")
                self._logs.log(
                    logging.WARNING,
                    "evict",
                    "%s: at %d connections (%s): dropping %s, which has not completed its handshake",
                    self.describe(),
                    self._max_conns,
                    STORM_SERVER_MAX_CONNECTIONS,
                    conn.peer,
                )
                self._drop(conn)
                return True
        return False

    def _pause_accepting(self, exc: OSError) -> None:
        # Out of file descriptors: the listener stays readable, so accepting again at once
        # would spin.  Stop watching it for a growing pause; deadlines free descriptors.
        self.count("accept_resource_errors")
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(self._listener)
        self._accept_paused_until = time.monotonic() + self._accept_backoff
        self._logs.log(
            logging.ERROR,
            "accept-resources",
            "%s: cannot accept connections: %s; pausing accept for %.2fs (%d connections open)",
            self.describe(),
            exc.strerror or exc,
            self._accept_backoff,
            len(self._conns),
        )
        self._accept_backoff = min(_ACCEPT_BACKOFF_MAX_S, self._accept_backoff * 2)

    def _tls_handshake(self, conn: _ServerConn) -> None:
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
            return
        except (ssl.SSLError, OSError) as exc:
            self.count("auth_failures" if isinstance(exc, ssl.SSLCertVerificationError) else "protocol_errors")
            self._logs.log(
                logging.WARNING, "tls", "%s: TLS handshake with %s failed: %s", self.describe(), conn.peer, str(exc)
            )
            self._drop(conn)
            return
        conn.tls_pending = False
        conn.last_read = time.monotonic()
        self._watch(conn, selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0))
        if sock.pending():
            self._tls_buffered.add(conn)

    def _recv(self, conn: _ServerConn) -> bytes | None:
        """Read what is there (None: nothing yet); TLS may need several records for one read."""
        sock = conn.sock
        if self._tls is None:
            try:
                return sock.recv(_READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return None
        parts: list[bytes] = []
        size = 0
        while size < _READ_SIZE:
            try:
                part = sock.recv(_READ_SIZE - size)
            except _WOULD_BLOCK:
                break
            if not part:
                if parts:
                    break  # process what came first; the next read sees the end
                return b""
            parts.append(part)
            size += len(part)
        if parts and isinstance(sock, ssl.SSLSocket) and sock.pending():
            self._tls_buffered.add(conn)
        return b"".join(parts) if parts else None

    def _read(self, conn: _ServerConn) -> None:
        try:
            data = self._recv(conn)
        except OSError as exc:
            # Exceptions are logged as text here: a log record holding one would keep its
            # traceback, and through it this connection and its buffers, alive.
            logger.info("%s: connection from %s failed: %s", self.describe(), conn.peer, str(exc))
            self._drop(conn)
            return
        if data is None:
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
        conn.last_read = time.monotonic()
        try:
            replies = conn.proto.on_bytes(data)
        except AuthenticationError as exc:
            self._reject(conn, exc, "auth_failures")
            return
        except WireFormatError as exc:
            self._reject(conn, exc, "protocol_errors")
            return
        except Exception as exc:  # a fault this peer's bytes reached: it loses its connection, not all others theirs
            self._logs.log(
                logging.ERROR,
                "fault",
                "%s: connection from %s failed: %r\n%s",
                self.describe(),
                conn.peer,
                exc,
                format_exc(),
            )
            self._reject(conn, WireFormatError(server_fault(exc)), "protocol_errors")
            return
        if conn.proto.closed_by_peer:
            self._drop(conn)
            return
        if replies:
            conn.out += b"".join(replies)
            self._dirty[conn] = None

    def _reject(self, conn: _ServerConn, exc: Exception, counter: str) -> None:
        self.count(counter)
        self._logs.log(
            logging.WARNING, counter, "%s: closing connection from %s: %s", self.describe(), conn.peer, str(exc)
        )
        with contextlib.suppress(OSError):  # the peer may be gone already; the reason is logged
            conn.sock.send(ServerPeer.failure_frame(exc.reason if isinstance(exc, AuthenticationError) else str(exc)))
        self._drop(conn)

    def _write(self, conn: _ServerConn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except _WOULD_BLOCK:
            sent = 0
        except OSError as exc:
            logger.info("%s: write to %s failed: %s", self.describe(), conn.peer, str(exc))
            self._drop(conn)
            return
        del conn.out[:sent]
        if len(conn.out) > self._max_frame:
            self._reject(conn, WireFormatError("it does not read the server's replies"), "protocol_errors")
            return
        self._watch(conn, selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0))

    def _watch(self, conn: _ServerConn, events: int) -> None:
        if events != conn.events:  # a syscall: only when it changes
            conn.events = events
            self._sel.modify(conn.sock, events, conn)

    def _reply_to(self, conn: _ServerConn, frame: bytes) -> None:
        # From any thread (acks come from executor threads): the I/O thread writes it.  On the
        # I/O thread itself (a group accepted while it was read) no wake is needed: the loop
        # writes what is queued before it selects again.
        self._directed.append((conn, frame))
        if not self._wake_pending and threading.current_thread() is not self._thread:
            self._wake_pending = True
            self._waker.poke()

    def _queue_commands(self) -> None:
        while self._directed:
            conn, frame = self._directed.popleft()
            if conn.sock in self._conns:
                conn.out += frame
                self._dirty[conn] = None
        while self._commands:
            frame = self._commands.popleft()
            for conn in self._conns.values():
                if conn.proto.ready and not conn.tls_pending:
                    conn.out += frame
                    self._dirty[conn] = None

    def _flush_dirty(self) -> None:
        # Once per turn of the loop, one send per connection: the replies to everything read in
        # this turn (receipts, acks of many groups) leave together.
        dirty, self._dirty = self._dirty, {}
        for conn in dirty:
            if conn.sock in self._conns:  # dropped meanwhile
                self._write(conn)

    def _sweep(self, now: float) -> None:
        """Drop connections past their handshake deadline or idle timeout; resume accepting."""
        idle = self._idle_s
        for conn in list(self._conns.values()):
            if not conn.proto.ready:
                if now > conn.deadline:
                    self._reject(conn, WireFormatError("handshake not completed in time"), "protocol_errors")
            elif idle is not None and now - conn.last_read > idle:
                self.count("idle_timeouts")
                self._logs.log(
                    logging.INFO,
                    "idle",
                    "%s: closing %s: nothing received for %.1fs (%s)",
                    self.describe(),
                    conn.peer,
                    now - conn.last_read,
                    STORM_SERVER_IDLE_TIMEOUT_MS,
                )
                self._drop(conn)
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._sel.register(self._listener, selectors.EVENT_READ, "accept")

    def _drop(self, conn: _ServerConn) -> None:
        self._conns.pop(conn.sock, None)
        self._tls_buffered.discard(conn)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()
        conn.out = bytearray()
        conn.proto.release()  # frees its buffers now and breaks the conn <-> peer cycle

    def _shutdown(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._listener.close()
        self._waker.close()
        self._sel.close()

    # --- state ------------------------------------------------------------------------
    def ready_clients(self) -> int:
        return sum(1 for c in list(self._conns.values()) if c.proto.ready)

    def metrics(self) -> dict[str, object]:
        out = super().metrics()
        conns = list(self._conns.values())
        out["connections"] = len(conns)
        out["buffered_bytes"] = sum(c.proto.buffered_bytes + len(c.out) for c in conns)
        return out


class TcpClient(SessionClient):
    """One client connection with its own I/O thread (connect, handshake, write, reconnect).

    Every attempt that does not end in a completed handshake (connect refused, TLS or
    session handshake failed, wrong secret) counts toward ``tcp.max_retries`` and waits the
    backoff; ``last_error`` says why.  A connection that was ready and then broke is
    retried at once, with a fresh count.
    """

    def __init__(self, context: Context, topology_id: str, host: str, port: int) -> None:
        super().__init__(context, topology_id, host, port, f"{host}:{port}")
        conf = context.conf
        self._flush_interval = conf.get_int(TCP_FLUSH_INTERVAL_MS, minimum=0) / 1000
        self._connect_timeout = conf.get_int(TCP_CONNECT_TIMEOUT_MS, minimum=1) / 1000
        self._max_retries = conf.get_int(TCP_MAX_RETRIES, minimum=-1)
        self._bufsize = conf.get_int(TCP_BUFFER_SIZE, minimum=4096)
        idle_ms = conf.get_int(STORM_SERVER_IDLE_TIMEOUT_MS, minimum=-1)
        self._keepalive_s = None if idle_ms <= 0 else idle_ms / 3000
        self._tls = client_context(conf)
        self._start(f"spark-storm-tcp-client-{self._peer}")

    # --- I/O thread -------------------------------------------------------------------
    def _run(self) -> None:
        attempt = 0
        try:
            while not self._closing.is_set():
                sock = self._connect()
                if sock is not None:
                    self._ready_once = False
                    try:
                        self._serve(sock)
                    except AuthenticationError as exc:
                        self._auth_failed(exc)
                    except ssl.SSLError as exc:
                        # With TLS 1.3 a server checks the client's certificate after the client
                        # finished its side of the handshake: a refusal shows up on the first read.
                        if self._ready_once:
                            self.last_error = f"{self._peer}: TLS: {exc}"
                        else:
                            why = f"TLS: the server closed the connection, or refused this client's certificate ({exc})"
                            self._auth_failed(exc, why)
                    except (ConnectionBrokenError, WireFormatError, OSError) as exc:
                        self.last_error = str(exc)
                        if self._ready_once and not self._closing.is_set():
                            logger.warning("%s: connection lost: %s; reconnecting", self.describe(), exc)
                    finally:
                        sock.close()
                        self._mark_connecting()
                    if self._ready_once:
                        attempt = 0
                        continue
                if self._closing.is_set():
                    break
                attempt += 1
                if 0 <= self._max_retries < attempt:
                    logger.error(
                        "%s: giving up after %d failed attempts (%s); last error: %s",
                        self.describe(),
                        attempt,
                        TCP_MAX_RETRIES,
                        self.last_error,
                    )
                    break
                delay = self._backoff.delay_ms(attempt - 1)
                logger.info(
                    "%s: attempt %d failed (%s); next in %d ms", self.describe(), attempt, self.last_error, delay
                )
                self._closing.wait(delay / 1000)
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
        if self._tls is not None:
            try:  # blocking, bounded by the connect timeout still set on the socket
                sock = wrap(self._tls, sock, server_side=False, server_hostname=self.host)
            except ssl.SSLCertVerificationError as exc:
                self._auth_failed(exc, f"TLS: the server's certificate was refused: {exc.verify_message or exc}")
                return None
            except (ssl.SSLError, OSError) as exc:
                self.last_error = f"{self._peer}: TLS handshake failed: {exc}"
                return None
        sock.setblocking(False)
        return sock

    def _serve(self, sock: socket.socket) -> None:
        proto = ClientProtocol(self, self._session, self._secret, self._peer, self._max_frame)
        out = bytearray(proto.hello())
        sel = selectors.DefaultSelector()
        watching = selectors.EVENT_READ | selectors.EVENT_WRITE
        sel.register(sock, watching, "sock")
        sel.register(self._waker.reader, selectors.EVENT_READ, "wake")
        handshake_deadline = time.monotonic() + self._handshake_s
        flush_at: float | None = None
        close_deadline: float | None = None
        keepalive_at: float | None = None
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
                    if keepalive_at is not None and now >= keepalive_at and not out:
                        out += _KEEPALIVE  # tells the server's idle timeout we are alive
                if out:
                    try:
                        sent = sock.send(out)
                    except _WOULD_BLOCK:
                        sent = 0
                    del out[:sent]
                    if sent and self._keepalive_s is not None:
                        keepalive_at = time.monotonic() + self._keepalive_s
                timeout = self._select_timeout(out, flush_at, close_deadline, handshake_deadline, proto.ready)
                if keepalive_at is not None:
                    timeout = max(0.0, min(timeout, keepalive_at - time.monotonic()))
                buffered = isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
                if buffered:
                    timeout = 0.0  # decrypted bytes wait inside the TLS layer, where select() cannot see them
                wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0)
                if wanted != watching:  # a syscall: only when it changes
                    watching = wanted
                    sel.modify(sock, wanted, "sock")
                events = sel.select(timeout)
                if buffered and not any(k.data == "sock" for k, _ in events):
                    self._read(sock, proto, out)
                for key, _mask in events:
                    if key.data == "wake":
                        self._waker.drain()
                        if flush_at is None:
                            flush_at = self._next_flush()
                    else:
                        self._read(sock, proto, out)
                if proto.ready and self._status is not ConnectionStatus.READY:
                    self._ready_once = True
                    self._mark_ready()
                    flush_at = time.monotonic()  # replay the resend buffer now
                    if self._keepalive_s is not None:
                        keepalive_at = flush_at + self._keepalive_s
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
        while True:
            try:
                data = sock.recv(_READ_SIZE)
            except _WOULD_BLOCK:
                return
            if not data:
                msg = f"server {self._peer} closed the connection"
                raise ConnectionBrokenError(msg)
            for reply in proto.on_bytes(data):
                out += reply
            self._received += 1
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                return

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

    def _new_server(self, topology_id: str, port: int, callback: CallbackLike | None) -> IServer:
        return TcpServer(self, topology_id, port, callback)

    def _new_client(self, topology_id: str, host: str, port: int) -> IClient:
        return TcpClient(self, topology_id, host, port)
