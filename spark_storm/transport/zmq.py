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

Security.  Authentication belongs to the connection, not to a name: with a shared secret
(or explicit CURVE keys, see :mod:`spark_storm.transport.curve`) every connection runs
libzmq's CURVE mechanism and a ZAP handler admits only allowed client keys, so a peer
without them never gets a byte through.  Routing ids are assigned by the ROUTER per
connection (clients set none, ``ROUTER_HANDOVER`` is off), so no peer can claim another's
state; a peer's state is dropped as soon as its connection is gone (socket monitor plus a
``ROUTER_MANDATORY`` probe).  Messages are limited to one frame's size (``MAXMSGSIZE``,
enforced by libzmq before it allocates) and 64 control frames, and an unauthenticated peer
may send only handshake-sized data.

Each socket is used by exactly one thread (its I/O thread); other threads reach it
through a deque and a wake-up socketpair that the zmq poller watches.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import math
import os
import random
import tempfile
import threading
import time
from collections import OrderedDict, deque
from traceback import format_exc
from typing import Any, ClassVar

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from spark_storm.config import (
    STORM_BIND_HOST,
    STORM_HANDSHAKE_TIMEOUT_MS,
    STORM_LOCAL_MODE_ZMQ,
    STORM_SERVER_IDLE_TIMEOUT_MS,
    STORM_SERVER_MAX_CONNECTIONS,
    STORM_SERVER_SESSIONS_MAX,
    TCP_MAX_RETRIES,
    ZMQ_HWM,
    ZMQ_IPC_DIR,
    ZMQ_LINGER_MILLIS,
    ZMQ_THREADS,
    Config,
)
from spark_storm.errors import (
    AuthenticationError,
    ConnectionBrokenError,
    TransportError,
    WireFormatError,
)
from spark_storm.messaging.api import CallbackLike, IClient, IServer
from spark_storm.messaging.handshake import NO_SECRET, WRONG_SECRET, refused
from spark_storm.messaging.message import ConnectionStatus
from spark_storm.messaging.wire import HEADER_SIZE, Close, encode_control, split_at_frames
from spark_storm.netutil import FIRST_EPHEMERAL_PORT
from spark_storm.transport._base import TrackingContext
from spark_storm.transport._client import JOIN_TIMEOUT_S, SessionClient
from spark_storm.transport._server import IOThreadServer, LogLimiter, warn_if_open
from spark_storm.transport._session import (
    MAX_CONTROLS_PER_MESSAGE,
    ClientProtocol,
    PeerLimits,
    ServerPeer,
    SessionTable,
    server_fault,
)
from spark_storm.transport.curve import CurveKeys, curve_keys

__all__ = ["Context"]

logger = logging.getLogger(__name__)

_ZAP_DOMAIN = "spark-storm"
_CLIENT_EVENTS = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_SERVER_EVENTS = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
    zmq.EVENT_HANDSHAKE_FAILED_AUTH,
)
# After a disconnect the ROUTER forgets the peer's routing id once its last messages are
# read: probe again a little later, and now and then anyway.
_PROBE_DELAYS_S = (0.0, 0.05, 0.5)
_PROBE_EVERY_S = 5.0


def message_limit(max_frame_bytes: int) -> int:
    """Largest zmq message: one frame of the largest size (clients split bigger chunks)."""
    return max_frame_bytes + HEADER_SIZE


