"""tcp-only behaviour: giving up after max_retries, the non-loopback warning."""

from __future__ import annotations

import logging

import pytest

from spark_storm.errors import ConnectionClosedError
from spark_storm.messaging import ConnectionStatus, TaskMessage
from spark_storm.netutil import free_ports
from spark_storm.transport import make_context
from tests.helpers import wait_until

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
