from __future__ import annotations

import struct
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_storm.errors import WireFormatError
from spark_storm.messaging import BackpressureStatus, MessageBatch, TaskMessage
from spark_storm.messaging.wire import (
    MAX_SEQ,
    Auth,
    BatchAck,
    BatchCommit,
    BatchHeader,
    BatchQuery,
    Challenge,
    Close,
    Eob,
    Failure,
    FrameDecoder,
    Hello,
    LoadMetrics,
    Ok,
    Receipt,
    Seq,
    encode_control,
    encode_messages,
)

LIMIT = 1 << 16
messages = st.lists(st.builds(TaskMessage, st.integers(0, 32767), st.binary(max_size=300)), max_size=40)
tasks = st.frozensets(st.integers(0, 32767), max_size=8)
text = st.text(max_size=40)
controls = st.one_of(
    st.builds(LoadMetrics, st.dictionaries(st.integers(0, 32767), st.floats(0, 1), max_size=5)),
    st.just(Close()),
    st.just(Eob()),
    st.builds(Failure, text),
    st.builds(BackpressureStatus, text, tasks, tasks),
    st.builds(
        Hello,
        st.integers(0, 255),
        text,
        st.binary(min_size=16, max_size=16),
        st.binary(min_size=16, max_size=16),
    ),
    st.builds(Challenge, st.integers(0, 255), st.booleans(), st.binary(min_size=16, max_size=16)),
    st.builds(Auth, st.sampled_from([b"", b"m" * 32])),
    st.builds(Ok, st.binary(max_size=32), st.integers(-1, 2**62)),
    st.builds(Seq, st.integers(0, 2**62), st.integers(0, 2**31 - 1)),
    st.builds(Receipt, st.integers(-1, 2**62)),
    st.builds(
        BatchHeader,
        text,
        st.integers(-(2**62), 2**62),
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**62),
        st.integers(0, 2**31 - 1),
        st.sampled_from([1, 2]),
        st.booleans(),  # coordinated: bit 0x80 of the required byte
    ),
    st.builds(
        BatchAck,
        text,
        st.integers(0, 2**62),
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**62),
        st.integers(0, 255),
    ),
    st.builds(BatchCommit, text, st.integers(0, 2**62)),
    st.builds(
        BatchQuery,
        text,
        st.integers(-(2**62), 2**62),
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**62),
        st.sampled_from([1, 2]),
    ),
)
items = st.lists(st.one_of(messages, controls), max_size=12)


def _flatten(decoded: Sequence[object]) -> list[object]:
    out: list[object] = []
    for item in decoded:
        if isinstance(item, MessageBatch):
            out.extend(item)
        else:
            out.append(item)
    return out


def _encode(seq: list[object]) -> tuple[bytes, list[object]]:
    parts: list[bytes] = []
    flat: list[object] = []
    for item in seq:
        if isinstance(item, list):
            parts.append(encode_messages(item))
            flat.extend(item)
        else:
            parts.append(encode_control(item))  # type: ignore[arg-type]
            flat.append(item)
    return b"".join(parts), flat


@given(items, st.lists(st.integers(0, 10_000), max_size=8))
@settings(max_examples=300, deadline=None)
def test_roundtrip_split_at_any_points(seq: list[object], cuts: list[int]) -> None:
    data, flat = _encode(seq)
    decoder = FrameDecoder(LIMIT)
    points = sorted({c % (len(data) + 1) for c in cuts})
    got: list[object] = []
    start = 0
    for p in [*points, len(data)]:
        got.extend(_flatten(decoder.feed(data[start:p])))
        start = p
    decoder.check_eof()
    assert got == flat


@given(messages)
def test_data_runs_come_back_as_lists(msgs: list[TaskMessage]) -> None:
    out = FrameDecoder(LIMIT).feed(encode_messages(msgs))
    assert out == ([msgs] if msgs else [])


