from __future__ import annotations

import datetime as dt
import sys
import threading
import time
from collections.abc import Callable
from decimal import Decimal

import pytest

from spark_storm.codec.payloads import pack_tuples
from spark_storm.codec.serializer import MsgpackSerializer, make_serializer
from spark_storm.config import Config
from spark_storm.errors import ConfigError, WireFormatError
from spark_storm.worker.queue import BatchQueue
from tests.support import wait_until


def test_queue_keeps_order_and_takes_up_to_the_limit_in_tuples() -> None:
    q: BatchQueue[str] = BatchQueue(100, "q")
    assert q.publish(["a", "b"], [3, 4])
    assert q.publish(["c"], [5])
    assert len(q) == 12
    assert q.take(5, 0) == ["a", "b"]  # at least the limit's worth, whole items only
    assert q.take(1, 0) == ["c"]
    assert q.take(10, 0) == []
    assert q.metrics()["consumed"] == 12


def test_queue_is_bounded_publish_waits_and_counts_overflow() -> None:
    q: BatchQueue[int] = BatchQueue(4, "q")
    assert q.publish([0], [3])
    t = threading.Thread(target=q.publish, args=([1, 2], [1, 2]))
    t.start()
    wait_until(lambda: q.overflow == 1, what="the publisher to wait for room")
    assert len(q) == 3  # all or nothing: the batch of 3 did not fit beside 3
    assert q.take(10, 1) == [0]
    t.join(5)
    assert q.take(10, 1) == [1, 2]
    assert q.publish([5], [4])  # fits the empty queue exactly
    assert q.publish([6], [1], timeout=0.01) is False  # full: times out, nothing published
    assert q.take(10, 0) == [5]


def test_a_batch_larger_than_the_queue_enters_it_empty_and_the_consumer_never_waits() -> None:
    q: BatchQueue[str] = BatchQueue(4, "q")
    assert q.publish(["big"], [10])
    assert len(q) == 10
    q.consumer = threading.get_ident()
    assert q.publish(["self"], [1], timeout=0.01)  # the consumer thread emitting to itself
    assert q.take(100, 0) == ["big", "self"]


def test_close_wakes_a_waiting_publisher_and_refuses_more() -> None:
    q: BatchQueue[int] = BatchQueue(1, "q")
    q.publish([1], [1])
    results: list[bool] = []
    t = threading.Thread(target=lambda: results.append(q.publish([2], [1])))
    t.start()
    wait_until(lambda: q.overflow == 1, what="the publisher to wait")
    q.close()
    t.join(5)
    assert results == [False]
    assert not q.publish([3], [1])


def test_watermarks_fire_once_each_way() -> None:
    events: list[str] = []
    q: BatchQueue[int] = BatchQueue(10, "q", 0.8, 0.2, lambda: events.append("high"), lambda: events.append("low"))
    q.publish([0], [7])
    assert events == []
    q.publish([1], [2])
    assert events == ["high"]
    q.publish([2], [1])
    assert events == ["high"]
    q.take(7, 0)
    assert events == ["high"]
    q.take(10, 0)
    assert events == ["high", "low"]
    metrics = q.metrics()
    assert metrics["capacity"] == 10
    assert metrics["population"] == 0


def test_msgpack_roundtrip_and_garbage() -> None:
    s = MsgpackSerializer()
    assert s.loads(s.dumps([3, "default", ["a", 1, 2.5, None, b"x"]])) == [3, "default", ["a", 1, 2.5, None, b"x"]]
    assert s.loads_many([s.dumps([1]), s.dumps(["x"])]) == [[1], ["x"]]
    with pytest.raises(WireFormatError, match="invalid msgpack"):
        s.loads_many([s.dumps([1]), b"\xc1"])
    with pytest.raises(WireFormatError, match="not valid msgpack"):
        s.loads(b"\xc1")
    with pytest.raises(WireFormatError, match="cannot serialize"):
        s.dumps([object()])


def test_a_run_decodes_as_one_by_one_and_any_payload_that_is_not_one_value_fails_it() -> None:
    s = MsgpackSerializer()
    values = [[1], ["x" * 300], [dt.datetime(2026, 1, 2, tzinfo=dt.UTC)], [{"k": [1, 2]}, None], []]
    payloads = [s.dumps(v) for v in values]
    assert s.loads_many(payloads) == [s.loads(p) for p in payloads] == values
    assert s.loads_many([]) == []
    one = s.dumps([1])
    for bad in (one + b"\x01", one[:-1], b"", b"\xc1"):  # extra bytes, truncated, empty, not msgpack
        with pytest.raises(WireFormatError, match="invalid msgpack"):
            s.loads_many([one, bad, one])


def test_pickle_needs_permission_and_authentication() -> None:
    with pytest.raises(ConfigError, match=r"allow\.pickle"):
        make_serializer(Config.of({"topology.serializer": "pickle"}))
    with pytest.raises(ConfigError, match="authenticated links"):
        make_serializer(Config.of({"topology.serializer": "pickle", "topology.serializer.allow.pickle": True}))
    ok = make_serializer(
        Config.of(
            {
                "topology.serializer": "pickle",
                "topology.serializer.allow.pickle": True,
                "storm.messaging.auth.secret": "s",
            }
        )
    )
    assert ok.loads(ok.dumps({"a": {1, 2}})) == {"a": {1, 2}}
    assert isinstance(make_serializer(Config.of(None)), MsgpackSerializer)


def test_one_serializer_packs_from_two_threads_at_a_tiny_switch_interval_without_corrupting() -> None:
    """Issue 24's race: executor threads' tuple payloads and the acker updates share a worker's serializer.

    A datetime goes through msgpack's Python ``default`` hook mid-pack, where the GIL may pass
    to the other thread; with one shared Packer 149 of 3,446 tuple payloads came out corrupt
    in 5 s.  Every payload packed here must unpack to exactly what was packed.
    """
    serializer = make_serializer(Config.of(None))
    when = dt.datetime(2026, 11, 27, 4, 56, tzinfo=dt.UTC)
    rows = [[i, f"user-{i}", when + dt.timedelta(seconds=i), Decimal("1.25")] for i in range(50)]
    acks = [[1, 7_000_000_000 + i, 123456789, [0, 1]] for i in range(40)]
    deadline = time.monotonic() + 5.0
    corrupt: dict[str, int] = {"tuples": 0, "acker": 0}
    packed: dict[str, int] = {"tuples": 0, "acker": 0}

    def pack(kind: str, make: Callable[[], bytes], expected: object) -> None:
        for _ in range(200_000):  # bounded in count and in time
            if time.monotonic() > deadline:
                return
            try:
                ok = serializer.loads(make()) == expected
            except WireFormatError:
                ok = False
            packed[kind] += 1
            corrupt[kind] += not ok

    expected_tuples = [
        3,
        "default",
        [[i, f"user-{i}", when + dt.timedelta(seconds=i), Decimal("1.25")] for i in range(50)],
        None,
        2,
    ]
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [
            threading.Thread(
                target=pack,
                args=("tuples", lambda: pack_tuples(serializer, 3, "default", rows, None, 2), expected_tuples),
            ),
            threading.Thread(target=pack, args=("acker", lambda: serializer.dumps(acks), acks)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        sys.setswitchinterval(previous)
    assert packed["tuples"] > 100
    assert packed["acker"] > 100
    assert corrupt == {"tuples": 0, "acker": 0}, f"corrupt payloads out of {packed}"