class ZmqServer(IOThreadServer):
    """A ROUTER socket and the I/O thread that serves its clients."""

    def __init__(self, context: Context, topology_id: str, port: int, callback: CallbackLike | None) -> None:
        conf = context.conf
        server_keys = context.curve.for_server() if context.curve is not None else None  # fails before opening
        super().__init__(context, conf, topology_id, callback)
        self._secret = conf.auth_secret()
        self._limits = PeerLimits.from_conf(conf)
        self._sessions = SessionTable(conf.get_int(STORM_SERVER_SESSIONS_MAX, minimum=1))
        self._max_peers = conf.get_int(STORM_SERVER_MAX_CONNECTIONS, minimum=1)
        self._peers: OrderedDict[bytes, ServerPeer] = OrderedDict()
        # Peers in their session handshake, oldest first, with their deadline (I/O thread only).
        self._handshake_due: OrderedDict[bytes, float] = OrderedDict()
        self._handshake_s = context.handshake_ms / 1000
        self._logs = LogLimiter(logger)
        self._allowed: frozenset[bytes] | None = None
        sock = context.zmq.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, context.linger_ms)
        sock.setsockopt(zmq.RCVHWM, context.hwm)
        sock.setsockopt(zmq.SNDHWM, context.hwm)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 0)  # a claimed routing id never takes over a connection
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a gone peer fails: we then drop its state
        sock.setsockopt(zmq.MAXMSGSIZE, message_limit(self._limits.max_frame_bytes))
        sock.setsockopt(zmq.HANDSHAKE_IVL, context.handshake_ms)
        if context.heartbeat_ms > 0:
            sock.setsockopt(zmq.HEARTBEAT_IVL, context.heartbeat_ms)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, context.heartbeat_ms * 3)
        if server_keys is not None:
            server_secret, self._allowed = server_keys
            context.start_zap(self._allowed)
            sock.setsockopt(zmq.CURVE_SERVER, 1)
            sock.setsockopt(zmq.CURVE_SECRETKEY, server_secret)
            sock.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN.encode())
        self._monitor = sock.get_monitor_socket(_SERVER_EVENTS)
        try:
            self._endpoint, self._port = context.bind_socket(sock, topology_id, port)
        except zmq.ZMQError as exc:
            sock.disable_monitor()
            self._monitor.close(0)
            sock.close(0)
            self._waker.close()
            msg = f"cannot bind {topology_id} on port {port}: {exc}"
            raise TransportError(msg) from exc
        self._sock = sock
        self._directed: deque[tuple[bytes, bytes]] = deque()
        self._probe_at: list[float] = []
        self._next_probe = time.monotonic() + _PROBE_EVERY_S
        self._thread = threading.Thread(target=self._run, name=f"spark-storm-zmq-server-{self._port}", daemon=True)
        self._thread.start()
        logger.info("zmq server for %s bound at %s%s", topology_id, self._endpoint, " (CURVE)" if server_keys else "")

    @property
    def port(self) -> int:
        return self._port

    def describe(self) -> str:
        return f"zmq server {self.topology_id}@{self._endpoint}"

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        poller.register(self._waker.reader.fileno(), zmq.POLLIN)
        try:
            while not self.closed:
                now = time.monotonic()
                next_due = self._expire_handshakes(now)
                wait = min(self._next_probe, next_due, *self._probe_at) - now
                events = dict(poller.poll(max(0, min(500, int(wait * 1000) + 1))))
                if self._waker.reader.fileno() in events:
                    self._waker.drain()
                    self._broadcast()
                if self._monitor in events:
                    self._on_monitor()
                if self._sock in events:
                    self._read_some()
                if self._directed:
                    self._broadcast()
                now = time.monotonic()
                if now >= self._next_probe or any(t <= now for t in self._probe_at):
                    self._probe_at = [t for t in self._probe_at if t > now]
                    self._next_probe = now + _PROBE_EVERY_S
                    self._probe_peers()
        except zmq.ContextTerminated:
            pass
        except Exception as exc:
            logger.exception("%s: I/O thread failed (%r); closing the server", self.describe(), exc)
            self.abandon()
        finally:
            for peer in self._peers.values():
                peer.release()
            self._peers.clear()
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._sock.close()
            self._waker.close()

    def _read_some(self) -> None:
        for _ in range(256):  # bounded, so commands and close are not starved
            try:
                parts = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(parts) != 2:
                self.count("protocol_errors")
                continue
            self._on_message(parts[0].bytes, parts[1])

    def _on_monitor(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind == zmq.EVENT_DISCONNECTED:
                now = time.monotonic()
                self._probe_at = [now + d for d in _PROBE_DELAYS_S]
            elif kind in _HANDSHAKE_FAILED:
                # Without CURVE no key is checked: a peer that is not zmq, or went away, failed it.
                curve = self._allowed is not None
                self.count("auth_failures" if curve else "protocol_errors")
                self._logs.log(
                    logging.WARNING,
                    "zmtp",
                    "%s: refused a connection in the ZMTP%s handshake (%s, code %s): %s",
                    self.describe(),
                    "/CURVE" if curve else "",
                    zmq.Event(kind).name,
                    int(event["value"]),
                    "wrong or missing key" if curve else "not a zmq peer, or it went away",
                )

    def _on_message(self, ident: bytes, frame: zmq.Frame) -> None:
        label = f"zmq peer {ident.hex()[:10]}"
        if self._allowed is not None and _user_id(frame) not in self._allowed:
            # CURVE admits only allowed keys (ZAP); this holds even if the ZAP handler failed.
            self.count("auth_failures")
            self._logs.log(
                logging.ERROR, "user-id", "%s: dropping a message from unauthenticated %s", self.describe(), label
            )
            return
        peer = self._peers.get(ident)
        if peer is None:
            peer = ServerPeer(
                self,
                self._sessions,
                self._secret,
                label,
                self._limits,
                functools.partial(self._reply_later, ident),
                message_controls=MAX_CONTROLS_PER_MESSAGE,
            )
            self._make_room()
            self._peers[ident] = peer
            self._handshake_due[ident] = time.monotonic() + self._handshake_s
            self.count("accepted")
        else:
            self._peers.move_to_end(ident)
        try:
            replies = peer.on_bytes(frame.bytes)
            peer.check_eof()  # a zmq message holds whole frames; leftovers mean truncation
        except (AuthenticationError, WireFormatError) as exc:
            counter = "auth_failures" if isinstance(exc, AuthenticationError) else "protocol_errors"
            self.count(counter)
            self._logs.log(logging.WARNING, counter, "%s: refusing %s: %s", self.describe(), label, str(exc))
            self._forget(ident)
            told = exc.reason if isinstance(exc, AuthenticationError) else str(exc)
            self._reply(ident, ServerPeer.failure_frame(told))
            return
        except Exception as exc:  # a fault this peer's bytes reached: it loses its state, not all others theirs
            self.count("protocol_errors")
            self._logs.log(
                logging.ERROR, "fault", "%s: message from %s failed: %r\n%s", self.describe(), label, exc, format_exc()
            )
            self._forget(ident)
            self._reply(ident, ServerPeer.failure_frame(server_fault(exc)))
            return
        if peer.ready:
            self._handshake_due.pop(ident, None)
        if peer.closed_by_peer:
            self._forget(ident)
        if replies:
            self._reply(ident, b"".join(replies))

    def _make_room(self) -> None:
        while len(self._peers) >= self._max_peers:
            victim = next((i for i, p in self._peers.items() if not p.ready), None)
            if victim is None:
                victim = next(iter(self._peers))
            self.count("evicted_connections")
            self._logs.log(
                logging.WARNING,
                "evict",
                "%s: %d peers (%s): forgetting the state of %s",
                self.describe(),
                self._max_peers,
                STORM_SERVER_MAX_CONNECTIONS,
                "one in its handshake" if not self._peers[victim].ready else "the least recently active one",
            )
            self._forget(victim)

    def _forget(self, ident: bytes) -> None:
        self._handshake_due.pop(ident, None)
        peer = self._peers.pop(ident, None)
        if peer is not None:
            peer.release()

    def _expire_handshakes(self, now: float) -> float:
        """Forget peers whose session handshake did not complete in time, as tcp closes them.

        Returns the next deadline (infinity when no peer is in its handshake).
        """
        while self._handshake_due:
            ident, deadline = next(iter(self._handshake_due.items()))
            if deadline > now:
                return deadline
            self.count("protocol_errors")
            self._logs.log(
                logging.WARNING,
                "handshake",
                "%s: forgetting zmq peer %s: handshake not completed in time (%s)",
                self.describe(),
                ident.hex()[:10],
                STORM_HANDSHAKE_TIMEOUT_MS,
            )
            self._forget(ident)
            self._reply(ident, ServerPeer.failure_frame("handshake not completed in time"))
        return math.inf

    def _probe_peers(self) -> None:
        """Drop the state of every peer whose connection is gone (the ROUTER no longer knows it)."""
        for ident in list(self._peers):
            self._reply(ident, b"")

    def _reply(self, ident: bytes, data: bytes) -> None:
        try:
            self._sock.send_multipart([ident, data], zmq.NOBLOCK)
        except zmq.Again:
            if data:
                self._logs.log(
                    logging.WARNING,
                    "hwm",
                    "%s: reply to a client dropped: its queue is full (zmq.hwm)",
                    self.describe(),
                )
        except zmq.ZMQError as exc:
            if exc.errno != errno.EHOSTUNREACH:
                raise
            if ident in self._peers:
                logger.debug("%s: peer %s is gone; dropping its state", self.describe(), ident.hex()[:10])
                self.count("disconnects")
                self._forget(ident)

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

    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        peers = list(self._peers.values())
        out["connections"] = len(peers)
        out["buffered_bytes"] = sum(p.buffered_bytes for p in peers)
        return out


def _user_id(frame: zmq.Frame) -> bytes:
    try:
        return str(frame.get("User-Id")).encode()
    except zmq.ZMQError:  # no such property: not authenticated by ZAP
        return b""


class ZmqClient(SessionClient):
    """A DEALER socket with its own I/O thread; zmq reconnects, we re-handshake and resend.

    Every connection attempt that fails (connect retried, ZMTP/CURVE handshake refused, or
    our handshake refused) counts toward ``tcp.max_retries``; libzmq backs off between
    reconnects (``RECONNECT_IVL`` .. ``RECONNECT_IVL_MAX`` from the tcp wait keys) and our
    handshake retries wait the same backoff.  ``last_error`` says why.
    """

    def __init__(self, context: Context, topology_id: str, host: str, port: int) -> None:
        endpoint = context.endpoint_for(topology_id, host, port)
        super().__init__(context, topology_id, host, port, endpoint)
        self._endpoint = endpoint
        self._max_retries = context.conf.get_int(TCP_MAX_RETRIES, minimum=-1)
        self._msg_limit = message_limit(self._max_frame)
        self._curve = context.curve is not None
        self._curve_derived = context.curve is not None and context.curve.derived
        sock = context.zmq.socket(zmq.DEALER)
        # No ROUTING_ID: the server names each connection itself, so no peer can claim another's.
        sock.setsockopt(zmq.LINGER, context.linger_ms)
        sock.setsockopt(zmq.SNDHWM, context.hwm)
        sock.setsockopt(zmq.RCVHWM, context.hwm)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, self._msg_limit)
        sock.setsockopt(zmq.RECONNECT_IVL, max(1, self._backoff.min_ms))
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, max(1, self._backoff.max_ms))
        sock.setsockopt(zmq.HANDSHAKE_IVL, context.handshake_ms)
        if context.curve is not None:
            server_public, client_public, client_secret = context.curve.for_client()
            sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, client_public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, client_secret)
        self._monitor = sock.get_monitor_socket(_CLIENT_EVENTS)
        sock.connect(endpoint)
        self._sock = sock
        self._attempts = 0
        # I/O thread state: the handshake of the current connection, and what waits to be sent.
        self._proto: ClientProtocol | None = None
        self._connected = False
        self._zmtp_ok = False
        self._tcp_connected = False
        self._reconnect_at: float | None = None
        self._retry_at: float | None = None
        self._out: deque[bytes] = deque()
        self._last_logged: str | None = None
        self._start(f"spark-storm-zmq-client-{endpoint}")

    def describe(self) -> str:
        return f"zmq client to {self._endpoint} ({self.topology_id})"

    # --- I/O thread -------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        poller.register(self._waker.reader.fileno(), zmq.POLLIN)
        hs_deadline = 0.0
        close_deadline: float | None = None
        out = self._out
        try:
            while not self._gave_up():
                now = time.monotonic()
                if self._closing.is_set():
                    if self._proto is None or not self._proto.ready:
                        break
                    if close_deadline is None:
                        close_deadline = now + self._flush_timeout
                    if (self._session.pending == 0 and not out) or now > close_deadline:
                        while self._control_out:  # e.g. a commit sent just before close()
                            self._try_send(self._control_out.popleft())
                        self._try_send(encode_control(Close()))
                        break
                self._maybe_reconnect(now)
                proto = self._proto
                if self._connected and (proto is None or (self._retry_at is not None and now >= self._retry_at)):
                    proto = self._proto = ClientProtocol(self, self._session, self._secret, self._peer, self._max_frame)
                    out.clear()
                    out.append(proto.hello())
                    hs_deadline = now + self._handshake_s
                    self._retry_at = None
                elif proto is not None and not proto.ready and self._retry_at is None and now > hs_deadline:
                    self.last_error = f"handshake with {self._peer} timed out"
                    self._failed_attempt()
                    self._retry_at = now
                    continue
                if proto is not None and proto.ready:
                    self._wake_pending = False
                    while self._control_out:
                        out.append(self._control_out.popleft())
                    for chunk in self._session.take_outbox():  # one zero-copy message a batch
                        out.extend(split_at_frames(chunk, self._msg_limit))
                while out:
                    if not self._try_send(out[0]):
                        break
                    out.popleft()
                poller.modify(self._sock, zmq.POLLIN | (zmq.POLLOUT if out else 0))
                timeout_ms = 1000 if close_deadline is None else 20
                if proto is not None and not proto.ready:
                    until = (self._retry_at if self._retry_at is not None else hs_deadline) - time.monotonic()
                    timeout_ms = max(0, min(timeout_ms, int(until * 1000) + 1))
                if self._reconnect_at is not None:
                    timeout_ms = max(0, min(timeout_ms, int((self._reconnect_at - time.monotonic()) * 1000) + 1))
                events = dict(poller.poll(timeout_ms))
                if self._waker.reader.fileno() in events:
                    self._waker.drain()
                if self._monitor in events:
                    self._on_monitor()
                if self._sock in events and events[self._sock] & zmq.POLLIN:
                    try:
                        self._read_all()
                    except (ConnectionBrokenError, WireFormatError) as exc:
                        self.last_error = str(exc)
                        logger.warning("%s: %s; handshaking again", self.describe(), exc)
                        self._proto = None
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

    def _gave_up(self) -> bool:
        if 0 <= self._max_retries < self._attempts:
            logger.error(
                "%s: giving up after %d failed attempts (%s); last error: %s",
                self.describe(),
                self._attempts,
                TCP_MAX_RETRIES,
                self.last_error,
            )
            return True
        return False

    def _failed_attempt(self) -> None:
        self._attempts += 1

    def _try_send(self, data: bytes) -> bool:
        try:
            self._sock.send(data, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True

    def _on_monitor(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind == zmq.EVENT_CONNECTED:
                self._zmtp_ok = False
                self._tcp_connected = True
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._zmtp_ok = True
                self._connected = True
                self._proto = None  # a fresh transport connection: handshake again
            elif kind in _HANDSHAKE_FAILED:
                self._zmtp_refused(self._refusal_reason(kind, int(event["value"])))
            elif kind == zmq.EVENT_CONNECT_RETRIED:
                if not self._tcp_connected:  # this connect failed (a failed handshake was counted already)
                    self._failed_attempt()
                    if self.last_error is None:
                        self.last_error = f"{self._peer}: not reachable (zmq retries)"
                self._tcp_connected = False
            elif kind == zmq.EVENT_DISCONNECTED:
                self._connected = False
                self._proto = None
                if self._status is ConnectionStatus.READY:
                    logger.warning("%s: disconnected; zmq reconnects, we will resend", self.describe())
                elif not self._zmtp_ok and self._curve and self._reconnect_at is None:
                    self._zmtp_refused(self._curve_mismatch())
                self._mark_connecting()

    def _refusal_reason(self, kind: int, value: int) -> str:
        if not self._curve:
            return NO_SECRET  # the server requires CURVE
        if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return "it does not use CURVE (no shared secret or keys) while this client does"
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH and not self._curve_derived:
            return f"CURVE: this client's key is not allowed (ZAP status {value})"
        return self._curve_mismatch()

    def _curve_mismatch(self) -> str:
        # With keys derived from the secret, a key the server does not accept means another secret:
        # the same reason the tcp and kafka servers give (handshake.WRONG_SECRET).
        if self._curve_derived:
            return WRONG_SECRET
        return "the CURVE handshake failed: wrong server key, or this client's key is not allowed"

    def _zmtp_refused(self, why: str) -> None:
        """Count a refused ZMTP/CURVE handshake as a failed attempt; reconnect after the backoff.

        libzmq would reconnect at once (its interval grows only across failed connects), so
        the endpoint is disconnected and connected again when the backoff has passed.
        """
        if self._reconnect_at is not None:
            return  # this connection's failure is counted already
        self._failed_attempt()
        self._auth_failures += 1
        self.last_error = refused(self._peer, why)
        if self._last_logged != self.last_error:  # say it once, not at every retry
            self._last_logged = self.last_error
            logger.error("%s: %s", self.describe(), self.last_error)
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disconnect(self._endpoint)
        self._reconnect_at = time.monotonic() + self._backoff.delay_ms(self._attempts - 1) / 1000

    def _maybe_reconnect(self, now: float) -> None:
        if self._reconnect_at is not None and now >= self._reconnect_at:
            self._reconnect_at = None
            self._tcp_connected = False
            self._sock.connect(self._endpoint)

    def _read_all(self) -> None:
        while True:
            try:
                data = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._received += 1
            proto = self._proto
            if proto is None or not data:
                continue  # a reply to a handshake we already abandoned, or the server's liveness probe
            try:
                self._out.extend(proto.on_bytes(data))
            except AuthenticationError as exc:
                self._failed_attempt()
                self._auth_failed(exc)
                self._retry_at = time.monotonic() + self._backoff.delay_ms(self._attempts - 1) / 1000
                return
            if proto.ready and self._status is not ConnectionStatus.READY:
                self._attempts = 0
                self._mark_ready()


class _AllowedKeys:
    """ZAP credentials check: a CURVE client is admitted when its public key is allowed."""

    def __init__(self, allowed: frozenset[bytes]) -> None:
        self._allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self._allowed


class Context(TrackingContext):
    """The zmq transport's context: one ``zmq.Context`` and the connections made with it."""

    alias: ClassVar[str] = "zmq"
    crosses_processes: ClassVar[bool] = True

    def __init__(self, conf: Config) -> None:
        super().__init__(conf)
        self.curve: CurveKeys | None = curve_keys(conf)  # fails now, naming the key, when one is bad
        self.handshake_ms = conf.get_int(STORM_HANDSHAKE_TIMEOUT_MS, minimum=1)
        idle_ms = conf.get_int(STORM_SERVER_IDLE_TIMEOUT_MS, minimum=-1)
        self.heartbeat_ms = idle_ms // 3 if idle_ms > 0 else 0
        self._zap: ThreadAuthenticator | None = None
        self._zap_lock = threading.Lock()
        self.zmq = zmq.Context(io_threads=conf.get_int(ZMQ_THREADS, minimum=1))
        self.linger_ms = conf.get_int(ZMQ_LINGER_MILLIS, minimum=-1)
        self.hwm = conf.get_int(ZMQ_HWM, minimum=0)
        self.local_mode = conf.get_bool(STORM_LOCAL_MODE_ZMQ)
        self.bind_host = conf.get_str(STORM_BIND_HOST)
        self._ipc_dir = conf.get_optional_str(ZMQ_IPC_DIR) or tempfile.gettempdir()

    def start_zap(self, allowed: frozenset[bytes]) -> None:
        """Run the context's ZAP handler (once): it admits CURVE clients whose key is in ``allowed``."""
        with self._zap_lock:
            if self._zap is not None:
                return
            zap = ThreadAuthenticator(self.zmq, log=logging.getLogger(f"{__name__}.zap"))
            zap.start()
            zap.configure_curve_callback(_ZAP_DOMAIN, _AllowedKeys(allowed))
            self._zap = zap

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
                    port = rng.randrange(FIRST_EPHEMERAL_PORT, 65536)
                    if not os.path.exists(self._ipc_endpoint(topology_id, port)[6:]):
                        break
            endpoint = self._ipc_endpoint(topology_id, port)
            sock.bind(endpoint)
            return endpoint, port
        host = self.bind_host
        warn_if_open(logger, topology_id, host, self.conf.auth_secret() is not None)
        shown = f"[{host}]" if ":" in host else host
        if port == 0:
            bound = sock.bind_to_random_port(f"tcp://{shown}", min_port=20000, max_port=65000, max_tries=200)
            return f"tcp://{shown}:{bound}", bound
        sock.bind(f"tcp://{shown}:{port}")
        return f"tcp://{shown}:{port}", port

    def _new_server(self, topology_id: str, port: int, callback: CallbackLike | None) -> IServer:
        return ZmqServer(self, topology_id, port, callback)

    def _new_client(self, topology_id: str, host: str, port: int) -> IClient:
        return ZmqClient(self, topology_id, host, port)

    def _release(self) -> None:
        # Every socket was closed by its own thread; term() returns once they are.
        with self._zap_lock:
            zap, self._zap = self._zap, None
        if zap is not None:
            zap.stop()
        done = threading.Thread(target=self.zmq.term, name="spark-storm-zmq-term", daemon=True)
        done.start()
        done.join(JOIN_TIMEOUT_S)
        if done.is_alive():
            logger.error("zmq context did not terminate within %.0fs; a socket was left open", JOIN_TIMEOUT_S)
