"""The wire format: the one module that encodes and decodes frames.

Every frame is ``int16 code | int32 length | body[length]``, big-endian, like Storm's
Netty ``MessageBatch`` (``task short(2) | len int(4) | payload``).  A code >= 0 is a data
frame for that task id; negative codes are control frames (Storm's values where Storm has
one).  Unlike Storm, control frames also carry a length, so a decoder finds frame
boundaries without knowing the code.  docs/reference/protocol.md documents each body byte by byte.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from spark_storm.errors import WireFormatError
from spark_storm.messaging.message import MAX_TASK_ID, BackpressureStatus, MessageBatch, TaskMessage

__all__ = [
    "ACCEPTED",
    "COORDINATED_BATCH",
    "FAILED",
    "HANDSHAKE_FRAME_MAX",
    "HANDSHAKE_MAX_BYTES",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_QUERY_ID_BYTES",
    "MAX_SEQ",
    "PROCESSED",
    "PROTOCOL_VERSION",
    "SEQ_FRAME_SIZE",
    "Auth",
    "BatchAck",
    "BatchCommit",
    "BatchHeader",
    "BatchQuery",
    "Challenge",
    "Close",
    "ControlFrame",
    "ControlReply",
    "ControlRequest",
    "Eob",
    "Failure",
    "FrameDecoder",
    "Hello",
    "LoadMetrics",
    "Ok",
    "Receipt",
    "Seq",
    "check_messages",
    "encode_control",
    "encode_messages",
    "split_at_frames",
]

MAGIC: Final = b"STRM"
PROTOCOL_VERSION: Final = 2
NONCE_SIZE: Final = 16
SESSION_ID_SIZE: Final = 16

HEADER: Final = struct.Struct(">hi")
HEADER_SIZE: Final = HEADER.size

# Control codes.  Storm's: CLOSE, OK, EOB, FAILURE, load metrics (task -1), backpressure.
LOAD_METRICS: Final = -1
CLOSE: Final = -100
OK: Final = -200
EOB: Final = -201
FAILURE: Final = -400
BACKPRESSURE: Final = -600
# Ours: handshake, transport sequencing, and the Spark delivery protocol.
HELLO: Final = -700
CHALLENGE: Final = -701
AUTH: Final = -702
SEQ: Final = -710
RECEIPT: Final = -711
BATCH_HEADER: Final = -800
BATCH_ACK: Final = -801
BATCH_COMMIT: Final = -802
# Coordination requests (the checkpoint protocol, docs/design/state.md): client asks, server answers.
REQUEST: Final = -803
REPLY: Final = -804
BATCH_QUERY: Final = -805

_LOAD_ENTRY: Final = struct.Struct(">hd")
_HELLO_FIXED: Final = struct.Struct(">4sBB16s16sH")
_CHALLENGE: Final = struct.Struct(">4sBB16s")
_OK_FIXED: Final = struct.Struct(">qB")
_SEQ: Final = struct.Struct(">qi")
_RECEIPT: Final = struct.Struct(">q")
_BATCH_HEADER: Final = struct.Struct(">qiqiB")
_BATCH_ACK: Final = struct.Struct(">qiqB")
_BATCH_COMMIT: Final = struct.Struct(">q")
_REQUEST: Final = struct.Struct(">qB")
_BATCH_QUERY: Final = struct.Struct(">qiqB")
#: Bytes a SEQ frame takes on the wire (header and body): what a session adds to every chunk it sends.
SEQ_FRAME_SIZE: Final = HEADER_SIZE + _SEQ.size
#: The largest sequence number: RECEIPT and OK carry one as a signed 64-bit integer.
MAX_SEQ: Final = 2**63 - 1
_U16: Final = struct.Struct(">H")

#: Longest query id (UTF-8 bytes) the encoder writes and the decoder accepts.
MAX_QUERY_ID_BYTES: Final = 0xFFFF
#: Largest frame body legal before a handshake completed: a HELLO with the longest topology id.
HANDSHAKE_FRAME_MAX: Final = _HELLO_FIXED.size + 0xFFFF
#: Most bytes a client may send before its handshake completed: one HELLO and one AUTH.
HANDSHAKE_MAX_BYTES: Final = (HEADER_SIZE + HANDSHAKE_FRAME_MAX) + (HEADER_SIZE + 32)


@dataclass(frozen=True)
class LoadMetrics:
    """Task load figures, 0.0 (idle) to 1.0 (queue full); Storm's ``LoadMetricsServerMessage``."""

    loads: dict[int, float]


