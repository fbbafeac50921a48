"""The session layer shared by the socket transports (tcp, zmq).

It makes a reconnect lose nothing that ``send`` accepted:

* the client numbers data frames (a SEQ frame before each batch) and keeps every batch
  in a bounded resend buffer until the server's RECEIPT covers it;
* the buffer is the write watermark: above ``high`` bytes, ``send`` blocks (or drops,
  per policy) until it drains under ``low``; memory never grows without bound;
* after a reconnect the server tells (in OK) the last sequence it delivered for this
  session, the client resends the rest, and the server drops any duplicates;
* acks of delivery groups are not resent by the server: after a reconnect the client asks
  again (BATCH_QUERY) for each group the server already has and whose ack it still awaits
  (an ack on its way when the connection broke is lost with it).

The classes here are pure protocol state: they never touch a socket.  Transports feed
them bytes and write what they return.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_storm.config import (
    STORM_GROUP_MAX_BYTES,
    STORM_GROUP_MAX_FRAMES,
    STORM_MAX_FRAME_BYTES,
    STORM_OVERFLOW_POLICY,
    STORM_SEND_TIMEOUT_MS,
    TCP_HIGH_WATERMARK,
    TCP_LOW_WATERMARK,
    Config,
)
from spark_storm.errors import (
    AuthenticationError,
    ConfigError,
    ConnectionBrokenError,
    ConnectionClosedError,
    SendTimeoutError,
    WireFormatError,
)
from spark_storm.messaging.handshake import ClientHandshake, ServerHandshake, new_session_id, refused
from spark_storm.messaging.message import BackpressureStatus, MessageBatch, TaskMessage
from spark_storm.messaging.wire import (
    FAILED,
    HANDSHAKE_FRAME_MAX,
    HANDSHAKE_MAX_BYTES,
    SEQ_FRAME_SIZE,
    Auth,
    BatchAck,
    BatchCommit,
    BatchHeader,
    BatchQuery,
    Challenge,
    Close,
    ControlReply,
    ControlRequest,
    Eob,
    Failure,
    FrameDecoder,
    Hello,
    LoadMetrics,
    Ok,
    Receipt,
    Seq,
    encode_control,
    encode_messages,
)

if TYPE_CHECKING:
    from spark_storm.transport._base import ClientBase, ServerBase

__all__ = [
    "MAX_CONTROLS_PER_MESSAGE",
    "MAX_OPEN_GROUPS",
    "ClientProtocol",
    "ClientSession",
    "PeerLimits",
    "ServerPeer",
    "SessionTable",
    "server_fault",
]

logger = logging.getLogger(__name__)

#: Most delivery groups a client remembers while it waits for their final ack (the oldest go
#: beyond it: only a reconnect needs them, to ask for acks the old connection lost).
MAX_OPEN_GROUPS = 100_000


class ClientSession:
    """Sequencing, the resend buffer and the write watermarks of one client.

    Parameters
    ----------
    high, low : int
        Watermarks in bytes of unacknowledged frames.
    policy : str
        "block" or "drop": what ``admit`` does above ``high``.
    send_timeout_ms : int
        Longest ``admit`` blocks (-1: until drained or closed).
    peer : str
        For log and error messages.
    """

    def __init__(self, high: int, low: int, policy: str, send_timeout_ms: int, peer: str) -> None:
        self.session_id = new_session_id()
        self._high = high
        self._low = low
        self._policy = policy
        self._timeout = None if send_timeout_ms < 0 else send_timeout_ms / 1000
        self._peer = peer
        self._cond = threading.Condition()
        self._next_seq = 0
        self._acked = -1
        self._unacked: deque[tuple[int, bytes]] = deque()
        self._unacked_bytes = 0
        self._outbox: list[bytes] = []
        self._outbox_bytes = 0
        # Delivery groups sent whose final ack has not come: key -> (required, last sequence).
        self._open: OrderedDict[tuple[str, int, int, int], tuple[int, int]] = OrderedDict()
        self._closed = False
        self.sent = 0
        self.lost = 0
        self.resent = 0
        self.blocked = 0

    @classmethod
    def from_conf(cls, conf: Config, peer: str) -> ClientSession:
        """Build one from the watermark, overflow-policy and send-timeout keys (shared by every client).

        Raises
        ------
        ConfigError
            The low watermark is above the high one, or a key has a bad value.
        """
        high = conf.get_int(TCP_HIGH_WATERMARK, minimum=1)
        low = conf.get_int(TCP_LOW_WATERMARK, minimum=0)
        if low > high:
            msg = f"{TCP_LOW_WATERMARK}={low} must not exceed {TCP_HIGH_WATERMARK}={high}"
            raise ConfigError(msg)
        policy = conf.get_choice(STORM_OVERFLOW_POLICY, ("block", "drop"))
        return cls(high, low, policy, conf.get_int(STORM_SEND_TIMEOUT_MS, minimum=-1), peer)

    def admit(self, batch: Sequence[TaskMessage], header: BatchHeader | None = None) -> tuple[int, bool]:
        """Admit ``batch``: number it, keep it for resend and queue it for writing.

        Returns the bytes now waiting in the outbox and whether it was empty before
        (either is the caller's cue to wake its writer).

        Raises
        ------
        WireFormatError
            A task id out of range; nothing of the batch is admitted.
        ConnectionClosedError, SendTimeoutError
            See :meth:`IClient.send`.
        """
        body = encode_messages(batch)  # validates every task id before anything changes
        count = len(batch)
        with self._cond:
            if self._closed:
                msg = f"send on closed client to {self._peer}"
                raise ConnectionClosedError(msg)
            size = len(body) + SEQ_FRAME_SIZE  # what the chunk takes on the wire
            if self._unacked_bytes and self._unacked_bytes + size > self._high:
                if self._policy == "drop":
                    self.lost += count
                    logger.error(
                        "dropping %d messages for %s: %d bytes unacknowledged is over the high watermark (policy drop)",
                        count,
                        self._peer,
                        self._unacked_bytes,
                    )
                    return self._outbox_bytes, False
                self._wait_under_low()
            first = self._next_seq
            self._next_seq += count
            chunk = encode_control(Seq(first, count)) + body
            if header is not None:  # header, SEQ and frames travel (and are resent) as one chunk
                chunk = encode_control(header) + chunk
                self._open[header.key] = (header.required, self._next_seq - 1)
                self._open.move_to_end(header.key)
                if len(self._open) > MAX_OPEN_GROUPS:
                    self._open.popitem(last=False)
            self._unacked.append((self._next_seq - 1, chunk))
            self._unacked_bytes += len(chunk)
            was_empty = not self._outbox
            self._outbox.append(chunk)
            self._outbox_bytes += len(chunk)
            self.sent += count
            return self._outbox_bytes, was_empty

    def _wait_under_low(self) -> None:
        self.blocked += 1
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while self._unacked_bytes > self._low and not self._closed:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                msg = (
                    f"send to {self._peer} blocked {self._timeout:.3f}s above the high watermark "
                    f"({self._unacked_bytes} bytes unacknowledged); the server is slow or gone"
                )
                raise SendTimeoutError(msg)
            self._cond.wait(remaining)
        if self._closed:
            msg = f"client to {self._peer} closed while send() waited for the server to catch up"
            raise ConnectionClosedError(msg)

    def take_outbox(self) -> list[bytes]:
        """Take every chunk waiting to be written."""
        with self._cond:
            out, self._outbox = self._outbox, []
            self._outbox_bytes = 0
            return out

    def on_receipt(self, seq: int) -> None:
        """Free everything up to ``seq`` (delivered by the server) from the resend buffer."""
        with self._cond:
            if seq <= self._acked:
                return
            self._acked = seq
            while self._unacked and self._unacked[0][0] <= seq:
                _, chunk = self._unacked.popleft()
                self._unacked_bytes -= len(chunk)
            self._cond.notify_all()

    def on_ack(self, ack: BatchAck) -> None:
        """Forget a group once its ack is final (its required level reached, or FAILED)."""
        with self._cond:
            entry = self._open.get(ack.key)
            if entry is not None and (ack.status == FAILED or ack.status >= entry[0]):
                del self._open[ack.key]

    def unanswered(self) -> list[BatchQuery]:
        """Return a query for each group the server has (a receipt covers it) whose final ack has not come.

        After a reconnect their acks are asked for again: an ack on its way when the old
        connection broke is lost with it, and the group is not resent (the server has it).
        """
        with self._cond:
            return [BatchQuery(*key, required) for key, (required, last) in self._open.items() if last <= self._acked]

    def replay(self, resume_after: int) -> bool:
        """After a (re)handshake: queue again everything the server did not deliver.

        Returns True when the server no longer knows what it had acknowledged (it
        restarted): what it received before is gone with it, unless its owner kept it.
        """
        with self._cond:
            if resume_after >= self._next_seq:
                msg = (
                    f"server {self._peer} claims sequence {resume_after} but this session only "
                    f"sent up to {self._next_seq - 1}: another client shares the session id"
                )
                raise ConnectionBrokenError(msg)
            lost_state = resume_after < self._acked
        self.on_receipt(resume_after)
        with self._cond:
            chunks = [chunk for _, chunk in self._unacked]
            if len(chunks) and self._next_seq > 0 and self._acked < self._next_seq - 1:
                self.resent += self._next_seq - 1 - self._acked
            self._outbox = chunks
            self._outbox_bytes = sum(len(c) for c in chunks)
        return lost_state

    @property
    def outbox_bytes(self) -> int:
        """Bytes admitted but not yet taken by the writer."""
        return self._outbox_bytes

    @property
    def pending(self) -> int:
        """Messages sent but not yet acknowledged by the server."""
        return self._next_seq - 1 - self._acked

    @property
    def pending_bytes(self) -> int:
        return self._unacked_bytes

    def wait_acked(self, timeout: float | None) -> bool:
        """Wait until the server acknowledged everything admitted so far."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._next_seq - 1
            while self._acked < target and not self._closed:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining if remaining is None else min(remaining, 0.5))
            return self._acked >= target

    def close(self, unacked_are_lost: bool = True) -> int:
        """Refuse further sends; return how many messages are still unacknowledged.

        They count as lost unless ``unacked_are_lost`` is False (a durable transport, whose
        server still gets them after the client is gone).
        """
        with self._cond:
            self._closed = True
            lost = self._next_seq - 1 - self._acked
            if unacked_are_lost:
                self.lost += lost
            self._cond.notify_all()
            return lost