@given(st.binary(max_size=2000), st.lists(st.integers(0, 2000), max_size=5))
@settings(max_examples=500, deadline=None)
def test_garbage_raises_only_wire_errors_and_never_hangs(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(4096)
    points = sorted({c % (len(data) + 1) for c in cuts})
    start = 0
    try:
        for p in [*points, len(data)]:
            decoder.feed(data[start:p])
            start = p
        decoder.check_eof()
    except WireFormatError:
        pass


def test_task_id_range_is_checked() -> None:
    for bad in (-1, -200, 32768, 70000):
        with pytest.raises(WireFormatError, match=f"task id {bad} does not fit the int16 task field"):
            encode_messages([TaskMessage(bad, b"x")])
    assert encode_messages([TaskMessage(32767, b"")]) == b"\x7f\xff\x00\x00\x00\x00"


def test_frame_layout_is_storms_big_endian_short_int_payload() -> None:
    assert encode_messages([TaskMessage(258, b"abc")]) == b"\x01\x02\x00\x00\x00\x03abc"
    assert encode_control(Eob()) == struct.pack(">hi", -201, 0)
    assert encode_control(Close()) == struct.pack(">hi", -100, 0)


def test_length_over_the_limit_is_refused_before_buffering() -> None:
    with pytest.raises(WireFormatError, match=r"outside 0\.\.100"):
        FrameDecoder(100).feed(struct.pack(">hi", 1, 101))
    with pytest.raises(WireFormatError, match=r"outside 0\.\.100"):
        FrameDecoder(100).feed(struct.pack(">hi", 1, -5))


def test_unknown_code_bad_magic_and_truncation() -> None:
    with pytest.raises(WireFormatError, match="unknown control code -5"):
        FrameDecoder(LIMIT).feed(struct.pack(">hi", -5, 0))
    hello = bytearray(encode_control(Hello(1, "t", b"s" * 16, b"n" * 16)))
    hello[6:10] = b"HTTP"
    with pytest.raises(WireFormatError, match="bad magic"):
        FrameDecoder(LIMIT).feed(bytes(hello))
    decoder = FrameDecoder(LIMIT)
    assert decoder.feed(encode_messages([TaskMessage(1, b"abcdef")])[:-2]) == []
    with pytest.raises(WireFormatError, match="truncated"):
        decoder.check_eof()


def test_a_seq_run_must_end_within_the_largest_sequence_number() -> None:
    assert FrameDecoder(LIMIT).feed(encode_control(Seq(MAX_SEQ - 2, 2))) == [Seq(MAX_SEQ - 2, 2)]
    for first, count in [(MAX_SEQ - 1, 2), (MAX_SEQ, 1), (MAX_SEQ, 2**31 - 1)]:
        with pytest.raises(WireFormatError, match=f"first={first} count={count} passes the largest sequence number"):
            FrameDecoder(LIMIT).feed(encode_control(Seq(first, count)))


def test_control_bodies_are_validated() -> None:
    with pytest.raises(WireFormatError, match="SEQ frame body"):
        FrameDecoder(LIMIT).feed(struct.pack(">hi", -710, 3) + b"abc")
    with pytest.raises(WireFormatError, match="AUTH frame body is 5 bytes"):
        FrameDecoder(LIMIT).feed(struct.pack(">hi", -702, 5) + b"abcde")
    with pytest.raises(WireFormatError, match="load-metrics"):
        FrameDecoder(LIMIT).feed(struct.pack(">hi", -1, 3) + b"abc")
    query = encode_control(BatchQuery("q", 1, 2, 3, 2))
    assert query[:2] == struct.pack(">h", -805)
    with pytest.raises(WireFormatError, match="batch query has required 7"):
        FrameDecoder(LIMIT).feed(query[:6] + struct.pack(">qiqB", 1, 2, 3, 7) + b"q")
    for bad in (float("nan"), float("inf"), -0.5, 1.5):
        body = struct.pack(">hd", 3, bad)
        with pytest.raises(WireFormatError, match=r"outside 0\.\.1"):
            FrameDecoder(LIMIT).feed(struct.pack(">hi", -1, len(body)) + body)
        # ... and the encoder refuses to send it, with the task and the value: every decoder
        # would take such a frame for a broken peer and drop the connection.
        with pytest.raises(WireFormatError, match=rf"load {bad!r} of task 3 is outside 0\.0\.\.1\.0"):
            encode_control(LoadMetrics({1: 0.5, 3: bad}))


def test_a_batch_headers_coordinated_bit_rides_in_its_required_byte() -> None:
    plain = encode_control(BatchHeader("q", 7, 1, 2, 3, 2))
    coordinated = encode_control(BatchHeader("q", 7, 1, 2, 3, 2, coordinated=True))
    assert len(plain) == len(coordinated)  # the same layout: a bit, not a field
    level = 6 + 8 + 4 + 8 + 4  # frame header, batch id, partition, sequence, count
    assert (plain[level], coordinated[level]) == (2, 0x82)
    [header] = FrameDecoder(LIMIT).feed(coordinated)
    assert header == BatchHeader("q", 7, 1, 2, 3, 2, coordinated=True)
    bad = coordinated[:level] + bytes([0x83]) + coordinated[level + 1 :]
    with pytest.raises(WireFormatError, match="required 131"):
        FrameDecoder(LIMIT).feed(bad)
