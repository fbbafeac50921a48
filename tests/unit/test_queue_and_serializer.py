from __future__ import annotations

import threading

import pytest

from spark_storm.config import Config
from spark_storm.errors import ConfigError, WireFormatError
from spark_storm.worker.queue import RingQueue
from spark_storm.worker.serializer import MsgpackSerializer, make_serializer


def test_ring_publishes_and_consumes_in_order_across_the_wrap() -> None:
    q: RingQueue[int] = RingQueue(5, "q")
    got: list[tuple[int, bool]] = []
    assert q.publish([1, 2, 3]) == 3
    assert q.consume_batch(lambda x, end: got.append((x, end))) == 3
    assert q.publish([4, 5, 6, 7]) == 4  # wraps around the end of the ring
    q.consume_batch(lambda x, end: got.append((x, end)))
    assert got == [(1, False), (2, False), (3, True), (4, False), (5, False), (6, False), (7, True)]
    assert q.consume_batch(lambda x, end: got.append((x, end))) == 0


def test_ring_is_bounded_publish_waits_and_counts_overflow() -> None:
    q: RingQueue[int] = RingQueue(4, "q")
    t = threading.Thread(target=q.publish, args=(list(range(10)),))
    t.start()
    consumed: list[int] = []
    while len(consumed) < 10:
        assert len(q) <= 4
        q.wait_for_items(0.1)
        q.consume_batch(lambda x, end: consumed.append(x))
    t.join(5)
    assert consumed == list(range(10))
    assert q.overflow > 0
    assert q.publish([1], timeout=0.01) == 1
    assert q.publish([1, 2, 3, 4], timeout=0.01) == 3  # full: times out with what fitted


def test_watermarks_fire_once_each_way() -> None:
    events: list[str] = []
    q: RingQueue[int] = RingQueue(10, "q", 0.8, 0.2, lambda: events.append("high"), lambda: events.append("low"))
    q.publish(list(range(7)))
    assert events == []
    q.publish([7, 8])
    assert events == ["high"]
    q.publish([9])
    assert events == ["high"]
    q.consume_batch(lambda x, end: None, limit=5)
    assert events == ["high"]
    q.consume_batch(lambda x, end: None)
    assert events == ["high", "low"]
    metrics = q.metrics()
    assert metrics["capacity"] == 10
    assert metrics["population"] == 0


def test_msgpack_roundtrip_and_garbage() -> None:
    s = MsgpackSerializer()
    assert s.loads(s.dumps_tuple(3, "default", ["a", 1, 2.5, None, b"x"])) == [
        3,
        "default",
        ["a", 1, 2.5, None, b"x"],
    ]
    with pytest.raises(WireFormatError, match="not valid msgpack"):
        s.loads(b"\xc1")
    with pytest.raises(WireFormatError, match="cannot serialize"):
        s.dumps([object()])


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
