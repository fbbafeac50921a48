"""The codec on its own (no worker): Spark's types round-trip, one encoder splits to fit, two decoders check."""

from __future__ import annotations

import datetime as dt
import decimal
import subprocess
import sys
import zoneinfo
from typing import Any

import msgpack
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_storm.codec import BoltDecoder, ColumnarBatch, Encoder, MsgpackSerializer, SourceDecoder, Tuple, TupleSource
from spark_storm.codec.columnar import rows_of
from spark_storm.codec.payloads import arrow_payload, arrow_stream, read_arrow
from spark_storm.codec.serializer import pack_value, unpack_value
from spark_storm.errors import WireFormatError

SER = MsgpackSerializer()
SRC = TupleSource("src", 5, "default", ("k", "v"))
ZONES = ["Etc/UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata"]


# --- Spark SQL types as their Arrow types (what Spark hands Python) and their values ---------------

_MIN_TS = dt.datetime(1, 1, 2)
_MAX_TS = dt.datetime(9999, 12, 30)


def _decimal(precision: int, scale: int) -> st.SearchStrategy[decimal.Decimal]:
    bound = decimal.Decimal(10) ** (precision - scale - 1)  # well inside the precision, whatever the rounding
    return st.decimals(min_value=-bound, max_value=bound, places=scale, allow_nan=False, allow_infinity=False)