class SessionTable:
    """Last delivered sequence per client session, remembered across reconnects (LRU-bounded)."""

    def __init__(self, max_sessions: int) -> None:
        self._max = max_sessions
        self._last: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()

    def last(self, session_id: bytes) -> int:
        with self._lock:
            value = self._last.get(session_id, -1)
            if session_id in self._last:
                self._last.move_to_end(session_id)
            return value

    def advance(self, session_id: bytes, seq: int) -> None:
        with self._lock:
            self._last[session_id] = seq
            self._last.move_to_end(session_id)
            while len(self._last) > self._max:
                self._last.popitem(last=False)

    def forget(self, session_id: bytes) -> None:
        with self._lock:
            self._last.pop(session_id, None)


#: Most control frames one message may carry where a transport has messages (a zmq message,
#: a Kafka record): a client's chunk holds at most a batch header and a SEQ, so 64 is ample,
#: and a message of millions of tiny control frames is refused after 64 instead of decoded.
MAX_CONTROLS_PER_MESSAGE = 64


@dataclass(frozen=True)
class PeerLimits:
    """What a server accepts from one peer (frame, group and handshake bounds)."""

    max_frame_bytes: int
    group_max_frames: int
    group_max_bytes: int

    @classmethod
    def from_conf(cls, conf: Config) -> PeerLimits:
        """Read the frame and group bounds (``storm.messaging.max.frame.bytes``, ``server.group.max.*``)."""
        return cls(
            conf.get_int(STORM_MAX_FRAME_BYTES, minimum=64),
            conf.get_int(STORM_GROUP_MAX_FRAMES, minimum=1),
            conf.get_int(STORM_GROUP_MAX_BYTES, minimum=1),
        )


