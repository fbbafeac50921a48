"""Bounds of the codec, the session protocol and the ledger; CURVE keys from config (no sockets)."""

from __future__ import annotations

import struct

import pytest

from spark_storm.config import Config
from spark_storm.errors import ConfigError, WireFormatError
from spark_storm.messaging import TaskMessage
from spark_storm.messaging.wire import (
    HANDSHAKE_MAX_BYTES,
    MAX_QUERY_ID_BYTES,
    PROTOCOL_VERSION,
    Auth,
    BatchHeader,
    Eob,
    FrameDecoder,
    Hello,
    Seq,
    encode_control,
    encode_messages,
    split_at_frames,
)
from spark_storm.transport import make_context
from spark_storm.transport._base import ServerBase
from spark_storm.transport._ledger import DeliveryLedger
from spark_storm.transport._session import MAX_CONTROLS_PER_MESSAGE, PeerLimits, ServerPeer, SessionTable
from spark_storm.transport.curve import curve_keys, derive_secret_key

LIMITS = PeerLimits(max_frame_bytes=1 << 20, group_max_frames=100, group_max_bytes=10_000)


@pytest.fixture
def server() -> ServerBase:
    ctx = make_context({"storm.messaging.transport": "local"})
    srv = ctx.bind("t", 0, lambda b: None)
    assert isinstance(srv, ServerBase)
    return srv


def _peer(server: ServerBase, **kw: object) -> ServerPeer:
    return ServerPeer(server, SessionTable(8), None, "p", LIMITS, lambda f: None, **kw)  # type: ignore[arg-type]


def _handshake() -> bytes:
    return encode_control(Hello(PROTOCOL_VERSION, "t", b"s" * 16, b"n" * 16)) + encode_control(Auth(b""))


def test_query_ids_over_the_encoder_limit_are_refused_by_the_decoder() -> None:
    body = struct.pack(">qiqiB", 1, 0, 0, 0, 1) + b"q" * (MAX_QUERY_ID_BYTES + 1)
    with pytest.raises(WireFormatError, match="query id"):
        FrameDecoder(1 << 20).feed(struct.pack(">hi", -800, len(body)) + body)
    ok = struct.pack(">qiqiB", 1, 0, 0, 0, 1) + b"q" * MAX_QUERY_ID_BYTES
    (header,) = FrameDecoder(1 << 20).feed(struct.pack(">hi", -800, len(ok)) + ok)
    assert isinstance(header, BatchHeader)


def test_before_the_handshake_only_handshake_sized_data_is_read(server: ServerBase) -> None:
    peer = _peer(server)
    with pytest.raises(WireFormatError, match="outside 0"):
        peer.on_bytes(struct.pack(">hi", 1, 1 << 20))  # a data frame header announcing 1 MiB
    peer = _peer(server)
    with pytest.raises(WireFormatError, match="before completing the handshake"):
        peer.on_bytes(b"\0" * (HANDSHAKE_MAX_BYTES + 1))  # refused before any decoding
    peer = _peer(server)
    peer.on_bytes(_handshake())
    assert peer.ready
    peer.on_bytes(encode_control(Seq(0, 1)) + encode_messages([TaskMessage(1, b"x" * 100_000)]))


def test_a_message_with_more_control_frames_than_allowed_is_refused(server: ServerBase) -> None:
    peer = _peer(server, message_controls=MAX_CONTROLS_PER_MESSAGE)
    peer.on_bytes(_handshake())
    peer.on_bytes(encode_control(Eob()) * MAX_CONTROLS_PER_MESSAGE)
    with pytest.raises(WireFormatError, match="control frames in one message"):
        peer.on_bytes(encode_control(Eob()) * 1_000_000)


def test_groups_are_bounded_in_frames_at_the_header_and_in_bytes(server: ServerBase) -> None:
    peer = _peer(server)
    peer.on_bytes(_handshake())
    with pytest.raises(WireFormatError, match=r"group\.max\.frames"):
        peer.on_bytes(encode_control(BatchHeader("q", 1, 0, 0, 2**31 - 1)))
    peer = _peer(server)
    peer.on_bytes(_handshake())
    peer.on_bytes(encode_control(BatchHeader("q", 1, 0, 0, 50)) + encode_control(Seq(0, 50)))
    peer.on_bytes(encode_messages([TaskMessage(1, b"x" * 1000)] * 9))
    assert peer.buffered_bytes == 9000
    with pytest.raises(WireFormatError, match=r"group\.max\.bytes"):
        peer.on_bytes(encode_messages([TaskMessage(1, b"x" * 1000)] * 2))


