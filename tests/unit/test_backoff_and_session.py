from __future__ import annotations

import random
import threading

import pytest

from spark_storm.errors import AuthenticationError, ConnectionClosedError, SendTimeoutError
from spark_storm.messaging import TaskMessage
from spark_storm.messaging.handshake import ClientHandshake, ServerHandshake, new_session_id
from spark_storm.transport._backoff import Backoff
from spark_storm.transport._session import ClientSession


def test_backoff_stays_within_bounds_and_grows() -> None:
    b = Backoff(100, 1000, random.Random(7))
    delays = [b.delay_ms(a) for a in range(900)]
    assert all(100 <= d <= 1000 for d in delays)
    assert delays[0] < 200
    assert delays[-1] == 1000
    assert Backoff(0, 50).delay_ms(40) <= 50
    with pytest.raises(ValueError, match="min_ms <= max_ms"):
        Backoff(10, 5)


def _batch(n: int, size: int = 100) -> list[TaskMessage]:
    return [TaskMessage(1, b"x" * size) for _ in range(n)]


def test_session_numbers_batches_and_frees_them_on_receipt() -> None:
    s = ClientSession(10_000, 5_000, "block", -1, "peer")
    s.admit(_batch(3))
    s.admit(_batch(2))
    assert s.pending == 5
    s.on_receipt(2)
    assert s.pending == 2
    s.on_receipt(4)
    assert s.pending == 0
    assert s.pending_bytes == 0


def test_session_replay_resends_only_what_the_server_lacks() -> None:
    s = ClientSession(10_000, 5_000, "block", -1, "peer")
    s.admit(_batch(3))
    s.admit(_batch(2))
    s.take_outbox()
    s.replay(2)  # server had 0..2
    assert len(s.take_outbox()) == 1
    s.replay(-1)  # a brand-new server: resend everything still unacknowledged
    assert s.pending == 2


def test_session_blocks_above_high_until_under_low() -> None:
    s = ClientSession(1_000, 500, "block", -1, "peer")
    s.admit(_batch(9))  # ~1 KB unacknowledged
    done = threading.Event()

    def admit_one() -> None:
        s.admit(_batch(1))
        done.set()

    t = threading.Thread(target=admit_one)
    t.start()
    assert not done.wait(0.05)
    s.on_receipt(8)
    assert done.wait(5)
    t.join()


def test_session_drop_policy_and_timeout_and_close() -> None:
    s = ClientSession(1_000, 500, "drop", -1, "peer")
    s.admit(_batch(9))
    s.admit(_batch(9))
    assert s.lost == 9
    t = ClientSession(1_000, 500, "block", 10, "peer")
    t.admit(_batch(9))
    with pytest.raises(SendTimeoutError, match="blocked"):
        t.admit(_batch(9))
    assert t.close() == 9
    with pytest.raises(ConnectionClosedError):
        t.admit(_batch(1))


def test_handshake_proves_the_secret_both_ways() -> None:
    sid = new_session_id()
    client = ClientHandshake("topo", sid, b"k", "srv")
    server = ServerHandshake("topo", b"k", "cli")
    ok = server.on_auth(client.on_challenge(server.on_hello(client.hello())), 41)
    assert client.on_ok(ok) == 41
    impostor = ServerHandshake("topo", b"other", "cli")
    client2 = ClientHandshake("topo", sid, b"k", "srv")
    with pytest.raises(AuthenticationError, match="wrong shared secret"):
        impostor.on_auth(client2.on_challenge(impostor.on_hello(client2.hello())), -1)


def test_client_rejects_a_server_that_cannot_prove_the_secret() -> None:
    sid = new_session_id()
    client = ClientHandshake("topo", sid, b"k", "srv")
    open_server = ServerHandshake("topo", None, "cli")
    ok = open_server.on_auth(client.on_challenge(open_server.on_hello(client.hello())), -1)
    with pytest.raises(AuthenticationError, match="failed to prove the shared secret"):
        client.on_ok(ok)
