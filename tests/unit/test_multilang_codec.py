"""The multilang codec, pure: serializers both ways, message checks, handshake context (no processes)."""

from __future__ import annotations

import json
import logging

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_storm.errors import ConfigError
from spark_storm.multilang.process import Outbox
from spark_storm.multilang.protocol import (
    BOLT_COMMANDS,
    SPOUT_COMMANDS,
    build_context,
    command_of,
    handshake,
    heartbeat_tuple,
    log_level,
    parse_emit,
    pid_of,
    spout_command,
)
from spark_storm.multilang.serializers import (
    JsonMultilangSerializer,
    MsgpackMultilangSerializer,
    ProtocolError,
    make_multilang_serializer,
)

values = st.lists(
    st.one_of(st.text(), st.integers(-(2**62), 2**62), st.booleans(), st.none(), st.floats(allow_nan=False)),
    max_size=5,
)
messages = st.lists(
    st.fixed_dictionaries({"command": st.sampled_from(["emit", "ack", "log"]), "tuple": values, "id": st.text()}),
    max_size=20,
)


def _chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


@pytest.mark.parametrize(
    "serializer", [JsonMultilangSerializer(), MsgpackMultilangSerializer()], ids=["json", "msgpack"]
)
@given(msgs=messages, size=st.integers(1, 64))
def test_messages_round_trip_in_chunks_of_any_size(serializer, msgs, size) -> None:
    data = serializer.encode(msgs)
    decoder = serializer.decoder(1 << 20)
    out = []
    for chunk in _chunks(data, size):
        out.extend(decoder.feed(chunk))
    assert out == msgs


def test_json_is_storms_format_exactly() -> None:
    data = JsonMultilangSerializer().encode([{"command": "sync"}, [1, 2]])
    assert data == b'{"command":"sync"}\nend\n[1,2]\nend\n'
    # what storm.py / pystorm write: pretty or not, blank lines between messages
    decoder = JsonMultilangSerializer().decoder(1 << 20)
    assert decoder.feed(b'{"command": "emit",\n "tuple": ["a"]}\nend\n\n{"command":"sync"}\nend\n') == [
        {"command": "emit", "tuple": ["a"]},
        {"command": "sync"},
    ]


@pytest.mark.parametrize(
    "serializer", [JsonMultilangSerializer(), MsgpackMultilangSerializer()], ids=["json", "msgpack"]
)
def test_tuples_fast_path_matches_the_plain_encoder(serializer) -> None:
    records = [("7", "split", "default", 3, ["a", 1]), ("8", "__system", "__tick", -1, [1.5])]
    fast = serializer.decoder(1 << 20).feed(serializer.encode_tuples(records))
    assert fast == [
        {"id": "7", "comp": "split", "stream": "default", "task": 3, "tuple": ["a", 1]},
        {"id": "8", "comp": "__system", "stream": "__tick", "task": -1, "tuple": [1.5]},
    ]
    many = [(str(i), "c", "s", 1, [i]) for i in range(70000)]  # past msgpack's array16 header
    assert len(serializer.decoder(1 << 26).feed(serializer.encode_tuples(many))) == 70000


def test_json_garbage_is_named() -> None:
    decoder = JsonMultilangSerializer().decoder(1 << 20)
    with pytest.raises(ProtocolError, match="not a JSON message followed by an 'end' line: 'hello"):
        decoder.feed(b'{"command":"sync"}\nend\nhello world\nend\n')


def test_a_message_that_never_ends_is_garbage_past_the_limit() -> None:
    decoder = JsonMultilangSerializer().decoder(100)
    decoder.feed(b"x" * 60)
    with pytest.raises(ProtocolError, match=r"grew past 100 bytes.*topology.multilang.max.message.bytes"):
        decoder.feed(b"y" * 60)


def test_msgpack_garbage_is_named() -> None:
    decoder = MsgpackMultilangSerializer().decoder(1 << 20)
    with pytest.raises(ProtocolError, match="not msgpack"):
        decoder.feed(b"\xc1\xc1\xc1")  # 0xc1 is never used in msgpack


def test_serializer_names() -> None:
    assert make_multilang_serializer("json").name == "json"
    assert make_multilang_serializer("org.apache.storm.multilang.JsonSerializer").name == "json"
    assert make_multilang_serializer("com.example.MessagePackSerializer").name == "msgpack"
    with pytest.raises(ConfigError, match=r"topology.multilang.serializer.*'xml'.*json.*msgpack"):
        make_multilang_serializer("xml")