def server_fault(exc: Exception) -> str:
    """Say what a peer is told when handling its bytes failed here: the kind of fault; its text is logged."""
    return f"the server failed handling this connection's bytes ({type(exc).__name__}; logged there)"


class ServerPeer:
    """One client as seen by a server: handshake, decoding, sequencing, dedupe.

    Before the handshake completes only handshake frames are legal, and only
    :data:`~spark_storm.messaging.wire.HANDSHAKE_MAX_BYTES` of them: a peer that has not
    proven anything cannot make the server buffer more.  A delivery group is bounded by
    ``limits`` in frames (checked at its header, before anything is collected) and bytes.

    Parameters
    ----------
    server : ServerBase
        Where batches are delivered and counters kept.
    sessions : SessionTable
        The server's dedupe table.
    secret : bytes or None
        Shared secret; None turns auth off.
    peer : str
        ``host:port`` of the client, for logs.
    limits : PeerLimits
        Frame and group bounds.
    reply : callable, optional
        Writes a frame to this peer from any thread (acks of delivery groups).
    message_controls : int, optional
        Most control frames per :meth:`on_bytes` call, for transports whose unit is a
        message (:data:`MAX_CONTROLS_PER_MESSAGE`); None for byte streams.
    receipts : bool
        Whether :meth:`on_bytes` answers delivered data with a RECEIPT itself; if not, it sets
        :attr:`receipt_due` (kafka sends its receipts only after committing offsets, for
        :attr:`delivered_upto`).
    """

    def __init__(
        self,
        server: ServerBase,
        sessions: SessionTable,
        secret: bytes | None,
        peer: str,
        limits: PeerLimits,
        reply: Callable[[bytes], None] | None = None,
        *,
        message_controls: int | None = None,
        receipts: bool = True,
    ) -> None:
        self.server = server
        self.peer = peer
        self._reply = reply
        self._limits = limits
        self._message_controls = message_controls
        self._receipts = receipts
        self._group: BatchHeader | None = None
        self._group_tasks: list[int] = []
        self._group_payloads: list[bytes] = []
        self._group_seen = 0
        self._group_bytes = 0
        self._sessions = sessions
        self._decoder = FrameDecoder(min(limits.max_frame_bytes, HANDSHAKE_FRAME_MAX))
        self._handshake = ServerHandshake(server.topology_id, secret, peer)
        self._pre_auth_bytes = 0
        self.ready = False
        self.closed_by_peer = False
        self.receipt_due = False  # receipts=False: data arrived since the transport last sent one
        self.session_id = b""
        self._next = 0
        self._remaining = 0
        self._delivered_upto = -1

    @classmethod
    def authenticated(
        cls,
        server: ServerBase,
        sessions: SessionTable,
        session_id: bytes,
        peer: str,
        limits: PeerLimits,
        reply: Callable[[bytes], None] | None = None,
        *,
        message_controls: int | None = None,
        receipts: bool = True,
    ) -> ServerPeer:
        """Make a peer whose every message the transport authenticates itself (kafka: a MAC per record).

        It starts ready, resuming after the last sequence ``sessions`` delivered for ``session_id``.
        """
        self = cls(server, sessions, None, peer, limits, reply, message_controls=message_controls, receipts=receipts)
        self._ready(session_id, sessions.last(session_id))
        return self

    def _ready(self, session_id: bytes, resume: int) -> None:
        self.session_id = session_id
        self._delivered_upto = resume
        self._decoder.max_frame_bytes = self._limits.max_frame_bytes
        self.ready = True

    @property
    def delivered_upto(self) -> int:
        """Last sequence number of this session delivered to the server (-1: none)."""
        return self._delivered_upto

    @property
    def buffered_bytes(self) -> int:
        """Bytes this peer makes the server hold: a partial frame plus a partly received group."""
        return self._decoder.buffered + self._group_bytes

    def release(self) -> None:
        """Forget everything buffered and the reply path: the connection is gone.

        Called by the transport when it drops the peer, so a partial group or frame is freed
        at once even if something (a pending ack in the ledger) still refers to the peer, and
        the peer no longer refers to its connection (no reference cycle to wait for).
        """
        self._reply = None
        self._group = None
        self._group_tasks = []
        self._group_payloads = []
        self._group_bytes = 0
        self._decoder = FrameDecoder(0)

    def on_bytes(self, data: bytes) -> list[bytes]:
        """Process bytes from the client; return encoded frames to write back.

        Raises
        ------
        WireFormatError, AuthenticationError
            The caller closes this connection (after writing the FAILURE it is given by
            :meth:`failure_frame`), logs and counts it.
        """
        if not self.ready:
            # Checked before decoding: an unauthenticated peer gets no work done for it
            # beyond the handshake's own few bytes.
            self._pre_auth_bytes += len(data)
            if self._pre_auth_bytes > HANDSHAKE_MAX_BYTES:
                msg = (
                    f"client {self.peer} sent {self._pre_auth_bytes} bytes before completing the handshake; "
                    f"at most {HANDSHAKE_MAX_BYTES} are legal"
                )
                raise WireFormatError(msg)
        replies: list[bytes] = []
        delivered = False
        for item in self._decoder.feed(data, self._message_controls):
            if type(item) is MessageBatch:
                self._data(item)
                delivered = True
            else:
                self._control(item, replies)
        if delivered:
            last = self._delivered_upto
            self._sessions.advance(self.session_id, last)
            if self._receipts:
                replies.append(encode_control(Receipt(last)))
            else:
                self.receipt_due = True
        return replies

    def _data(self, run: MessageBatch) -> None:
        if not self.ready:
            msg = f"client {self.peer} sent data before completing the handshake"
            raise WireFormatError(msg)
        if len(run) > self._remaining:
            msg = f"client {self.peer} sent {len(run)} data frames where its SEQ announced {self._remaining}"
            raise WireFormatError(msg)
        first = self._next
        self._next += len(run)
        self._remaining -= len(run)
        skip = self._delivered_upto - first + 1
        if self._group is not None:
            self._group_data(run, skip)
            return
        if skip > 0:
            self.server.count("duplicates", min(skip, len(run)))
            run = run[skip:]
        if run:
            self.server.deliver(run)
            self._delivered_upto = self._next - 1

    def _group_data(self, run: MessageBatch, skip: int) -> None:
        # A group is delivered whole: frames are collected until ``count`` arrived, and the
        # receipt does not move past the group's start until then, so after a reconnect
        # the client resends the whole group (header included).
        header = self._group
        assert header is not None
        if skip > 0:
            self.server.count("duplicates", min(skip, len(run)))
        keep = max(skip, 0)
        payloads = run.payloads[keep:] if keep else run.payloads
        self._group_bytes += sum(map(len, payloads))
        if self._group_bytes > self._limits.group_max_bytes:
            msg = (
                f"client {self.peer} sent over {self._limits.group_max_bytes} bytes in group {header.key} "
                f"({STORM_GROUP_MAX_BYTES})"
            )
            raise WireFormatError(msg)
        self._group_tasks.extend(run.tasks[keep:])
        self._group_payloads.extend(payloads)
        self._group_seen += len(run)
        if self._group_seen > header.count:
            msg = f"client {self.peer} sent more frames than group {header.key} announced ({header.count})"
            raise WireFormatError(msg)
        if self._group_seen == header.count:
            batch = MessageBatch(self._group_tasks, self._group_payloads)
            self._group, self._group_tasks, self._group_payloads = None, [], []
            self._group_bytes = 0
            self._delivered_upto = max(self._delivered_upto, self._next - 1)
            self.server.deliver_group(header, batch, self._send_ack)

    def _send_ack(self, ack: BatchAck) -> None:
        reply = self._reply
        if reply is not None:
            reply(encode_control(ack))

    def _send_reply(self, answer: ControlReply) -> None:
        reply = self._reply
        if reply is not None:
            reply(encode_control(answer))

    def _control(self, frame: object, replies: list[bytes]) -> None:
        if isinstance(frame, Hello):
            if self.ready:
                msg = f"client {self.peer} sent HELLO twice"
                raise WireFormatError(msg)
            replies.append(encode_control(self._handshake.on_hello(frame)))
            return
        if isinstance(frame, Auth):
            hello = self._handshake.hello
            if hello is None:
                msg = f"client {self.peer} sent AUTH before HELLO"
                raise WireFormatError(msg)
            if self.ready:
                msg = f"client {self.peer} sent AUTH twice"
                raise WireFormatError(msg)
            resume = self._sessions.last(hello.session_id)
            ok = self._handshake.on_auth(frame, resume)
            self._ready(hello.session_id, resume)
            replies.append(encode_control(ok))
            return
        if not self.ready:
            msg = f"client {self.peer} sent {type(frame).__name__} before completing the handshake"
            raise WireFormatError(msg)
        if isinstance(frame, Seq):
            if self._remaining:
                msg = f"client {self.peer} started a SEQ while {self._remaining} frames were still due"
                raise WireFormatError(msg)
            self._next = frame.first
            self._remaining = frame.count
        elif isinstance(frame, LoadMetrics):
            self.server.update_peer_loads(frame.loads)
        elif isinstance(frame, Close):
            self.closed_by_peer = True
            self._sessions.forget(self.session_id)
        elif isinstance(frame, Eob):
            pass  # Storm's end-of-batch; our clients send it as a keepalive
        elif isinstance(frame, BatchHeader):
            if self._group is not None:
                msg = f"client {self.peer} started group {frame.key} inside group {self._group.key}"
                raise WireFormatError(msg)
            if frame.count > self._limits.group_max_frames:
                msg = (
                    f"client {self.peer} announced group {frame.key} of {frame.count} frames; the limit is "
                    f"{self._limits.group_max_frames} ({STORM_GROUP_MAX_FRAMES})"
                )
                raise WireFormatError(msg)
            self._group = frame
            self._group_seen = 0
            self._group_bytes = 0
            if frame.count == 0:
                self._group = None
                self.server.deliver_group(frame, MessageBatch([], []), self._send_ack)
        elif isinstance(frame, BatchCommit):
            self.server.commit(frame.query_id, frame.batch_id)
        elif isinstance(frame, ControlRequest):
            self.server.request(frame, self._send_reply)
        elif isinstance(frame, BatchQuery):
            self.server.count("ack_queries")
            self.server.ledger.query(frame, self._send_ack)
        else:
            msg = f"client {self.peer} sent unexpected {type(frame).__name__}"
            raise WireFormatError(msg)

    def check_eof(self) -> None:
        """Check the end of the stream: a half-received frame means truncation."""
        self._decoder.check_eof()

    @staticmethod
    def failure_frame(reason: str) -> bytes:
        return encode_control(Failure(reason))


