"""Attacks on tcp servers in their own process: memory before auth, connection floods, fd exhaustion."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest

from spark_storm.messaging import ConnectionStatus
from spark_storm.messaging.wire import MAX_SEQ
from spark_storm.transport import make_context
from tests.hostile.attack import (
    MiB,
    RssPeak,
    assert_refused_once_and_serving,
    cpu_seconds,
    evil_data,
    frame_header,
    raw_handshake,
    send_good,
    served,
)
from tests.support import wait_until

pytestmark = pytest.mark.hostile

SECRET = "hostile-test-secret-0123456789abcdef"
TCP = {"storm.messaging.transport": "tcp"}


def _stream_junk(port: int, total: int, done: list[int]) -> None:
    """Announce a 16 MiB frame and stream ``total`` bytes of it without authenticating."""
    sent = 0
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(frame_header(1, 16 * MiB))
            chunk = b"\xab" * (256 * 1024)
            while sent < total:
                sock.sendall(chunk)
                sent += len(chunk)
    except OSError:
        pass  # the server closed us: what a fixed server does
    done.append(sent)


def test_unauthenticated_connections_cannot_make_the_server_buffer_frames(tmp_path: Path) -> None:
    conf = {**TCP, "storm.messaging.auth.secret": SECRET}
    with served(conf, tmp_path) as server:
        before = server.rss_kb()
        done: list[int] = []
        with RssPeak(server.pid) as rss:
            attackers = [threading.Thread(target=_stream_junk, args=(server.port, 8 * MiB, done)) for _ in range(32)]
            for t in attackers:
                t.start()
            ctx = send_good(conf, server.port, 20_000)
            for t in attackers:
                t.join(30)
        after = server.rss_kb()
        metrics = server.metrics()
        ctx.term()
    print(f"tcp pre-auth: RSS before {before} KiB, peak {rss.peak} KiB, after {after} KiB; {len(done)} attackers")
    # 32 x 8 MiB were sent at it; a server that buffered them grew by ~180 MiB.
    assert rss.peak - before < 48 * 1024, (before, rss.peak)
    assert metrics["good"] == 20_000
    assert metrics["protocol_errors"] >= 32, metrics


def test_a_connection_flood_cannot_lock_out_a_good_client(tmp_path: Path) -> None:
    conf = {**TCP, "storm.messaging.server.max.connections": 32, "storm.messaging.handshake.timeout.ms": 30_000}
    with served(conf, tmp_path) as server:
        flood = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(200)]
        try:
            wait_until(lambda: server.metrics()["accepted"] >= 200, what="the flood to be accepted")
            assert server.metrics()["connections"] <= 32
            ctx = send_good(conf, server.port, 5_000)
            metrics = server.metrics()
            ctx.term()
        finally:
            for s in flood:
                s.close()
    assert metrics["good"] == 5_000
    assert metrics["evicted_connections"] >= 168, metrics
    assert metrics["connections"] <= 32


def test_idle_authenticated_connections_time_out_and_keepalives_keep_good_ones(tmp_path: Path) -> None:
    conf = {**TCP, "storm.messaging.server.idle.timeout.ms": 600}
    with served(conf, tmp_path) as server:
        ctx = make_context(conf)
        client = ctx.connect("h", "127.0.0.1", server.port)
        assert client.wait_ready(10)
        for n in range(1, 4):  # three silent peers in a row: ~1.8 s, three idle timeouts
            idle = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            raw_handshake(idle)
            wait_until(lambda: server.metrics()["idle_timeouts"] >= n, what=f"silent peer {n} to time out")  # noqa: B023
            idle.settimeout(5)
            assert idle.recv(10) == b""  # closed by the server
            idle.close()
        # The good client, silent as well but sending keepalives, was never cut off.
        assert client.metrics()["reconnects"] == 0
        assert client.status is ConnectionStatus.READY
        assert server.metrics()["idle_timeouts"] == 3
        ctx.term()


def test_out_of_file_descriptors_backs_off_logs_once_and_recovers(tmp_path: Path) -> None:
    conf = {
        **TCP,
        "storm.messaging.server.idle.timeout.ms": 1500,
        "storm.messaging.handshake.timeout.ms": 1500,
        "storm.messaging.tcp.max_wait_ms": 200,
    }
    with served(conf, tmp_path, nofile=48) as server:
        hogs: list[socket.socket] = []
        for _ in range(60):  # more than the server has descriptors for; handshaken where possible
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            hogs.append(sock)
        for sock in hogs:
            sock.settimeout(0.3)
            with contextlib.suppress(OSError):  # in the backlog: the server has no descriptor to accept it
                raw_handshake(sock)
        wait_until(lambda: server.metrics()["accept_resource_errors"] >= 1, what="EMFILE on accept")
        cpu0 = cpu_seconds(server.pid)
        time.sleep(1.0)  # the window the CPU use is measured over (not a wait for a condition)
        cpu = cpu_seconds(server.pid) - cpu0
        # While out of descriptors the good client still gets in, once idle peers time out.
        started = time.monotonic()
        ctx = send_good(conf, server.port, 2_000, timeout=20)
        took = time.monotonic() - started
        metrics = server.metrics()
        ctx.term()
        for sock in hogs:
            sock.close()
        accept_logs = server.log_lines("cannot accept connections")
    print(f"fd exhaustion: server CPU {cpu:.2f}s in 1s, {accept_logs} accept log lines, good client in {took:.1f}s")
    assert metrics["good"] == 2_000
    assert cpu < 0.35, f"the accept loop spins: {cpu:.2f}s CPU in 1s"
    assert accept_logs <= 3


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
def test_a_wrong_secret_is_a_failed_attempt_with_backoff_and_max_retries(transport: str) -> None:
    server_ctx = make_context({"storm.messaging.transport": transport, "storm.messaging.auth.secret": SECRET})
    client_ctx = make_context(
        {
            "storm.messaging.transport": transport,
            "storm.messaging.auth.secret": "not-the-secret-0123456789abcdef0",
            "storm.messaging.tcp.max_retries": 3,
            "storm.messaging.tcp.min_wait_ms": 50,
            "storm.messaging.tcp.max_wait_ms": 200,
        }
    )
    try:
        server = server_ctx.bind("h", 0, lambda b: None)
        client = client_ctx.connect("h", "127.0.0.1", server.port)
        wait_until(lambda: client.status is ConnectionStatus.CLOSED, what="the client to give up", timeout=15)
        last_error = client.metrics()["last_error"]
        assert last_error is not None
        assert "authentication failed" in last_error
        assert client.metrics()["auth_failures"] >= 1
        refused = server.metrics()["auth_failures"]
        time.sleep(0.5)
        assert server.metrics()["auth_failures"] == refused, "the client kept trying after giving up"
        assert refused <= 6
    finally:
        client_ctx.term()
        server_ctx.term()


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
def test_a_wrong_secret_retries_at_the_backoff_rate(transport: str) -> None:
    server_ctx = make_context({"storm.messaging.transport": transport, "storm.messaging.auth.secret": SECRET})
    client_ctx = make_context(
        {
            "storm.messaging.transport": transport,
            "storm.messaging.auth.secret": "not-the-secret-0123456789abcdef0",
            "storm.messaging.tcp.min_wait_ms": 200,
            "storm.messaging.tcp.max_wait_ms": 2000,
        }
    )
    try:
        server = server_ctx.bind("h", 0, lambda b: None)
        client = client_ctx.connect("h", "127.0.0.1", server.port)
        wait_until(lambda: server.metrics()["auth_failures"] >= 1, what="the first refusal")
        first = time.monotonic()
        wait_until(lambda: server.metrics()["auth_failures"] >= 5, what="the fifth refusal", timeout=15)
        took = time.monotonic() - first
        # Backoff 200, 400, 800, 1600 ms: the fifth attempt comes >= 3 s after the first
        # (a retry loop that ignored the backoff made ~4.5 attempts a second).
        assert took >= 2.5, f"5 refused attempts in {took:.2f}s"
        assert client.status is ConnectionStatus.CONNECTING
        assert "authentication failed" in (client.metrics()["last_error"] or "")
    finally:
        client_ctx.term()
        server_ctx.term()


def test_a_seq_past_the_largest_sequence_number_is_refused_and_the_server_keeps_serving(tmp_path: Path) -> None:
    # Before the bound, SEQ(2**63-1, 2) was delivered, and the RECEIPT of 2**63 that cannot be
    # encoded ended the server's I/O thread: one peer closed the server for everyone.
    with served(TCP, tmp_path) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            raw_handshake(sock)
            sock.sendall(evil_data(MAX_SEQ, 2))
            answer = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    answer += chunk
        assert b"passes the largest sequence number" in answer
        assert_refused_once_and_serving(server, TCP)