def test_messages_are_checked() -> None:
    assert command_of({"command": "emit"}, BOLT_COMMANDS) == "emit"
    with pytest.raises(ProtocolError, match="unknown command 'next'"):
        command_of({"command": "next"}, BOLT_COMMANDS)
    with pytest.raises(ProtocolError, match="no 'command'"):
        command_of({"tuple": []}, SPOUT_COMMANDS)
    with pytest.raises(ProtocolError, match="the child sent list"):
        command_of([1, 2], BOLT_COMMANDS)
    emit = parse_emit({"command": "emit", "tuple": ["a"], "anchors": ["1", 2], "task": 0})
    assert (emit.values, emit.stream, emit.anchors, emit.task, emit.need_task_ids) == (
        ["a"],
        "default",
        ("1", "2"),
        None,
        True,
    )
    emit = parse_emit({"command": "emit", "tuple": ["a"], "stream": "s", "task": 9, "need_task_ids": False, "id": 4})
    assert (emit.stream, emit.task, emit.need_task_ids, emit.message_id) == ("s", 9, False, 4)
    with pytest.raises(ProtocolError, match="'tuple', a list"):
        parse_emit({"command": "emit", "tuple": "a"})
    with pytest.raises(ProtocolError, match="'task'"):
        parse_emit({"command": "emit", "tuple": [], "task": "x"})
    assert pid_of({"pid": 42}) == 42
    with pytest.raises(ProtocolError, match="answer the handshake"):
        pid_of({"command": "sync"})
    assert log_level({"level": 4}) == logging.ERROR
    assert log_level({"level": "odd"}) == logging.INFO
    assert heartbeat_tuple("h1") == {"id": "h1", "comp": "", "stream": "__heartbeat", "task": -1, "tuple": []}
    assert spout_command("ack", 3) == {"command": "ack", "id": 3}


def test_handshake_context_is_storms() -> None:
    context = build_context(
        task_id=3,
        component_id="split",
        task_component={1: "spout", 3: "split"},
        outputs={"default": ("word",)},
        targets={"default": {"count": {"type": "FIELDS", "fields": ["word"]}}},
        sources={"spout": {"default": {"type": "SHUFFLE"}}},
        source_fields={"spout": {"default": ("sentence",)}},
    )
    message = handshake({"topology.name": "t"}, context, "/tmp/pids")
    assert json.loads(json.dumps(message)) == {
        "conf": {"topology.name": "t"},
        "pidDir": "/tmp/pids",
        "context": {
            "task->component": {"1": "spout", "3": "split"},
            "taskid": 3,
            "componentid": "split",
            "stream->target->grouping": {"default": {"count": {"type": "FIELDS", "fields": ["word"]}}},
            "streams": ["default"],
            "stream->outputfields": {"default": ["word"]},
            "source->stream->grouping": {"spout": {"default": {"type": "SHUFFLE"}}},
            "source->stream->fields": {"spout": {"default": ["sentence"]}},
        },
    }
    assert msgpack.unpackb(MsgpackMultilangSerializer().encode([message]), raw=False) == json.loads(json.dumps(message))


class _DeadChild:
    """What ShellChild.died reads of a process that lived ``lived_s``."""

    def __init__(self, lived_s: float) -> None:
        import time

        self.started = time.monotonic() - lived_s

    def describe(self) -> str:
        return "test-child"

    def stderr_hint(self) -> str:
        return ""


def test_a_childs_restarts_wait_twice_as_long_each_time_up_to_the_max_and_reset_after_a_long_life() -> None:
    import sys

    from spark_storm.shell.child import ShellChild
    from spark_storm.topology import Slot, plan, topology_from_dict
    from spark_storm.worker.bolt import TopologyContext

    the_plan = plan(
        topology_from_dict({"name": "t", "components": [{"id": "in", "source": True, "fields": ["w"]}]}), [Slot("h", 1)]
    )
    context = TopologyContext("t", "in", 1, (1,), {}, "h:1", the_plan)
    conf = {
        "topology.multilang.command": [sys.executable, "-c", "pass"],
        "topology.multilang.restart.backoff.min.ms": 100,
        "topology.multilang.restart.backoff.max.ms": 1000,
    }
    errors: list[str] = []
    child = ShellChild("bolt", conf, context, errors.append)
    delays = [child.died(_DeadChild(0.0), "exited") for _ in range(6)]  # type: ignore[arg-type]
    for got, base in zip(delays, [0.1, 0.2, 0.4, 0.8, 1.0, 1.0], strict=True):
        assert base <= got <= min(1.0, base * 1.2)  # doubling, with up to a fifth of jitter, never past the max
    long_lived = _DeadChild(5.0)  # it lived past the max: back to the min
    assert child.died(long_lived, "exited") <= 0.12  # type: ignore[arg-type]
    assert len(errors) == 7
    assert errors[0].startswith("multilang bolt in:1: child test-child exited; restarting it in 0.1s")


def test_outbox_hands_control_first_and_bounds_tuples() -> None:
    import threading

    box = Outbox(2)
    assert box.put_tuple("t1")
    assert box.put_tuple("t2")
    box.put_control("c1")
    stop = threading.Event()
    assert box.take(stop) == (["c1"], ["t1", "t2"])
    blocked = threading.Thread(target=lambda: [box.put_tuple(i) for i in range(3)])
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()  # the third waits for room
    assert box.take(stop) == ([], [0, 1])
    blocked.join(5)
    assert not blocked.is_alive()
    box.close()
    assert not box.put_tuple("late")
    stop.set()
    assert box.take(stop) is None