@dataclass(frozen=True)
class Close:
    """The peer is closing on purpose; Storm's CLOSE_MESSAGE."""


@dataclass(frozen=True)
class Eob:
    """End of batch; Storm's EOB_MESSAGE (accepted and ignored by our servers)."""


@dataclass(frozen=True)
class Failure:
    """The peer refuses something; the reason is for the log."""

    reason: str


@dataclass(frozen=True)
class Hello:
    """First client frame: who I am, which topology, my nonce."""

    version: int
    topology_id: str
    session_id: bytes
    nonce: bytes
    magic: bytes = MAGIC


@dataclass(frozen=True)
class Challenge:
    """Server's answer to HELLO: its version, whether it wants auth, its nonce."""

    version: int
    auth_required: bool
    nonce: bytes
    magic: bytes = MAGIC


@dataclass(frozen=True)
class Auth:
    """Client's proof of the shared secret (empty when auth is off)."""

    mac: bytes


@dataclass(frozen=True)
class Ok:
    """Handshake accepted: the server's own proof, and the last sequence it delivered."""

    mac: bytes
    resume_after: int


@dataclass(frozen=True)
class Seq:
    """The next ``count`` data frames carry sequence numbers ``first .. first+count-1``."""

    first: int
    count: int


@dataclass(frozen=True)
class Receipt:
    """Everything up to and including sequence ``seq`` reached the server's receiver."""

    seq: int


#: BatchAck statuses, and the ``required`` level of a BatchHeader.
ACCEPTED: Final = 1
PROCESSED: Final = 2
FAILED: Final = 3
#: Set in a BATCH_HEADER's ``required`` byte: the sender's own checkpoint round commits the batch.
COORDINATED_BATCH: Final = 0x80


@dataclass(frozen=True)
class BatchHeader:
    """The next ``count`` data frames are group ``sequence`` of (query, batch, partition).

    ``required`` is the ack the sender waits for: ACCEPTED (published into executor
    queues) or PROCESSED (acked by the entry component's bolts).  ``coordinated``: the
    batch is committed by a checkpoint round of its own sender (a Spark driver's
    ``commit``), so a stateful topology's interval rounds stand aside until it is
    (docs/design/state.md, "Who coordinates").
    """

    query_id: str
    batch_id: int
    partition: int
    sequence: int
    count: int
    required: int = ACCEPTED
    coordinated: bool = False

    @property
    def key(self) -> tuple[str, int, int, int]:
        """(query id, batch id, partition, sequence): what replays are recognised by."""
        return (self.query_id, self.batch_id, self.partition, self.sequence)


@dataclass(frozen=True)
class BatchAck:
    """A worker accepted (1), processed (2) or failed (3) one batch-header group."""

    query_id: str
    batch_id: int
    partition: int
    sequence: int
    status: int

    @property
    def key(self) -> tuple[str, int, int, int]:
        """(query id, batch id, partition, sequence): what replays are recognised by."""
        return (self.query_id, self.batch_id, self.partition, self.sequence)


@dataclass(frozen=True)
class BatchCommit:
    """The driver committed ``batch_id`` of ``query_id``: its dedupe state may be forgotten."""

    query_id: str
    batch_id: int


@dataclass(frozen=True)
class ControlRequest:
    """A coordination request (``op`` and an opaque body) the server's callback answers once."""

    request_id: int
    op: int
    body: bytes = b""


@dataclass(frozen=True)
class ControlReply:
    """The answer to :class:`ControlRequest` ``request_id``: a status (0 ok) and an opaque body."""

    request_id: int
    status: int
    body: bytes = b""


