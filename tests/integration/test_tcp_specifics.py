"""tcp-only behaviour: giving up after max_retries, the non-loopback warning."""

from __future__ import annotations

import logging

import pytest

from spark_storm.errors import ConnectionClosedError
from spark_storm.messaging import ConnectionStatus, TaskMessage
from spark_storm.netutil import free_ports
from spark_storm.transport import make_context
from tests.support import wait_until

pytestmark = pytest.mark.integration


def test_client_gives_up_after_max_retries_and_says_why() -> None:
    ctx = make_context(
        {
            "storm.messaging.transport": "tcp",
            "storm.messaging.tcp.max_retries": 2,
            "storm.messaging.tcp.min_wait_ms": 1,
            "storm.messaging.tcp.max_wait_ms": 5,
        }
    )
    try:
        client = ctx.connect("t", "127.0.0.1", free_ports(1)[0])
        wait_until(lambda: client.status is ConnectionStatus.CLOSED, what="the client to give up")
        with pytest.raises(ConnectionClosedError, match="Connection refused"):
            client.send(TaskMessage(1, b"x"))
    finally:
        ctx.term()


def test_non_loopback_bind_without_secret_warns_loudly(caplog: pytest.LogCaptureFixture) -> None:
    ctx = make_context({"storm.messaging.transport": "tcp", "storm.messaging.bind.host": "0.0.0.0"})
    try:
        with caplog.at_level(logging.WARNING, logger="spark_storm"):
            server = ctx.bind("t", 0)
        assert any("WITHOUT authentication" in r.getMessage() for r in caplog.records)
        server.close()
        caplog.clear()
        secured = make_context(
            {
                "storm.messaging.transport": "tcp",
                "storm.messaging.bind.host": "0.0.0.0",
                "storm.messaging.auth.secret": "s",
            }
        )
        with caplog.at_level(logging.WARNING, logger="spark_storm"):
            secured.bind("t", 0)
        assert not any("WITHOUT authentication" in r.getMessage() for r in caplog.records)
        secured.term()
    finally:
        ctx.term()


def test_groups_a_restarted_server_had_received_are_reported_failed_at_once() -> None:
    """A server that restarted lost what it had accepted: waiting for its ack would last ackTimeoutMs."""
    from spark_storm.messaging.wire import ACCEPTED, FAILED, PROCESSED, BatchHeader

    conf = {
        "storm.messaging.transport": "tcp",
        "storm.messaging.tcp.min_wait_ms": 5,
        "storm.messaging.tcp.max_wait_ms": 50,
    }
    server_ctx, client_ctx = make_context(conf), make_context(conf)
    held: list[object] = []

    class Holding:  # accepts, never reports PROCESSED (as a worker whose trees are still running)
        def recv(self, batch: object) -> None:
            pass

        def recv_group(self, header: BatchHeader, batch: object, done: object) -> None:
            held.append(done)
            done(ACCEPTED)  # type: ignore[operator]

        def recv_request(self, op: int, body: bytes, reply: object) -> None:
            pass

    from spark_storm.messaging.api import IConnectionCallback

    callback = type("HoldingCallback", (Holding, IConnectionCallback), {})()
    try:
        server = server_ctx.bind("t", 0, callback)
        port = server.port
        client = client_ctx.connect("t", "127.0.0.1", port)
        assert client.wait_ready(10)
        header = BatchHeader("q", 0, 0, 0, 1, PROCESSED)
        client.send_group(header, [TaskMessage(1, b"x")])
        wait_until(lambda: held, what="the group at the server")
        assert client.flush(10)  # receipted: the client will not resend it
        server.close()  # the server "restarts" on the same port, with no memory of the session
        server = server_ctx.bind("t", port, callback)
        wait_until(lambda: client.status is ConnectionStatus.READY, what="the reconnect")
        got = client.wait_acks([header.key], PROCESSED, 10)
        assert got == {header.key: FAILED}  # at once, not after the 10 s
    finally:
        client_ctx.term()
        server_ctx.term()