LEAVES: list[tuple[str, pa.DataType, st.SearchStrategy[Any]]] = [
    ("BooleanType", pa.bool_(), st.booleans()),
    ("ByteType", pa.int8(), st.integers(-(2**7), 2**7 - 1)),
    ("ShortType", pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    ("IntegerType", pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    ("LongType", pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    ("FloatType", pa.float32(), st.floats(width=32, allow_nan=False)),
    ("DoubleType", pa.float64(), st.floats(allow_nan=False)),
    ("StringType", pa.string(), st.text()),
    ("StringType (large)", pa.large_string(), st.text()),
    ("BinaryType", pa.binary(), st.binary()),
    ("DateType", pa.date32(), st.dates()),
    (
        "TimestampType",
        pa.timestamp("us", tz="Etc/UTC"),
        st.datetimes(_MIN_TS, _MAX_TS, timezones=st.just(dt.UTC)),
    ),
    ("TimestampNTZType", pa.timestamp("us"), st.datetimes(_MIN_TS, _MAX_TS)),
    ("DecimalType(10,2)", pa.decimal128(10, 2), _decimal(10, 2)),
    ("DecimalType(38,18)", pa.decimal128(38, 18), _decimal(38, 18)),
    (
        "DayTimeIntervalType",
        pa.duration("us"),
        st.timedeltas(min_value=dt.timedelta(days=-(10**6)), max_value=dt.timedelta(days=10**6)),
    ),
    ("TimeType", pa.time64("us"), st.times()),
]


def _with_nulls(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), values)


def _nested(depth: int) -> st.SearchStrategy[tuple[str, pa.DataType, st.SearchStrategy[Any]]]:
    leaf = st.sampled_from(LEAVES)
    if depth == 0:
        return leaf

    def array(inner: tuple[str, pa.DataType, Any]) -> tuple[str, pa.DataType, Any]:
        name, t, values = inner
        return f"ArrayType({name})", pa.list_(t), st.lists(_with_nulls(values), max_size=3)

    def struct(inner: tuple[str, pa.DataType, Any]) -> tuple[str, pa.DataType, Any]:
        name, t, values = inner
        typ = pa.struct([("a", t), ("b", pa.int64())])
        return (
            f"StructType(a {name}, b long)",
            typ,
            st.fixed_dictionaries({"a": _with_nulls(values), "b": st.integers(0, 9)}),
        )

    def mapping(inner: tuple[str, pa.DataType, Any]) -> tuple[str, pa.DataType, Any]:
        name, t, values = inner
        pairs = st.dictionaries(st.text(max_size=4), _with_nulls(values), max_size=3).map(lambda d: list(d.items()))
        return f"MapType(string, {name})", pa.map_(pa.string(), t), pairs

    sub = _nested(depth - 1)
    return st.one_of(leaf, sub.map(array), sub.map(struct), sub.map(mapping))


@st.composite
def spark_columns(draw: st.DrawFn) -> tuple[str, pa.Array]:
    name, typ, values = draw(_nested(2))
    column = draw(st.lists(_with_nulls(values), min_size=1, max_size=5))
    tz = draw(st.sampled_from(ZONES))
    if pa.types.is_timestamp(typ) and typ.tz is not None:  # the session time zone varies
        typ = pa.timestamp("us", tz=tz)
    return name, pa.array(column, type=typ)


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same kind (an aware datetime stays aware, in the same zone)."""
    if isinstance(a, dt.datetime) and isinstance(b, dt.datetime):
        return a == b and (a.tzinfo is None) == (b.tzinfo is None) and a.utcoffset() == b.utcoffset()
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(type(a) is type(b) and a == b) or (a is None and b is None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spark_columns())
def test_every_spark_type_crosses_workers_in_tuples_and_in_arrow_batches(column: tuple[str, pa.Array]) -> None:
    name, array = column
    data = pa.record_batch([pa.array(range(len(array))), array], names=["k", "v"])
    # in tuples: as a tuple bolt sees the values, then across a worker to another tuple bolt
    rows = rows_of(data)
    encoder = Encoder(SER, 1 << 20)
    out = encoder.tuples(9, 5, "default", rows, None)
    assert out.bad == [], name
    decoded = BoltDecoder(SER, lambda task, stream: SRC).decode([m.payload for m in out.messages], _raise)
    got = [t.values for tuples, _ in decoded for t in tuples]  # type: ignore[union-attr]
    assert _same(got, rows), name
    # in Arrow batches: the column keeps its exact Spark type
    out = encoder.columnar(9, 5, "default", data, None)
    [(batch, n)] = BoltDecoder(SER, lambda task, stream: SRC).decode([m.payload for m in out.messages], _raise)
    assert isinstance(batch, ColumnarBatch)
    assert n == len(array)
    assert batch.data.schema == data.schema, name
    assert batch.data.equals(data), name


def _raise(exc: Exception, payload: bytes) -> None:
    raise exc


def test_spark_values_round_trip_one_by_one_with_their_kind() -> None:
    values = [
        dt.datetime(2024, 5, 1, 12, 3, 4, 5, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
        dt.datetime(2024, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
        dt.datetime(1900, 1, 1, 1, 1, 1, 1),
        dt.date(1, 1, 1),
        dt.date(9999, 12, 31),
        decimal.Decimal("-1.2300"),
        dt.timedelta(days=-3, microseconds=7),
        dt.time(23, 59, 59, 999999),
        b"\x00\xff",
        {"nested": [dt.date(2020, 2, 29), None]},
        {1: "int keys", 2: "as Spark maps have"},
    ]
    for value in values:
        assert _same(unpack_value(pack_value(value)), value), value


def test_maps_reach_tuple_bolts_as_dicts_as_in_pyspark() -> None:
    m = pa.array([[("a", 1), ("b", 2)], None], type=pa.map_(pa.string(), pa.int64()))
    nested = pa.array([{"m": [("x", 1)]}, {"m": None}], type=pa.struct([("m", pa.map_(pa.string(), pa.int64()))]))
    assert rows_of(pa.record_batch([m, nested], names=["m", "s"])) == [
        [{"a": 1, "b": 2}, {"m": {"x": 1}}],
        [None, {"m": None}],
    ]


def test_numpy_values_from_batch_code_go_as_the_python_values_they_hold() -> None:
    np = pytest.importorskip("numpy")
    assert unpack_value(pack_value([np.int64(3), np.float32(1.5), np.array([1, 2]), np.bool_(True)])) == [
        3,
        1.5,
        [1, 2],
        True,
    ]


def test_a_value_no_codec_carries_leaves_its_row_out_and_names_field_and_type() -> None:
    rows = [["a", 1], ["b", object()], ["c", 3]]
    out = Encoder(SER, 1 << 20).tuples(9, 5, "default", rows, [[(1, 2, 3)], [(1, 2, 4)], []])
    assert [b.index for b in out.bad] == [1]
    assert out.bad[0].describe(("k", "v")) == "field 'v' holds a object, which no codec can carry " + (
        "(cannot serialize object of type builtins.object)"
    )
    decoded = BoltDecoder(SER, lambda task, stream: SRC).decode([m.payload for m in out.messages], _raise)
    tuples = [t for ts, _ in decoded for t in ts]  # type: ignore[union-attr]
    assert sum(n for _, n in decoded) == 2
    assert [t.values for t in tuples] == [["a", 1], ["c", 3]]
    assert [t.anchors for t in tuples] == [[(1, 2, 3)], []]


def test_tuples_over_a_frame_split_in_order() -> None:
    rows = [[f"k{i}", "x" * 100] for i in range(100)]
    out = Encoder(SER, 2048).tuples(9, 5, "default", rows, None)
    assert len(out.messages) > 1
    assert all(len(m.payload) <= 2048 for m in out.messages)
    assert sum(out.weights) == 100
    decoded = BoltDecoder(SER, lambda task, stream: SRC).decode([m.payload for m in out.messages], _raise)
    assert [t.values for tuples, _ in decoded for t in tuples] == rows  # type: ignore[union-attr]


def test_a_rerouted_item_larger_than_a_frame_is_split_not_refused() -> None:
    """A queue item whose task moved away goes out in frame-sized pieces, tuples or batch, edges split."""
    source = TupleSource("mid", 3, "default", ("k", "v"))
    tuples = [Tuple([f"k{i}", "y" * 200], source) for i in range(200)]
    for i, tup in enumerate(tuples):
        tup.anchors = [(7, 100 + i, 1000 + i)]
    ops: list[tuple[int, list[Any]]] = []

    def split(anchors: list[Any], n: int) -> list[list[Any]]:
        ops.append((n, anchors))
        return [[(w, r, 1)] for w, r, _e in anchors for _ in range(n)][:n]

    encoder = Encoder(SER, 4096, split)
    out = encoder.item(4, tuples)
    assert len(out.messages) > 1
    assert all(len(m.payload) <= 4096 for m in out.messages)
    got = BoltDecoder(SER, lambda task, stream: source).decode([m.payload for m in out.messages], _raise)
    back = [t for ts, _ in got for t in ts]  # type: ignore[union-attr]
    assert [t.values for t in back] == [t.values for t in tuples]
    assert [t.anchors for t in back] == [[(7, 100 + i, 1000 + i)] for i in range(200)]

    batch = ColumnarBatch(pa.record_batch({"k": [f"k{i}" for i in range(2000)], "v": ["z" * 50] * 2000}), source)
    batch.anchors = [(7, 55, 66)]
    out = encoder.item(4, batch)
    assert len(out.messages) > 1
    assert all(len(m.payload) <= 4096 for m in out.messages)
    assert sum(out.weights) == 2000
    assert ops[-1] == (len(out.messages), [(7, 55, 66)])  # one new edge per piece, from the acker's hook


def test_source_decoder_takes_msgpack_rows_and_arrow_in_order_and_reports_bad_payloads() -> None:
    source = TupleSource("__client", -1, "default", ("k", "v"))
    payloads = [
        msgpack.packb(["a", 1]),
        msgpack.packb(["b", 2]),
        arrow_payload(pa.record_batch({"v": [3, 4], "k": ["c", "d"], "extra": [0, 0]})),
        b"\xc1garbage",
        msgpack.packb(["e"]),  # wrong arity
        msgpack.packb(["f", 6]),
    ]
    bad: list[Exception] = []
    items = SourceDecoder(SER).decode(payloads, source, False, lambda exc, _payload: bad.append(exc))
    assert [[t.values for t in ts] for ts, _ in items] == [  # type: ignore[union-attr]
        [["a", 1], ["b", 2]],
        [["c", 3], ["d", 4]],
        [["f", 6]],
    ]
    assert len(bad) == 2
    assert "1 values" in str(bad[1])
    columnar = SourceDecoder(SER).decode(payloads[:3], source, True, _raise)
    assert [type(b).__name__ for b, _ in columnar] == ["ColumnarBatch", "ColumnarBatch"]
    assert columnar[1][0].data.schema.names == ["k", "v"]  # type: ignore[union-attr]


def test_bolt_decoder_refuses_arrow_without_origin_and_unknown_streams() -> None:
    def source_of(task: int, stream: str) -> TupleSource:
        if stream != "default":
            msg = f"no stream {stream!r}"
            raise WireFormatError(msg)
        return SRC

    bad: list[Exception] = []
    decoder = BoltDecoder(SER, source_of)
    assert (
        decoder.decode([arrow_payload(pa.record_batch({"k": [1], "v": [2]}))], lambda exc, _payload: bad.append(exc))
        == []
    )
    assert decoder.decode([SER.dumps([5, "other", [["a", 1]], None])], lambda exc, _payload: bad.append(exc)) == []
    assert decoder.decode([SER.dumps([5, "default", [["a"]], None])], lambda exc, _payload: bad.append(exc)) == []
    assert [type(e).__name__ for e in bad] == ["WireFormatError"] * 3
    assert "storm metadata" in str(bad[0])


def test_arrow_payloads_read_back_identical() -> None:
    data = pa.record_batch({"ts": pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("us", tz="Etc/UTC"))})
    back, origin = read_arrow(arrow_payload(data))
    assert origin is None
    assert back.equals(data)


def test_an_arrow_stream_of_several_batches_reads_back_as_pyarrow_writes_it() -> None:
    batches = [pa.record_batch({"k": ["a", "b"], "v": [1, 2]}), pa.record_batch({"k": ["c"], "v": [3]})]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    data = arrow_stream(batches)
    assert data == sink.getvalue().to_pybytes()
    assert pa.ipc.open_stream(data).read_all().to_batches() == batches
    with pytest.raises(ValueError, match="share a schema"):
        arrow_stream([batches[0], pa.record_batch({"k": [1]})])
    with pytest.raises(ValueError, match="at least one record batch"):
        arrow_stream([])


def test_importing_the_spark_writer_loads_no_worker_machinery() -> None:
    code = (
        "import sys, spark_storm.spark.writer, spark_storm.codec;"
        "loaded = sorted(m for m in sys.modules if m.startswith('spark_storm.worker'));"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_barriers_and_generations_cross_workers_and_stale_generations_are_dropped() -> None:
    from spark_storm.codec import Barrier

    encoder = Encoder(SER, 1 << 20)
    encoder.generation = 3
    old = Encoder(SER, 1 << 20)
    old.generation = 2
    batch = pa.record_batch({"k": ["a"], "v": [1]})
    payloads = [
        encoder.tuples(9, 5, "default", [["a", 1]], None).messages[0].payload,
        old.tuples(9, 5, "default", [["b", 2]], None).messages[0].payload,  # in flight before a rollback
        encoder.columnar(9, 5, "default", batch, None).messages[0].payload,
        old.columnar(9, 5, "default", batch, None).messages[0].payload,
        encoder.barrier(9, 5, 7, 3).payload,
        old.barrier(9, 5, 6, 2).payload,
    ]
    decoder = BoltDecoder(SER, lambda task, stream: SRC, lambda: 3)
    items = decoder.decode(payloads, _raise)
    assert [type(p).__name__ for p, _ in items] == ["list", "ColumnarBatch", "Barrier"]
    assert items[2] == (Barrier(7, 3, 5), 0)
    assert decoder.stale == 3  # a tuple, a one-row batch and a barrier
    bad: list[Exception] = []
    decoder.decode(
        [SER.dumps([0, "$checkpoint", [1, 3]]), SER.dumps([5, "$checkpoint", ["x"]])],
        lambda exc, _payload: bad.append(exc),
    )
    assert len(bad) == 2


def test_an_arrow_stream_cut_at_a_message_boundary_is_refused_not_read_as_fewer_rows() -> None:
    """bench.chaos seed 20 #13: a payload cut right after its schema message parsed as 0 rows (140 lost)."""
    data = pa.record_batch({"k": ["a", "b"], "v": [1, 2]})
    schema_only = data.schema.serialize().to_pybytes()
    whole = arrow_payload(data)
    assert whole.startswith(schema_only)
    assert pa.ipc.open_stream(pa.py_buffer(schema_only)).read_all().num_rows == 0  # pyarrow reads it: no error
    for cut in (schema_only, whole[:-8]):  # after the schema; after the batch, without the end-of-stream marker
        with pytest.raises(WireFormatError, match="without its end-of-stream marker"):
            read_arrow(cut)
    assert read_arrow(whole)[0].num_rows == 2
