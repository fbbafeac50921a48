"""The messaging contracts: IContext, IConnection (IServer, IClient), IConnectionCallback.

These are Storm's ``org.apache.storm.messaging`` interfaces with Python names.  A transport
(``spark_storm.transport.*``) implements :class:`IContext`; the worker uses only these
types, so transports can be swapped by configuration.

Client versus server
--------------------
Storm has one ``IConnection`` for both ends, and each end stubs out the other's calls
("SHOULD NOT HAPPEN").  Here :class:`IConnection` holds only what both ends do, and each
end adds its own: ``bind`` returns an :class:`IServer`, ``connect`` an :class:`IClient`.

================================  ===================================================
IConnection (both ends)           port, status, send_load_metrics, get_load, metrics, close
IServer (``bind``)                register_recv, recv, recv_batch, send_backpressure_status
IClient (``connect``)             send, send_group, wait_acks, send_commit, request,
                                  flush, wait_ready, backpressure_tasks
================================  ===================================================
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, Final, Self

from spark_storm.messaging.message import BackpressureStatus, ConnectionStatus, MessageBatch, TaskMessage
from spark_storm.messaging.wire import ACCEPTED, BatchHeader

#: (query id, batch id, partition, sequence) of a delivery group.
GroupKey = tuple[str, int, int, int]

__all__ = [
    "RECV_BLOCK",
    "RECV_NOBLOCK",
    "REQUEST_BUSY",
    "REQUEST_FAILED",
    "REQUEST_OK",
    "REQUEST_UNHANDLED",
    "CallbackLike",
    "GroupKey",
    "IClient",
    "IConnection",
    "IConnectionCallback",
    "IContext",
    "IServer",
    "as_callback",
]

#: ``recv`` flag: block until a message arrives (Storm 0.8: 0).
RECV_BLOCK: Final = 0
#: ``recv`` flag: return at once, None when nothing is queued (Storm 0.8: 1).
RECV_NOBLOCK: Final = 1
#: :meth:`IClient.request` statuses: answered; the callback failed; no callback answers
#: requests; busy with another requester's work (ask again later).
REQUEST_OK: Final = 0
REQUEST_FAILED: Final = 1
REQUEST_UNHANDLED: Final = 2
REQUEST_BUSY: Final = 3


class IConnectionCallback(abc.ABC):
    """Receives batches pushed by a server connection (Storm 2.x push receive)."""

    @abc.abstractmethod
    def recv(self, batch: MessageBatch) -> None:
        """Handle one batch of messages, in arrival order.

        Called on the transport's receive thread; for one client connection, batches
        arrive in the order that client sent them.  Blocking here holds back that
        connection's reads (and so, over TCP, the sender): that is how a full executor
        queue pushes back on senders.  An exception is logged and counted; the batch is
        considered delivered.

        Parameters
        ----------
        batch : MessageBatch
            A ``Sequence[TaskMessage]`` with columns ``tasks`` and ``payloads`` for
            vectorised consumers.  Owned by the callee; the transport keeps no reference.
        """

    def recv_request(self, op: int, body: bytes, reply: Callable[[int, bytes], None]) -> None:
        """Answer a coordination request from a client (the checkpoint protocol, docs/design/state.md).

        ``reply(status, body)`` must be called exactly once, from any thread, now or later;
        status 0 is success.  The default answers :data:`REQUEST_UNHANDLED`.  Called on the
        transport's receive thread: a long answer must be given from another thread.
        """
        reply(REQUEST_UNHANDLED, b"this server's callback answers no requests")

    def recv_group(self, header: BatchHeader, batch: MessageBatch, done: Callable[[int], None]) -> None:
        """Handle one group of the Spark delivery protocol (see docs/reference/protocol.md).

        ``done(status)`` reports progress back to the sender: ``ACCEPTED`` once the
        messages are queued, ``PROCESSED`` once the entry bolts acked them all, ``FAILED``
        to make the sender retry.  The server has already dropped replays of groups it
        accepted.  The default just calls :meth:`recv` and reports ``ACCEPTED``.
        """
        self.recv(batch)
        done(ACCEPTED)


class _FunctionCallback(IConnectionCallback):
    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[MessageBatch], object]) -> None:
        self._fn = fn

    def recv(self, batch: MessageBatch) -> None:
        self._fn(batch)

    def __repr__(self) -> str:
        return f"callback({self._fn!r})"


#: A callback object, or any function taking a batch (e.g. ``received.extend``).
CallbackLike = IConnectionCallback | Callable[[MessageBatch], object]


def as_callback(cb: CallbackLike) -> IConnectionCallback:
    """Wrap a plain function as an :class:`IConnectionCallback`."""
    if isinstance(cb, IConnectionCallback):
        return cb
    if callable(cb):
        return _FunctionCallback(cb)
    msg = f"callback must be an IConnectionCallback or a callable taking a batch, got {cb!r}"
    raise TypeError(msg)


class IConnection(abc.ABC):
    """What both ends of a connection do (Storm's ``IConnection`` without either side's calls).

    Connections are context managers; ``close()`` is idempotent.
    """

    @property
    @abc.abstractmethod
    def port(self) -> int:
        """The server's port: bound port on a server (real one when bound to 0), peer port on a client."""

    @property
    @abc.abstractmethod
    def status(self) -> ConnectionStatus:
        """``CONNECTING``, ``READY`` or ``CLOSED`` (Storm's ConnectionWithStatus)."""

    @abc.abstractmethod
    def send_load_metrics(self, loads: Mapping[int, float]) -> None:
        """Tell the peer(s) how loaded these tasks are (0.0 idle .. 1.0 full).

        A server sends to every connected client; a client sends to its server.
        """

    @abc.abstractmethod
    def get_load(self, tasks: Iterable[int]) -> dict[int, float]:
        """Return the latest load the peer(s) reported for ``tasks`` (unknown tasks omitted)."""

    @abc.abstractmethod
    def metrics(self) -> dict[str, Any]:
        """Counters (Storm's getState): a server's received/accepted/duplicates/...; a client's sent/lost/pending/..."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection; idempotent.

        A client first flushes what is pending (bounded by the transport's flush
        timeout) and logs, with the count, anything it had to drop.
        """

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class IServer(IConnection):
    """The receiving end: what ``IContext.bind`` returns."""

    @abc.abstractmethod
    def register_recv(self, callback: CallbackLike) -> None:
        """Push mode: deliver every batch to ``callback`` from now on.

        Messages that arrived before registration (queued for ``recv``) are delivered to
        the callback first, in order.
        """

    @abc.abstractmethod
    def recv(self, flags: int = RECV_BLOCK) -> TaskMessage | None:
        """Pull mode (Storm 0.8): take the next message.

        Only while no callback is registered.

        Parameters
        ----------
        flags : int
            ``RECV_BLOCK`` (0) waits for a message; ``RECV_NOBLOCK`` (1) returns None
            when nothing is queued.

        Raises
        ------
        UnsupportedOperationError
            A callback is registered (push mode).
        ConnectionClosedError
            The server was closed (also wakes a blocked ``recv``).
        """

    @abc.abstractmethod
    def recv_batch(self, max_messages: int, timeout: float | None = None) -> list[TaskMessage]:
        """Pull mode: take up to ``max_messages`` at once, waiting up to ``timeout`` s for the first.

        Returns an empty list when ``timeout`` passed with nothing queued.

        Raises
        ------
        ConnectionClosedError
            The server was closed and nothing is left to take.
        """

    @abc.abstractmethod
    def send_backpressure_status(self, status: BackpressureStatus) -> None:
        """Tell every connected client which tasks are (no longer) backpressured."""


