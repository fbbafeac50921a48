"""After the handshake (no secret is the default): groups, query ids and the ledger are bounded,
and a dead peer's memory goes with it."""

from __future__ import annotations

import gc
import socket
import struct
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from spark_storm.messaging import TaskMessage
from spark_storm.messaging.wire import BatchAck, BatchHeader, FrameDecoder, Seq, encode_control, encode_messages
from spark_storm.transport import make_context
from tests.hostile.attack import MiB, RssPeak, frame_header, raw_handshake, send_good, served, zmq_handshake
from tests.support import wait_until

pytestmark = pytest.mark.hostile

TCP = {"storm.messaging.transport": "tcp"}
BATCH_HEADER = -800


class Drain:
    """Reads (and counts the acks of) what the server answers, so its replies never back up."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.acks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        decoder = FrameDecoder(1 << 20)
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            self.acks += sum(1 for f in decoder.feed(data) if isinstance(f, BatchAck))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def attacker() -> Iterator[socket.socket]:
    socks: list[socket.socket] = []

    def connect(port: int) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        socks.append(sock)
        raw_handshake(sock)
        return sock

    yield connect  # type: ignore[misc]
    for s in socks:
        s.close()


def _send_until_closed(sock: socket.socket, data: bytes, total: int) -> int:
    sent = 0
    try:
        while sent < total:
            sock.sendall(data)
            sent += len(data)
    except OSError:
        pass  # refused and closed: what a bounded server does
    return sent


def test_a_group_announcing_2_31_frames_is_refused_at_its_header(tmp_path: Path, attacker: Any) -> None:
    with served(TCP, tmp_path) as server:
        sock = attacker(server.port)
        before = server.rss_kb()
        header = encode_control(BatchHeader("q", 1, 0, 0, 2**31 - 1))
        frames = encode_messages([TaskMessage(1, b"\xcd" * 65536)] * 16)
        with RssPeak(server.pid) as rss:
            sock.sendall(header + encode_control(Seq(0, 2**31 - 1)))
            sent = _send_until_closed(sock, frames, 256 * MiB)
            ctx = send_good(TCP, server.port, 5_000)
        assert rss.peak - before < 48 * 1024, (before, rss.peak)
        wait_until(lambda: server.metrics()["connections"] == 1, what="the attacker to be dropped")
        after = server.rss_kb()
        metrics = server.metrics()
        ctx.term()
    print(f"group 2^31: RSS before {before} KiB, peak {rss.peak} KiB, after {after} KiB ({sent >> 20} MiB sent)")
    assert rss.peak - before < 48 * 1024, (before, rss.peak)
    assert metrics["protocol_errors"] >= 1
    assert metrics["good"] == 5_000


def test_a_group_is_bounded_in_bytes_and_freed_when_its_peer_goes(tmp_path: Path, attacker: Any) -> None:
    conf = {**TCP, "storm.messaging.server.group.max.bytes": 32 * MiB}
    with served(conf, tmp_path) as server:
        sock = attacker(server.port)
        before = server.rss_kb()
        frames = encode_messages([TaskMessage(1, b"\xcd" * 65536)] * 16)
        with RssPeak(server.pid) as rss:
            sock.sendall(encode_control(BatchHeader("q", 1, 0, 0, 1_000_000)) + encode_control(Seq(0, 1_000_000)))
            sent = _send_until_closed(sock, frames, 256 * MiB)
        assert rss.peak - before < 80 * 1024, (before, rss.peak)
        wait_until(lambda: server.metrics()["connections"] == 0, what="the attacker to be dropped")
        after = server.rss_kb()
        metrics = server.metrics()
    print(f"group bytes: RSS before {before} KiB, peak {rss.peak} KiB, after {after} KiB ({sent >> 20} MiB sent)")
    assert rss.peak - before < 80 * 1024, (before, rss.peak)
    assert metrics["buffered_bytes"] == 0
    assert metrics["protocol_errors"] == 1


def test_a_query_id_longer_than_the_encoder_allows_is_refused(tmp_path: Path, attacker: Any) -> None:
    with served(TCP, tmp_path) as server:
        sock = attacker(server.port)
        before = server.rss_kb()
        # A batch header (batch 1, partition 0, sequence 0, count 0, required ACCEPTED) with an
        # 8 MiB query id; the encoder refuses anything over 65,535 bytes.
        body = struct.pack(">qiqiB", 1, 0, 0, 0, 1) + b"q" * (8 * MiB)
        with RssPeak(server.pid) as rss:
            drain = Drain(sock)
            for _ in range(8):
                try:
                    sock.sendall(frame_header(BATCH_HEADER, len(body)) + body)
                except OSError:
                    break
            wait_until(lambda: server.metrics()["connections"] == 0, what="the attacker to be dropped")
            drain.stop()
        metrics = server.metrics()
    print(f"8 MiB query ids: RSS before {before} KiB, peak {rss.peak} KiB")
    assert metrics["protocol_errors"] == 1
    assert metrics["ledger_size"] == 0
    assert rss.peak - before < 48 * 1024, (before, rss.peak)


def test_the_ledger_is_bounded_in_bytes(tmp_path: Path, attacker: Any) -> None:
    limit = 8 * MiB
    conf = {**TCP, "storm.messaging.server.ledger.max.bytes": limit}
    with served(conf, tmp_path) as server:
        sock = attacker(server.port)
        before = server.rss_kb()
        drain = Drain(sock)
        query = "q" * 60_000  # legal: under the 65,535-byte limit
        with RssPeak(server.pid) as rss:
            for batch in range(2_000):  # 2,000 x 60 KB = 120 MB of query ids if nothing bounded them
                sock.sendall(encode_control(BatchHeader(query, batch, 0, 0, 0)))
            wait_until(lambda: drain.acks == 2_000, what="every group to be acked", timeout=30)
        metrics = server.metrics()
        drain.stop()
        ctx = send_good(TCP, server.port, 1_000)
        good = server.metrics()["good"]
        ctx.term()
    print(
        f"ledger: RSS before {before} KiB, peak {rss.peak} KiB; {metrics['ledger_size']} entries, "
        f"{metrics['ledger_bytes']} bytes"
    )
    assert metrics["ledger_bytes"] <= limit
    assert rss.peak - before < 48 * 1024, (before, rss.peak)
    assert good == 1_000


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
def test_a_dead_peer_is_released_at_once_without_the_garbage_collector(transport: str) -> None:
    ctx = make_context({"storm.messaging.transport": transport})
    raw: zmq.Context[Any] = zmq.Context()
    gc.disable()
    try:
        server = ctx.bind("h", 0, lambda b: None)
        partial = encode_control(BatchHeader("q", 1, 0, 0, 1000)) + encode_control(Seq(0, 1000))
        partial += encode_messages([TaskMessage(1, b"\xcd" * 10_000)] * 400)  # 4 MB of an unfinished group
        if transport == "tcp":
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            raw_handshake(sock)
            sock.sendall(partial)
            wait_until(lambda: server.metrics()["buffered_bytes"] >= 4_000_000, what="the partial group")
            (peer,) = [c.proto for c in server._conns.values()]  # type: ignore[attr-defined]
            sock.close()
        else:
            dealer = raw.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(f"tcp://127.0.0.1:{server.port}")
            zmq_handshake(dealer)
            dealer.send(partial)
            wait_until(lambda: server.metrics()["buffered_bytes"] >= 4_000_000, what="the partial group")
            (peer,) = list(server._peers.values())  # type: ignore[attr-defined]
            dealer.close(0)
        gone = weakref.ref(peer)
        del peer
        wait_until(lambda: server.metrics()["connections"] == 0, what="the peer to be dropped")
        wait_until(lambda: gone() is None, what="the peer to be freed (no cycle, no lingering reference)", timeout=2)
        assert server.metrics()["buffered_bytes"] == 0
    finally:
        gc.enable()
        ctx.term()
        raw.term()
