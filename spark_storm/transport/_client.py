"""What the tcp and zmq clients share: the caller-facing half of a session client.

A subclass owns the I/O thread (``_run``): it connects, runs a :class:`ClientProtocol`,
writes what :meth:`ClientSession.take_outbox` hands it, and calls :meth:`_mark_ready`,
:meth:`_mark_connecting` and finally :meth:`_finish`.  Everything a caller's thread
touches (send, flush, status, metrics, close) lives here, once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from spark_storm.backoff import backoff_from_conf
from spark_storm.config import (
    STORM_GROUP_MAX_BYTES,
    STORM_GROUP_MAX_FRAMES,
    STORM_HANDSHAKE_TIMEOUT_MS,
    STORM_MAX_FRAME_BYTES,
    TCP_BATCH_BYTES,
    TCP_FLUSH_TIMEOUT_MS,
    Config,
)
from spark_storm.errors import ConnectionBrokenError, ConnectionClosedError, TransportError
from spark_storm.messaging.api import IClient
from spark_storm.messaging.message import ConnectionStatus, TaskMessage
from spark_storm.messaging.wire import BatchCommit, BatchHeader, ControlRequest, LoadMetrics, encode_control
from spark_storm.transport._base import ClientBase, as_batch
from spark_storm.transport._session import ClientSession
from spark_storm.transport._wake import Waker

__all__ = ["SessionClient", "check_group_size"]

logger = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 5.0


def check_group_size(header: BatchHeader, messages: Sequence[TaskMessage], max_frames: int, max_bytes: int) -> None:
    """Refuse, before anything is sent, a group the server would refuse as too big.

    Raises
    ------
    TransportError
        Over ``storm.messaging.server.group.max.frames`` or ``.max.bytes``.
    """
    size = sum(len(m[1]) for m in messages)
    if len(messages) > max_frames or size > max_bytes:
        msg = (
            f"group {header.key} has {len(messages)} messages of {size} bytes; servers assemble at most "
            f"{max_frames} messages ({STORM_GROUP_MAX_FRAMES}) of {max_bytes} bytes ({STORM_GROUP_MAX_BYTES}): "
            "send smaller groups or raise both keys on both sides"
        )
        raise TransportError(msg)


class _Owner(Protocol):
    conf: Config

    def forget(self, conn: IClient) -> None: ...


class SessionClient(ClientBase):
    """Base of the socket clients: session, status, wake-ups and the caller-side calls."""

    def __init__(self, context: _Owner, topology_id: str, host: str, port: int, peer: str) -> None:
        super().__init__(topology_id, host, port)
        conf = context.conf
        self._context = context
        self._peer = peer
        self._session = ClientSession.from_conf(conf, peer)
        self._secret = conf.auth_secret()
        self._max_frame = conf.get_int(STORM_MAX_FRAME_BYTES, minimum=64)
        self._group_max_frames = conf.get_int(STORM_GROUP_MAX_FRAMES, minimum=1)
        self._group_max_bytes = conf.get_int(STORM_GROUP_MAX_BYTES, minimum=1)
        self._batch_bytes = conf.get_int(TCP_BATCH_BYTES, minimum=1)
        self._handshake_s = conf.get_int(STORM_HANDSHAKE_TIMEOUT_MS, minimum=1) / 1000
        self._flush_timeout = conf.get_int(TCP_FLUSH_TIMEOUT_MS, minimum=0) / 1000
        self._backoff = backoff_from_conf(conf)
        self._status = ConnectionStatus.CONNECTING
        self._status_cond = threading.Condition()
        self._closing = threading.Event()
        self._control_out: deque[bytes] = deque()
        self._waker = Waker()
        self._wake_pending = False
        self._reconnects = 0
        self._connects = 0
        self._received = 0
        self._auth_failures = 0
        self._ready_once = False  # the current attempt completed its handshake
        self.last_error: str | None = None
        self._thread: threading.Thread | None = None

    def _start(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    # --- status, for the I/O thread -------------------------------------------------
    @property
    def status(self) -> ConnectionStatus:
        return self._status

    def _set_status(self, status: ConnectionStatus) -> None:
        with self._status_cond:
            self._status = status
            self._status_cond.notify_all()

    def _mark_ready(self) -> None:
        if self._connects:
            self._reconnects += 1
        self._connects += 1
        self.last_error = None
        self._set_status(ConnectionStatus.READY)
        logger.info("%s: ready", self.describe())

    def _auth_failed(self, exc: BaseException, text: str | None = None) -> None:
        """Record a refused handshake: it counts as a failed attempt, and ``last_error`` says so."""
        self._auth_failures += 1
        why = text or str(exc)  # a server's refusal is worded already (handshake.refused)
        self.last_error = why if why.startswith("authentication failed: ") else f"authentication failed: {why}"
        logger.error("%s: %s", self.describe(), self.last_error)

    def _mark_connecting(self) -> None:
        self.link_lost()
        if self._status is ConnectionStatus.READY:
            self._set_status(ConnectionStatus.CONNECTING)

    def _finish(self) -> None:
        """Close the session, log what could not be delivered, and report CLOSED."""
        self.link_lost()
        lost = self._session.close()
        if lost:
            logger.error(
                "%s closed with %d messages not acknowledged by the server (counted as lost)",
                self.describe(),
                lost,
            )
        self._set_status(ConnectionStatus.CLOSED)
        self._waker.close()

    # --- caller threads -------------------------------------------------------------
    def send(self, messages: TaskMessage | Iterable[TaskMessage]) -> None:
        batch = as_batch(messages)
        if not batch:
            return
        if self._status is ConnectionStatus.CLOSED:
            why = f" ({self.last_error})" if self.last_error else ""
            msg = f"send on closed {self.describe()}{why}"
            raise ConnectionClosedError(msg)
        waiting, was_empty = self._session.admit(batch)
        # Wake the writer when it may be idle (first chunk) or a full batch is waiting;
        # the flag saves a syscall per send while a wake is already on its way.
        if (was_empty or waiting >= self._batch_bytes) and not self._wake_pending:
            self._wake_pending = True
            self._waker.poke()

    def send_group(self, header: BatchHeader, messages: Sequence[TaskMessage]) -> None:
        if len(messages) != header.count:
            msg = f"group {header.key} announces {header.count} messages but {len(messages)} were given"
            raise ValueError(msg)
        check_group_size(header, messages, self._group_max_frames, self._group_max_bytes)
        if self._status is ConnectionStatus.CLOSED:
            msg = f"send_group on closed {self.describe()}"
            raise ConnectionClosedError(msg)
        self.group_sent(header.key)
        self.clear_ack(header.key)
        waiting, was_empty = self._session.admit(messages, header)
        if (was_empty or waiting >= self._batch_bytes) and not self._wake_pending:
            self._wake_pending = True
            self._waker.poke()

    def send_commit(self, query_id: str, batch_id: int) -> None:
        if self._status is ConnectionStatus.CLOSED:
            msg = f"send_commit on closed {self.describe()}"
            raise ConnectionClosedError(msg)
        self._control_out.append(encode_control(BatchCommit(query_id, batch_id)))
        self._waker.poke()

    def _send_request(self, frame: ControlRequest) -> None:
        if self._status is ConnectionStatus.CLOSED:
            msg = f"request on closed {self.describe()}"
            raise ConnectionClosedError(msg)
        if self._status is not ConnectionStatus.READY:
            # Requests are not kept for a reconnect: a restarted server must not get a stale one.
            msg = f"request to {self.describe()}, which is not connected ({self.last_error or 'connecting'})"
            raise ConnectionBrokenError(msg)
        self._control_out.append(encode_control(frame))
        self._waker.poke()

    def send_load_metrics(self, loads: Mapping[int, float]) -> None:
        if self._status is ConnectionStatus.CLOSED:
            msg = f"send_load_metrics on closed {self.describe()}"
            raise ConnectionClosedError(msg)
        self._control_out.append(encode_control(LoadMetrics(dict(loads))))
        self._waker.poke()

    def flush(self, timeout: float | None = None) -> bool:
        self._wake_pending = True
        self._waker.poke()
        return self._session.wait_acked(timeout)

    def wait_ready(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._status_cond:
            while self._status is ConnectionStatus.CONNECTING:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._status_cond.wait(remaining)
            return self._status is ConnectionStatus.READY

    def metrics(self) -> dict[str, Any]:
        s = self._session
        return {
            "sent": s.sent,
            "received": self._received,
            "lost": s.lost,
            "pending": s.pending,
            "pending_bytes": s.pending_bytes,
            "resent": s.resent,
            "blocked": s.blocked,
            "reconnects": self._reconnects,
            "auth_failures": self._auth_failures,
            "dest": self._peer,
            "src": self.topology_id,
            "status": self._status.value,
            "last_error": self.last_error,
        }

    def close(self) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        self._waker.poke()
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join(self._flush_timeout + JOIN_TIMEOUT_S)
        self._context.forget(self)