class IClient(IConnection):
    """The sending end: what ``IContext.connect`` returns."""

    @abc.abstractmethod
    def send(self, messages: TaskMessage | Iterable[TaskMessage]) -> None:
        """Send one message or a batch to the server, in order.

        While the connection is not ready, messages are held in a bounded buffer and
        sent (in order) once it is.  Above the high write watermark the
        ``storm.messaging.send.overflow.policy`` applies: ``block`` (default) waits,
        ``drop`` drops the batch and counts it as lost.

        Raises
        ------
        ConnectionClosedError
            The connection or its context was closed.
        SendTimeoutError
            Blocked longer than ``storm.messaging.send.timeout.ms``.
        WireFormatError
            A task id outside 0..32767 (nothing of the batch was sent).
        """

    @abc.abstractmethod
    def send_group(self, header: BatchHeader, messages: Sequence[TaskMessage]) -> None:
        """Send one delivery group: the header and exactly ``header.count`` messages, atomically.

        The server delivers the group whole or not at all, drops replays of groups it
        already accepted, and answers with BatchAcks (see :meth:`wait_acks`).
        """

    @abc.abstractmethod
    def wait_acks(self, keys: Iterable[GroupKey], status: int, timeout: float) -> dict[GroupKey, int]:
        """Wait until every group in ``keys`` reached ``status`` (or failed), or ``timeout``.

        Returns the latest status of each key heard of (missing keys: no ack yet); the
        returned keys are forgotten.
        """

    @abc.abstractmethod
    def send_commit(self, query_id: str, batch_id: int) -> None:
        """Tell the server that ``batch_id`` of ``query_id`` is final (it may forget its dedupe state).

        Best effort (a lost commit only delays forgetting).
        """

    @abc.abstractmethod
    def request(self, op: int, body: bytes, timeout: float) -> tuple[int, bytes]:
        """Ask the server's callback ``op`` with ``body``; return its (status, body) answer.

        Not resent after a reconnect: the caller retries (requests must be idempotent).

        Raises
        ------
        RequestTimeoutError
            No answer within ``timeout`` seconds.
        ConnectionClosedError
            The connection was closed.
        """

    @abc.abstractmethod
    def backpressure_tasks(self) -> frozenset[int]:
        """Tasks the server currently reports as backpressured."""

    @abc.abstractmethod
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything sent so far is acknowledged by the server.

        Returns True when it is, False when ``timeout`` (seconds) ran out first.
        """

    @abc.abstractmethod
    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until ``status`` is READY; False on timeout or when closed."""