@dataclass(frozen=True)
class BatchQuery:
    """After a reconnect, a client asks what became of a group the server already received.

    The server's receipt (or OK's ``resume_after``) covered the group, so it is not resent;
    its ack, written to the old connection, was lost with it.  The server answers from its
    ledger with a BatchAck: at once if the group reached ``required`` or failed, otherwise
    when it does; FAILED if it does not know the group (e.g. the worker restarted), so the
    sender retries now rather than at its ack timeout.
    """

    query_id: str
    batch_id: int
    partition: int
    sequence: int
    required: int = ACCEPTED

    @property
    def key(self) -> tuple[str, int, int, int]:
        """(query id, batch id, partition, sequence) of the group asked about."""
        return (self.query_id, self.batch_id, self.partition, self.sequence)


ControlFrame = (
    LoadMetrics
    | Close
    | Eob
    | Failure
    | BackpressureStatus
    | Hello
    | Challenge
    | Auth
    | Ok
    | Seq
    | Receipt
    | BatchHeader
    | BatchAck
    | BatchCommit
    | ControlRequest
    | ControlReply
    | BatchQuery
)
#: What :meth:`FrameDecoder.feed` yields: runs of data frames, and control frames between them.
Decoded = MessageBatch | ControlFrame


# --------------------------------------------------------------------------- encoding
def encode_messages(messages: Iterable[TaskMessage]) -> bytes:
    """Encode data frames back to back.

    Raises
    ------
    WireFormatError
        A task id does not fit the int16 task field (0..32767), or a payload is not bytes.
    """
    pack = HEADER.pack
    parts: list[bytes] = []
    append = parts.append
    for task, payload in messages:
        if not 0 <= task <= MAX_TASK_ID:
            msg = f"task id {task} does not fit the int16 task field (0..{MAX_TASK_ID})"
            raise WireFormatError(msg)
        if type(payload) is not bytes:
            if not isinstance(payload, (bytes, bytearray, memoryview)):
                msg = f"payload for task {task} must be bytes, got {type(payload).__name__}"
                raise WireFormatError(msg)
            payload = bytes(payload)
        append(pack(task, len(payload)))
        append(payload)
    return b"".join(parts)


def check_messages(messages: Iterable[TaskMessage]) -> None:
    """Check what :func:`encode_messages` checks, without encoding (in-process transports).

    Raises
    ------
    WireFormatError
        A task id outside 0..32767, or a payload that is not bytes.
    """
    for task, payload in messages:
        if not 0 <= task <= MAX_TASK_ID:
            msg = f"task id {task} does not fit the int16 task field (0..{MAX_TASK_ID})"
            raise WireFormatError(msg)
        if not isinstance(payload, bytes):
            msg = f"payload for task {task} must be bytes, got {type(payload).__name__}"
            raise WireFormatError(msg)


def split_at_frames(chunk: bytes, limit: int) -> list[bytes]:
    """Cut an encoded frame stream into pieces of at most ``limit`` bytes, at frame boundaries.

    A frame longer than ``limit`` on its own becomes a piece of its own.  Message-based
    transports (zmq) use it to keep every message under the receiver's message size limit.
    """
    if len(chunk) <= limit:
        return [chunk]
    pieces: list[bytes] = []
    unpack = HEADER.unpack_from
    start = pos = 0
    n = len(chunk)
    view = memoryview(chunk)
    while pos + HEADER_SIZE <= n:
        end = pos + HEADER_SIZE + unpack(chunk, pos)[1]
        if end - start > limit and pos > start:
            pieces.append(bytes(view[start:pos]))
            start = pos
        pos = end
    pieces.append(bytes(view[start:]))
    return pieces