class ClientProtocol:
    """A client's view of one connection attempt: handshake, then control frames.

    A new instance is made for every (re)connect; the :class:`ClientSession` outlives it.
    With ``handshake=False`` (kafka, whose records are authenticated one by one) it starts
    ready and only handles what the server sends about the session: receipts, acks, load,
    backpressure, failure.
    """

    def __init__(
        self,
        client: ClientBase,
        session: ClientSession,
        secret: bytes | None,
        peer: str,
        max_frame_bytes: int,
        *,
        handshake: bool = True,
    ) -> None:
        self._client = client
        self._session = session
        self._peer = peer
        self._decoder = FrameDecoder(max_frame_bytes)
        self._handshake = ClientHandshake(client.topology_id, session.session_id, secret, peer)
        self.ready = not handshake

    def hello(self) -> bytes:
        return encode_control(self._handshake.hello())

    def on_bytes(self, data: bytes) -> list[bytes]:
        """Process bytes from the server; return frames to write back.

        Raises
        ------
        AuthenticationError
            The server refused us, or failed to prove the secret.
        ConnectionBrokenError
            The server sent FAILURE or CLOSE (a reconnect may help).
        WireFormatError
            The server sent garbage.
        """
        replies: list[bytes] = []
        self.on_frames(self._decoder.feed(data), replies)
        return replies

    def on_frames(self, items: Sequence[object], replies: list[bytes]) -> None:
        """Handle decoded frames from the server (see :meth:`on_bytes`); append what to write back."""
        for item in items:
            if type(item) is MessageBatch:
                msg = f"server {self._peer} sent data frames to a client"
                raise WireFormatError(msg)
            if isinstance(item, Receipt):
                self._session.on_receipt(item.seq)
            elif isinstance(item, LoadMetrics):
                self._client.update_loads(item.loads)
            elif isinstance(item, BackpressureStatus):
                self._client.update_backpressure(item)
            elif isinstance(item, Challenge | Ok) and self.ready:
                msg = f"server {self._peer} sent {type(item).__name__} after the handshake"
                raise WireFormatError(msg)
            elif isinstance(item, Challenge):
                replies.append(encode_control(self._handshake.on_challenge(item)))
            elif isinstance(item, Ok):
                resume = self._handshake.on_ok(item)
                if self._session.replay(resume):
                    self._client.server_restarted()
                replies.extend(encode_control(query) for query in self._session.unanswered())
                self.ready = True
            elif isinstance(item, Failure):
                if not self.ready:
                    raise AuthenticationError(refused(self._peer, item.reason))
                msg = f"server {self._peer} reported failure: {item.reason}"
                raise ConnectionBrokenError(msg)
            elif isinstance(item, Close):
                msg = f"server {self._peer} is closing"
                raise ConnectionBrokenError(msg)
            elif isinstance(item, BatchAck):
                self._session.on_ack(item)
                self._client.update_ack(item)
            elif isinstance(item, ControlReply):
                self._client.update_reply(item)
            elif isinstance(item, Eob):
                logger.debug("ignoring %r from %s", item, self._peer)
            else:
                msg = f"server {self._peer} sent unexpected {type(item).__name__}"
                raise WireFormatError(msg)