class IContext(abc.ABC):
    """A transport: makes server and client connections (Storm's ``IContext``).

    Build one with :func:`spark_storm.transport.make_context` (chosen by config) or
    ``Context.from_conf(conf)``.  A context owns its threads and sockets; ``term()``
    closes every connection it made and must not hang.
    """

    #: Registry alias ("local", "tcp", ...); informative.
    alias: ClassVar[str] = ""
    #: Whether connections can cross process boundaries (and therefore authenticate).
    crosses_processes: ClassVar[bool] = True

    @classmethod
    @abc.abstractmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> IContext:
        """Build a context from a config mapping (missing keys take the defaults)."""

    def prepare(self, conf: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """Storm compatibility: contexts are fully configured by ``from_conf``.

        Calling it again with another config is not supported.
        """

    @abc.abstractmethod
    def bind(self, topology_id: str, port: int, callback: CallbackLike | None = None) -> IServer:
        """Bind a server connection for ``topology_id`` on ``port`` (0 = any free port).

        Parameters
        ----------
        topology_id : str
            Clients for another topology are refused in the handshake.
        port : int
            Port to listen on; 0 picks a free one, readable from ``.port``.
        callback : CallbackLike, optional
            Push receive from the first byte: nothing can arrive before it is set.
            Without it, messages queue (bounded) for ``recv`` or a later ``register_recv``.
        """

    @abc.abstractmethod
    def connect(self, topology_id: str, host: str, port: int) -> IClient:
        """Return a new client connection to ``host:port``.

        Returns at once: connecting (and reconnecting) happens in the background;
        ``status`` and ``wait_ready`` tell when it is ready.  Every call returns a new
        connection.
        """

    @abc.abstractmethod
    def term(self) -> None:
        """Close every connection of this context and release its resources; idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.term()
