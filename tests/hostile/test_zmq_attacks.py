"""Attacks on zmq servers in their own process: claimed identities, oversized messages, control floods."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from spark_storm.messaging import ConnectionStatus
from spark_storm.messaging.wire import MAX_SEQ, Eob, encode_control
from spark_storm.transport import make_context
from tests.hostile.attack import (
    MiB,
    RssPeak,
    assert_refused_once_and_serving,
    cpu_seconds,
    evil_data,
    good_messages,
    send_good,
    served,
    zmq_handshake,
)
from tests.support import wait_until

pytestmark = pytest.mark.hostile

SECRET = "hostile-test-secret-0123456789abcdef"
ZMQ = {"storm.messaging.transport": "zmq"}


class Raw:
    """Raw zmq peers for a test; every socket is closed (then the context) at teardown."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.socks: list[zmq.Socket[Any]] = []

    def dealer(self, port: int, **options: Any) -> zmq.Socket[Any]:
        sock: zmq.Socket[Any] = self.ctx.socket(zmq.DEALER)
        self.socks.append(sock)
        sock.setsockopt(zmq.LINGER, 0)
        for name, value in options.items():
            sock.setsockopt(getattr(zmq, name), value)
        sock.connect(f"tcp://127.0.0.1:{port}")
        return sock

    def close(self) -> None:
        for sock in self.socks:
            sock.close(0)
        self.ctx.term()


@pytest.fixture
def raw() -> Iterator[Raw]:
    peers = Raw()
    yield peers
    peers.close()


def test_a_claimed_routing_identity_gets_nothing_delivered(tmp_path: Path, raw: Raw) -> None:
    conf = {**ZMQ, "storm.messaging.auth.secret": SECRET}
    with served(conf, tmp_path) as server:
        ctx = make_context(conf)
        victim = ctx.connect("h", "127.0.0.1", server.port)
        victim.send(good_messages(100))
        assert victim.flush(10)
        session = victim._session.session_id  # type: ignore[attr-defined]
        # While the victim is connected: claim its routing id (as it once was: b"S" + session
        # id, sent in clear), and a server-style one, and send data as if handshaken.
        attackers = [raw.dealer(server.port, ROUTING_ID=b"S" + session) for _ in range(2)]
        attackers.append(raw.dealer(server.port, ROUTING_ID=b"\x00" + session[:4]))
        for a in attackers:
            a.send(evil_data(1_000_000))
        victim.send(good_messages(100, 100))
        assert victim.flush(10)
        wait_until(lambda: server.metrics()["auth_failures"] >= 3, what="the claimants to be refused")
        # After the victim left: its state must be gone, and claiming it must still give nothing.
        victim.close()
        wait_until(lambda: server.metrics()["connections"] == 0, what="the victim's state to be dropped")
        late = raw.dealer(server.port, ROUTING_ID=b"S" + session)
        late.send(evil_data(1_000_000))
        wait_until(lambda: server.metrics()["auth_failures"] >= 4, what="the late claimant to be refused")
        metrics = server.metrics()
        ctx.term()
    assert metrics["evil"] == 0
    assert metrics["good"] == 200


def test_curve_keys_from_config_admit_only_allowed_clients(tmp_path: Path, raw: Raw) -> None:
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    server_conf = {
        **ZMQ,
        "storm.messaging.zmq.curve.server.secret.key": server_secret.decode(),
        "storm.messaging.zmq.curve.client.allowed.keys": [client_public.decode()],
    }
    client_conf = {
        **ZMQ,
        "storm.messaging.zmq.curve.server.public.key": server_public.decode(),
        "storm.messaging.zmq.curve.client.secret.key": client_secret.decode(),
    }
    with served(server_conf, tmp_path) as server:
        ctx = send_good(client_conf, server.port, 1_000)
        # Knowing the server's public key (it is public) is not enough: the client key is checked.
        other_public, other_secret = zmq.curve_keypair()
        intruder = raw.dealer(
            server.port,
            CURVE_SERVERKEY=server_public,
            CURVE_PUBLICKEY=other_public,
            CURVE_SECRETKEY=other_secret,
        )
        intruder.send(evil_data(0))
        wait_until(lambda: server.metrics()["auth_failures"] >= 1, what="the intruder's key to be refused")
        metrics = server.metrics()
        ctx.term()
    assert metrics["good"] == 1_000
    assert metrics["evil"] == 0


