"""A server bound beyond loopback without authentication says so, once, in the same words for every transport."""

from __future__ import annotations

import logging

import pytest

from spark_storm.transport import make_context

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
@pytest.mark.parametrize("secret", [None, "s3cret-for-the-test"])
def test_binding_beyond_loopback_without_a_secret_warns(
    transport: str, secret: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    conf = {"storm.messaging.transport": transport, "storm.messaging.bind.host": "0.0.0.0"}
    if secret is not None:
        conf["storm.messaging.auth.secret"] = secret
    ctx = make_context(conf)
    try:
        with caplog.at_level(logging.WARNING):
            server = ctx.bind("open-topology", 0, lambda batch: None)
        server.close()
    finally:
        ctx.term()
    warnings = [r.getMessage() for r in caplog.records if "SECURITY" in r.getMessage()]
    if secret is None:
        assert len(warnings) == 1, warnings
        assert "0.0.0.0" in warnings[0]
        assert "open-topology" in warnings[0]
        assert "storm.messaging.auth.secret" in warnings[0]
    else:
        assert warnings == []


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
def test_binding_loopback_never_warns(transport: str, caplog: pytest.LogCaptureFixture) -> None:
    ctx = make_context({"storm.messaging.transport": transport, "storm.messaging.bind.host": "127.0.0.1"})
    try:
        with caplog.at_level(logging.WARNING):
            ctx.bind("loopback-topology", 0, lambda batch: None).close()
    finally:
        ctx.term()
    assert not [r for r in caplog.records if "SECURITY" in r.getMessage()]
