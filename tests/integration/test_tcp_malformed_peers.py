"""Raw sockets feed a tcp server garbage; it drops that peer and keeps serving the rest."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest

from spark_storm.messaging import ConnectionStatus, IContext, IServer, TaskMessage
from spark_storm.messaging.handshake import ClientHandshake, new_session_id
from spark_storm.messaging.wire import Challenge, FrameDecoder, Hello, encode_control, encode_messages
from spark_storm.transport import make_context
from tests.support import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def served() -> Iterator[tuple[IContext, IServer, list[TaskMessage]]]:
    ctx = make_context(
        {
            "storm.messaging.transport": "tcp",
            "storm.messaging.max.frame.bytes": 1024,
            "storm.messaging.handshake.timeout.ms": 500,
        }
    )
    got: list[TaskMessage] = []
    server = ctx.bind("t", 0, got.extend)
    yield ctx, server, got
    ctx.term()


def _raw(server: IServer, data: bytes, *, half_close: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                chunk = sock.recv(4096)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


GARBAGE = {
    "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad-magic": encode_control(Hello(1, "t", b"s" * 16, b"n" * 16)).replace(b"STRM", b"XXXX"),
    "data-before-handshake": encode_messages([TaskMessage(1, b"sneaky")]),
    "oversized": struct.pack(">hi", 1, 1_000_000),
    "unknown-code": struct.pack(">hi", -999, 0),
    "truncated": encode_control(Hello(1, "t", b"s" * 16, b"n" * 16))[:-3],
    "random": bytes(range(256)) * 4,
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_closes_that_peer_only(
    served: tuple[IContext, IServer, list[TaskMessage]], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    ctx, server, got = served
    good = ctx.connect("t", "127.0.0.1", server.port)
    assert good.wait_ready(10)
    reply = _raw(server, GARBAGE[name])
    # The server answered with a FAILURE frame (code -400) naming the reason, then closed.
    if name != "truncated":
        assert struct.unpack(">h", reply[:2])[0] in (-701, -400)
    wait_until(lambda: server.metrics()["protocol_errors"] >= 1, what="the error to be counted")
    # Logged with the peer and the reason.
    assert any("closing connection from 127.0.0.1:" in r.getMessage() for r in caplog.records)
    good.send(TaskMessage(3, b"still served"))
    wait_until(lambda: got == [TaskMessage(3, b"still served")], what="the good client to be served")
    assert server.metrics()["received"] == 1


def test_silent_peer_is_dropped_after_the_handshake_deadline(
    served: tuple[IContext, IServer, list[TaskMessage]],
) -> None:
    _, server, _ = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        wait_until(lambda: server.metrics()["protocol_errors"] >= 1, what="the idle peer to be dropped")
        sock.settimeout(5)
        data = sock.recv(4096)
        assert b"handshake not completed in time" in data


def test_zmq_server_refuses_a_garbage_peer_and_serves_the_rest() -> None:
    import zmq

    ctx = make_context({"storm.messaging.transport": "zmq"})
    got: list[TaskMessage] = []
    server = ctx.bind("t", 0, got.extend)
    good = ctx.connect("t", "127.0.0.1", server.port)
    assert good.wait_ready(10)
    raw = zmq.Context()
    dealer = raw.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{server.port}")
    try:
        for junk in GARBAGE.values():
            dealer.send(junk)
        wait_until(lambda: server.metrics()["protocol_errors"] >= 5, what="garbage to be refused")
        assert dealer.poll(5000)
        assert struct.unpack(">h", dealer.recv()[:2])[0] in (-400, -701)
        good.send(TaskMessage(2, b"fine"))
        wait_until(lambda: got == [TaskMessage(2, b"fine")], what="the good client to be served")
    finally:
        dealer.close()
        raw.term()
        ctx.term()


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
def test_a_server_whose_io_thread_failed_says_closed(transport: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = make_context({"storm.messaging.transport": transport})
    try:
        server = ctx.bind("t", 0, lambda batch: None)
        assert server.status is ConnectionStatus.READY

        def broken(*args: object) -> None:
            msg = "an injected fault in the I/O loop"
            raise RuntimeError(msg)

        # Each loop reads through this method when a peer's connection or message arrives.
        monkeypatch.setattr(server, "_accept" if transport == "tcp" else "_read_some", broken)
        ctx.connect("t", "127.0.0.1", server.port)
        wait_until(lambda: server.status is ConnectionStatus.CLOSED, what="the failed server to say CLOSED")
    finally:
        ctx.term()


def test_a_zmq_peer_that_never_completes_its_handshake_is_forgotten_at_the_deadline() -> None:
    import zmq

    ctx = make_context({"storm.messaging.transport": "zmq", "storm.messaging.handshake.timeout.ms": 300})
    raw = zmq.Context()
    dealer = raw.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        server = ctx.bind("t", 0, lambda batch: None)
        dealer.connect(f"tcp://127.0.0.1:{server.port}")
        dealer.send(encode_control(ClientHandshake("t", new_session_id(), None, "server").hello()))
        decoder = FrameDecoder(1 << 20)
        assert dealer.poll(5000)
        assert isinstance(decoder.feed(dealer.recv())[0], Challenge)
        started = time.monotonic()
        assert dealer.poll(5000), "the server kept the silent peer past its handshake deadline"
        assert b"handshake not completed in time" in dealer.recv()
        assert time.monotonic() - started < 3.0
        assert server.metrics()["protocol_errors"] == 1
    finally:
        dealer.close()
        raw.term()
        ctx.term()


def test_non_zmq_peers_of_a_zmq_server_without_curve_are_protocol_errors_not_auth_failures() -> None:
    ctx = make_context({"storm.messaging.transport": "zmq"})
    try:
        server = ctx.bind("t", 0, lambda batch: None)
        linger = struct.pack("ii", 1, 0)
        for junk in GARBAGE.values():
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                sock.sendall(junk)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)  # an RST mid-handshake
        wait_until(lambda: server.metrics()["protocol_errors"] >= 1, what="the ZMTP handshake failures")
        assert server.metrics()["auth_failures"] == 0
    finally:
        ctx.term()