def test_release_frees_a_peer_and_its_reply_path(server: ServerBase) -> None:
    peer = _peer(server)
    peer.on_bytes(_handshake())
    peer.on_bytes(encode_control(BatchHeader("q", 1, 0, 0, 50)) + encode_control(Seq(0, 50)))
    peer.on_bytes(encode_messages([TaskMessage(1, b"x" * 1000)] * 5) + b"\0\1\0\0")  # and half a header
    assert peer.buffered_bytes > 5000
    peer.release()
    assert peer.buffered_bytes == 0
    assert peer._reply is None


def test_the_ledger_is_bounded_in_bytes_as_well_as_entries() -> None:
    ledger = DeliveryLedger(max_entries=1_000_000, max_bytes=1 << 20)
    query = "q" * 60_000
    for batch in range(100):
        assert ledger.begin(BatchHeader(query, batch, 0, 0, 0), lambda ack: None)
    assert ledger.size_bytes <= 1 << 20
    assert len(ledger) < 20
    assert ledger.evicted == 100 - len(ledger)
    held = len(ledger)
    assert ledger.forget(query, 99) == held
    assert ledger.size_bytes == 0


def test_split_at_frames_keeps_every_piece_under_the_limit_at_frame_boundaries() -> None:
    chunk = encode_control(Seq(0, 30)) + encode_messages([TaskMessage(i, bytes(i * 7)) for i in range(30)])
    pieces = split_at_frames(chunk, 400)
    assert b"".join(pieces) == chunk
    assert all(len(p) <= 400 or len(p) == 6 + 29 * 7 for p in pieces)
    decoder = FrameDecoder(1 << 20)
    for piece in pieces:
        decoder.feed(piece)
        decoder.check_eof()  # every piece ends at a frame boundary
    assert split_at_frames(chunk, len(chunk)) == [chunk]


def test_curve_keys_are_derived_from_the_secret_or_taken_from_config() -> None:
    assert curve_keys(Config.of({})) is None
    a = curve_keys(Config.of({"storm.messaging.auth.secret": "x" * 32}))
    b = curve_keys(Config.of({"storm.messaging.auth.secret": "x" * 32}))
    c = curve_keys(Config.of({"storm.messaging.auth.secret": "y" * 32}))
    assert a is not None
    assert b is not None
    assert c is not None
    assert a == b  # every process with the secret derives the same keys ...
    assert a.server_secret != c.server_secret  # ... and another secret others
    assert a.server_secret != a.client_secret  # roles are separated
    assert a.allowed == {a.client_public}
    assert derive_secret_key(b"x" * 32, b"server") == a.server_secret
    assert len(a.server_secret or b"") == 40


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"storm.messaging.zmq.curve.server.secret.key": "short"}, "40-character Z85"),
        ({"storm.messaging.zmq.curve.client.allowed.keys": ["\x7f" * 40]}, "40-character Z85"),
    ],
)
def test_bad_curve_keys_are_clear_errors(conf: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        curve_keys(Config.of(conf))


def test_explicit_curve_keys_must_be_complete_for_the_role() -> None:
    import zmq

    public, secret = zmq.curve_keypair()
    keys = curve_keys(Config.of({"storm.messaging.zmq.curve.server.public.key": public.decode()}))
    assert keys is not None
    with pytest.raises(ConfigError, match=r"client\.secret\.key"):
        keys.for_client()
    with pytest.raises(ConfigError, match=r"server\.secret\.key"):
        keys.for_server()
    other, _ = zmq.curve_keypair()
    with pytest.raises(ConfigError, match="not one keypair"):
        curve_keys(
            Config.of(
                {
                    "storm.messaging.zmq.curve.server.public.key": other.decode(),
                    "storm.messaging.zmq.curve.server.secret.key": secret.decode(),
                }
            )
        )