def test_an_oversized_message_before_the_handshake_is_dropped_by_libzmq(tmp_path: Path, raw: Raw) -> None:
    with served(ZMQ, tmp_path) as server:
        before = server.rss_kb()
        with RssPeak(server.pid) as rss:
            attacker = raw.dealer(server.port)
            attacker.send(b"\0" * (128 * MiB))
            ctx = send_good(ZMQ, server.port, 1_000)
            wait_until(lambda: server.metrics()["good"] == 1_000, what="the good client")
        after = server.rss_kb()
        ctx.term()
    print(f"zmq 128 MiB message: RSS before {before} KiB, peak {rss.peak} KiB, after {after} KiB")
    assert rss.peak - before < 32 * 1024, (before, rss.peak)


@pytest.mark.parametrize("handshaken", [False, True], ids=["unauthenticated", "after-handshake"])
def test_a_control_frame_flood_does_not_stall_the_server(tmp_path: Path, raw: Raw, handshaken: bool) -> None:
    flood = encode_control(Eob()) * (16 * MiB // 6)  # 2.8 M EOB frames in one message
    with served(ZMQ, tmp_path) as server:
        ctx = make_context(ZMQ)
        client = ctx.connect("h", "127.0.0.1", server.port)
        assert client.wait_ready(10)
        attacker = raw.dealer(server.port)
        if handshaken:
            zmq_handshake(attacker)
        cpu0 = cpu_seconds(server.pid)
        attacker.send(flood)
        # The flood has reached the server: refused, or (a server decoding all of it) burning CPU.
        wait_until(
            lambda: server.metrics()["protocol_errors"] >= 1 or cpu_seconds(server.pid) - cpu0 > 0.3,
            what="the flood to reach the server",
        )
        started = time.monotonic()
        client.send(good_messages(1_000))
        assert client.flush(10)
        took = time.monotonic() - started
        wait_until(lambda: server.metrics()["protocol_errors"] >= 1, what="the flood to be refused")
        metrics = server.metrics()
        ctx.term()
    print(f"zmq EOB flood ({'after' if handshaken else 'before'} handshake): 1,000 good messages took {took:.2f}s")
    assert metrics["good"] == 1_000
    assert took < 2.0, f"the good client waited {took:.2f}s behind the flood"


def test_a_big_send_is_split_under_the_message_limit() -> None:
    conf = {**ZMQ, "storm.messaging.max.frame.bytes": 4096}
    sctx, cctx = make_context(conf), make_context(conf)
    try:
        got: list[Any] = []
        server = sctx.bind("h", 0, got.extend)
        client = cctx.connect("h", "127.0.0.1", server.port)
        msgs = good_messages(2_000)  # ~20 KB in one send: many messages of <= 4 KiB each
        client.send(msgs)
        assert client.flush(10)
        assert got == msgs
        assert client.status is ConnectionStatus.READY
        assert server.metrics()["protocol_errors"] == 0
    finally:
        cctx.term()
        sctx.term()


def test_a_seq_past_the_largest_sequence_number_is_refused_and_the_server_keeps_serving(
    tmp_path: Path, raw: Raw
) -> None:
    with served(ZMQ, tmp_path) as server:
        attacker = raw.dealer(server.port)
        zmq_handshake(attacker)
        attacker.send(evil_data(MAX_SEQ, 2))
        assert attacker.poll(10_000), "no answer to the SEQ"
        assert b"passes the largest sequence number" in attacker.recv()
        assert_refused_once_and_serving(server, ZMQ)