def _str_field(text: str, what: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 0xFFFF:
        msg = f"{what} is {len(raw)} bytes in UTF-8; the limit is 65535"
        raise WireFormatError(msg)
    return raw


def _task_list(tasks: frozenset[int]) -> bytes:
    for task in tasks:
        if not 0 <= task <= MAX_TASK_ID:
            msg = f"task id {task} does not fit the int16 task field (0..{MAX_TASK_ID})"
            raise WireFormatError(msg)
    ordered = sorted(tasks)
    return _U16.pack(len(ordered)) + struct.pack(f">{len(ordered)}h", *ordered)


def _control_body(frame: ControlFrame) -> tuple[int, bytes]:
    if isinstance(frame, LoadMetrics):
        for task, load in frame.loads.items():
            if not 0 <= task <= MAX_TASK_ID:
                msg = f"task id {task} does not fit the int16 task field (0..{MAX_TASK_ID})"
                raise WireFormatError(msg)
            if not 0.0 <= load <= 1.0:  # also false for NaN; every decoder refuses it, dropping the link
                msg = f"load {load!r} of task {task} is outside 0.0..1.0: send a queue's fill, capped at 1.0"
                raise WireFormatError(msg)
        return LOAD_METRICS, b"".join(_LOAD_ENTRY.pack(t, float(v)) for t, v in frame.loads.items())
    if isinstance(frame, Close):
        return CLOSE, b""
    if isinstance(frame, Eob):
        return EOB, b""
    if isinstance(frame, Failure):
        return FAILURE, frame.reason.encode("utf-8")
    if isinstance(frame, BackpressureStatus):
        wid = _str_field(frame.worker_id, "worker id")
        body = _U16.pack(len(wid)) + wid + _task_list(frame.bp_tasks) + _task_list(frame.non_bp_tasks)
        return BACKPRESSURE, body
    if isinstance(frame, Hello):
        topo = _str_field(frame.topology_id, "topology id")
        fixed = _HELLO_FIXED.pack(frame.magic, frame.version, 0, frame.session_id, frame.nonce, len(topo))
        return HELLO, fixed + topo
    if isinstance(frame, Challenge):
        flags = 1 if frame.auth_required else 0
        return CHALLENGE, _CHALLENGE.pack(frame.magic, frame.version, flags, frame.nonce)
    if isinstance(frame, Auth):
        return AUTH, frame.mac
    if isinstance(frame, Ok):
        return OK, _OK_FIXED.pack(frame.resume_after, len(frame.mac)) + frame.mac
    if isinstance(frame, Seq):
        return SEQ, _SEQ.pack(frame.first, frame.count)
    if isinstance(frame, Receipt):
        return RECEIPT, _RECEIPT.pack(frame.seq)
    if isinstance(frame, BatchHeader):
        level = frame.required | (COORDINATED_BATCH if frame.coordinated else 0)
        fixed = _BATCH_HEADER.pack(frame.batch_id, frame.partition, frame.sequence, frame.count, level)
        return BATCH_HEADER, fixed + _str_field(frame.query_id, "query id")
    if isinstance(frame, BatchAck):
        fixed = _BATCH_ACK.pack(frame.batch_id, frame.partition, frame.sequence, frame.status)
        return BATCH_ACK, fixed + _str_field(frame.query_id, "query id")
    if isinstance(frame, BatchCommit):
        return BATCH_COMMIT, _BATCH_COMMIT.pack(frame.batch_id) + _str_field(frame.query_id, "query id")
    if isinstance(frame, ControlRequest):
        return REQUEST, _REQUEST.pack(frame.request_id, frame.op) + frame.body
    if isinstance(frame, ControlReply):
        return REPLY, _REQUEST.pack(frame.request_id, frame.status) + frame.body
    if isinstance(frame, BatchQuery):
        fixed = _BATCH_QUERY.pack(frame.batch_id, frame.partition, frame.sequence, frame.required)
        return BATCH_QUERY, fixed + _str_field(frame.query_id, "query id")
    msg = f"not a control frame: {frame!r}"  # pragma: no cover - the Union is closed
    raise WireFormatError(msg)


def encode_control(frame: ControlFrame) -> bytes:
    """Encode one control frame (header included)."""
    code, body = _control_body(frame)
    return HEADER.pack(code, len(body)) + body


# --------------------------------------------------------------------------- decoding
def _need(body: bytes, size: int, what: str) -> None:
    if len(body) < size:
        msg = f"{what} frame body is {len(body)} bytes, needs at least {size}"
        raise WireFormatError(msg)


def _exact(body: bytes, size: int, what: str) -> None:
    if len(body) != size:
        msg = f"{what} frame body is {len(body)} bytes, must be {size}"
        raise WireFormatError(msg)


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"{what} is not valid UTF-8"
        raise WireFormatError(msg) from exc


def _query_id(body: bytes, start: int, what: str) -> str:
    if len(body) - start > MAX_QUERY_ID_BYTES:
        msg = f"{what} frame carries a {len(body) - start}-byte query id; the limit is {MAX_QUERY_ID_BYTES}"
        raise WireFormatError(msg)
    return _utf8(body[start:], "query id")


def _read_tasks(body: bytes, pos: int, what: str) -> tuple[frozenset[int], int]:
    _need(body, pos + 2, what)
    (count,) = _U16.unpack_from(body, pos)
    pos += 2
    _need(body, pos + 2 * count, what)
    tasks = struct.unpack_from(f">{count}h", body, pos)
    if any(t < 0 for t in tasks):
        msg = f"{what} frame names a negative task id"
        raise WireFormatError(msg)
    return frozenset(tasks), pos + 2 * count


def _decode_control(code: int, body: bytes) -> ControlFrame:
    if code == LOAD_METRICS:
        if len(body) % _LOAD_ENTRY.size:
            msg = f"load-metrics frame body of {len(body)} bytes is not a multiple of {_LOAD_ENTRY.size}"
            raise WireFormatError(msg)
        loads = dict(_LOAD_ENTRY.iter_unpack(body))
        if any(t < 0 for t in loads):
            msg = "load-metrics frame names a negative task id"
            raise WireFormatError(msg)
        if not all(0.0 <= v <= 1.0 for v in loads.values()):  # also false for NaN
            msg = "load-metrics frame holds a load outside 0..1 (or NaN)"
            raise WireFormatError(msg)
        return LoadMetrics(loads)
    if code == SEQ:
        _exact(body, _SEQ.size, "SEQ")
        first, count = _SEQ.unpack(body)
        if first < 0 or count < 0:
            msg = f"SEQ frame has negative first={first} or count={count}"
            raise WireFormatError(msg)
        if first > MAX_SEQ - count:  # the sequence after the run must fit a RECEIPT too
            msg = f"SEQ frame's run first={first} count={count} passes the largest sequence number {MAX_SEQ}"
            raise WireFormatError(msg)
        return Seq(first, count)
    if code == RECEIPT:
        _exact(body, _RECEIPT.size, "RECEIPT")
        return Receipt(_RECEIPT.unpack(body)[0])
    if code in (CLOSE, EOB):
        _exact(body, 0, "CLOSE" if code == CLOSE else "EOB")
        return Close() if code == CLOSE else Eob()
    if code == FAILURE:
        return Failure(body.decode("utf-8", errors="replace"))
    if code == BACKPRESSURE:
        _need(body, 2, "backpressure")
        (wlen,) = _U16.unpack_from(body, 0)
        _need(body, 2 + wlen, "backpressure")
        worker = _utf8(body[2 : 2 + wlen], "backpressure worker id")
        bp, pos = _read_tasks(body, 2 + wlen, "backpressure")
        non_bp, pos = _read_tasks(body, pos, "backpressure")
        _exact(body, pos, "backpressure")
        return BackpressureStatus(worker, bp, non_bp)
    if code == HELLO:
        _need(body, _HELLO_FIXED.size, "HELLO")
        magic, version, _flags, session, nonce, tlen = _HELLO_FIXED.unpack_from(body)
        if magic != MAGIC:
            msg = f"bad magic {magic!r} in HELLO (expected {MAGIC!r}): not a spark-storm peer"
            raise WireFormatError(msg)
        _exact(body, _HELLO_FIXED.size + tlen, "HELLO")
        topo = _utf8(body[_HELLO_FIXED.size :], "HELLO topology id")
        return Hello(version, topo, session, nonce)
    if code == CHALLENGE:
        _exact(body, _CHALLENGE.size, "CHALLENGE")
        magic, version, flags, nonce = _CHALLENGE.unpack(body)
        if magic != MAGIC:
            msg = f"bad magic {magic!r} in CHALLENGE (expected {MAGIC!r}): not a spark-storm peer"
            raise WireFormatError(msg)
        return Challenge(version, bool(flags & 1), nonce)
    if code == AUTH:
        if len(body) not in (0, 32):
            msg = f"AUTH frame body is {len(body)} bytes, must be 0 or 32"
            raise WireFormatError(msg)
        return Auth(body)
    if code == OK:
        _need(body, _OK_FIXED.size, "OK")
        resume, mlen = _OK_FIXED.unpack_from(body)
        _exact(body, _OK_FIXED.size + mlen, "OK")
        return Ok(body[_OK_FIXED.size :], resume)
    if code == BATCH_HEADER:
        _need(body, _BATCH_HEADER.size, "batch header")
        batch, part, seq, count, level = _BATCH_HEADER.unpack_from(body)
        required = level & ~COORDINATED_BATCH
        if count < 0 or required not in (ACCEPTED, PROCESSED):
            msg = (
                f"batch header has count {count} / required {level}; needs count >= 0, required 1 or 2 "
                f"(plus {COORDINATED_BATCH} for a coordinated batch)"
            )
            raise WireFormatError(msg)
        query = _query_id(body, _BATCH_HEADER.size, "batch header")
        return BatchHeader(query, batch, part, seq, count, required, bool(level & COORDINATED_BATCH))
    if code == BATCH_ACK:
        _need(body, _BATCH_ACK.size, "batch ack")
        batch, part, seq, status = _BATCH_ACK.unpack_from(body)
        return BatchAck(_query_id(body, _BATCH_ACK.size, "batch ack"), batch, part, seq, status)
    if code == BATCH_COMMIT:
        _need(body, _BATCH_COMMIT.size, "batch commit")
        (batch,) = _BATCH_COMMIT.unpack_from(body)
        return BatchCommit(_query_id(body, _BATCH_COMMIT.size, "batch commit"), batch)
    if code in (REQUEST, REPLY):
        _need(body, _REQUEST.size, "request" if code == REQUEST else "reply")
        request_id, op = _REQUEST.unpack_from(body)
        rest = bytes(body[_REQUEST.size :])
        return ControlRequest(request_id, op, rest) if code == REQUEST else ControlReply(request_id, op, rest)
    if code == BATCH_QUERY:
        _need(body, _BATCH_QUERY.size, "batch query")
        batch, part, seq, required = _BATCH_QUERY.unpack_from(body)
        if required not in (ACCEPTED, PROCESSED):
            msg = f"batch query has required {required}; needs 1 or 2"
            raise WireFormatError(msg)
        return BatchQuery(_query_id(body, _BATCH_QUERY.size, "batch query"), batch, part, seq, required)
    msg = f"unknown control code {code}"
    raise WireFormatError(msg)


_KNOWN_CODES: Final = frozenset(
    {
        LOAD_METRICS,
        CLOSE,
        OK,
        EOB,
        FAILURE,
        BACKPRESSURE,
        HELLO,
        CHALLENGE,
        AUTH,
        SEQ,
        RECEIPT,
        BATCH_HEADER,
        BATCH_ACK,
        BATCH_COMMIT,
        REQUEST,
        REPLY,
        BATCH_QUERY,
    }
)


class FrameDecoder:
    """Incremental decoder: feed it bytes as they arrive, get whole frames back.

    Handles partial reads, many frames per read and frames split across reads.  Data
    frames come back in runs (:class:`MessageBatch`, columnar), with control frames
    between runs, so receivers handle a run with one call instead of one per message.
    A frame split across reads is completed from the next read's first bytes; the rest
    of that read is decoded in place (no copy of the whole buffer).

    Parameters
    ----------
    max_frame_bytes : int
        Largest body accepted (``storm.messaging.max.frame.bytes``); a server lowers it to
        :data:`HANDSHAKE_FRAME_MAX` until the peer's handshake completed.
    """

    __slots__ = ("_controls", "_max", "_max_controls", "_rest")

    def __init__(self, max_frame_bytes: int) -> None:
        self._max = max_frame_bytes
        self._rest = bytearray()
        self._controls = 0
        self._max_controls: int | None = None

    @property
    def buffered(self) -> int:
        """Bytes held back waiting for the rest of a frame."""
        return len(self._rest)

    @property
    def max_frame_bytes(self) -> int:
        """Largest frame body accepted from now on."""
        return self._max

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        self._max = value

    def feed(self, data: bytes, max_controls: int | None = None) -> list[Decoded]:
        """Decode every complete frame in what was buffered plus ``data``.

        ``max_controls`` bounds the control frames decoded in this call (a flood of tiny
        control frames is refused after that many, not decoded to the end).

        Raises
        ------
        WireFormatError
            Unknown control code, a length over the limit or negative, a bad body, or more
            than ``max_controls`` control frames.  The decoder is unusable afterwards:
            close the connection.
        """
        self._controls = 0
        self._max_controls = max_controls
        with memoryview(data) as view:  # its slices are not copies
            return self._feed(data, view)

    def _feed(self, data: bytes, view: memoryview) -> list[Decoded]:
        out: list[Decoded] = []
        pos = 0
        rest = self._rest
        if rest:
            # Finish the frame that straddles the previous read, using only what it needs.
            if len(rest) < HEADER_SIZE:
                take = min(HEADER_SIZE - len(rest), len(data))
                rest += view[:take]
                pos = take
                if len(rest) < HEADER_SIZE:
                    return out
            code, length = self._check_header(rest)
            need = HEADER_SIZE + length - len(rest)
            if len(data) - pos < need:
                rest += view[pos:]
                return out
            rest += view[pos : pos + need]
            pos += need
            if code >= 0:  # a data frame (a big one spans reads): its payload is copied out once
                with memoryview(rest) as whole:
                    payload = bytes(whole[HEADER_SIZE:])
                rest.clear()
                out.append(MessageBatch([code], [payload]))
            else:
                frame = bytes(rest)
                rest.clear()
                self._decode(frame, 0, out)
        end = self._decode(data, pos, out)
        if end < len(data):
            rest += view[end:]
        return out

    def _check_header(self, buf: bytes | bytearray) -> tuple[int, int]:
        code, length = HEADER.unpack_from(buf, 0)
        if length < 0 or length > self._max:
            msg = f"frame length {length} (code {code}) is outside 0..{self._max} (storm.messaging.max.frame.bytes)"
            raise WireFormatError(msg)
        if code < 0 and code not in _KNOWN_CODES:
            msg = f"unknown control code {code}"
            raise WireFormatError(msg)
        return code, length

    def _decode(self, buf: bytes, pos: int, out: list[Decoded]) -> int:
        """Decode whole frames of ``buf`` from ``pos`` into ``out``; return where it stopped."""
        n = len(buf)
        tasks: list[int] = []
        payloads: list[bytes] = []
        add_task = tasks.append
        add_payload = payloads.append
        unpack = HEADER.unpack_from
        limit = self._max
        while n - pos >= HEADER_SIZE:
            code, length = unpack(buf, pos)
            start = pos + HEADER_SIZE
            end = start + length
            if code >= 0 and end <= n and length <= limit and length >= 0:
                add_task(code)
                add_payload(buf[start:end])
                pos = end
                continue
            self._check_header(buf[pos : pos + HEADER_SIZE])
            if end > n:
                break
            self._controls += 1
            if self._max_controls is not None and self._controls > self._max_controls:
                msg = f"more than {self._max_controls} control frames in one message"
                raise WireFormatError(msg)
            frame = _decode_control(code, buf[start:end])
            if tasks:
                out.append(MessageBatch(tasks, payloads))
                tasks = []
                payloads = []
                add_task = tasks.append
                add_payload = payloads.append
            out.append(frame)
            pos = end
        if tasks:
            out.append(MessageBatch(tasks, payloads))
        return pos

    def check_eof(self) -> None:
        """Call when the stream ended: a half-received frame is a truncated stream.

        Raises
        ------
        WireFormatError
            Bytes of an unfinished frame remain.
        """
        if self._rest:
            msg = f"stream truncated: {len(self._rest)} bytes of an unfinished frame at end of stream"
            raise WireFormatError(msg)
