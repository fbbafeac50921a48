"""Windows: the spec, and the tuple and batch engines against Spark's semantics computed by hand.

The Spark tier (tests/spark/test_windows_spark.py) checks the same against Spark itself;
the integration tier (tests/integration/test_windows_exact.py) through worker processes,
SIGKILLs and rebalances.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_storm.errors import ConfigError
from spark_storm.topology.loader import topology_from_dict
from spark_storm.topology.windows import window_conf, window_spec
from tests.support import wait_until
from tests.support.windows import Harness, closed, spark_sessions, spark_windows

COUNT = "spark_storm.examples.windows:WindowCount"
COUNT_TUPLES = "spark_storm.examples.windows:WindowCountTuples"
COUNT_BATCH = "spark_storm.examples.windows:WindowCountBatch"


def _spec(block: dict[str, Any]) -> Any:
    return window_spec(window_conf(block, "c"), "c")


# ----------------------------------------------------------------------------------------- the spec
@pytest.mark.parametrize(
    ("block", "shape"),
    [
        ({"length": "60s", "sliding": "10s"}, ("duration", 60_000, 10_000)),
        ({"length": "1m"}, ("duration", 60_000, 60_000)),
        ({"length": "100 tuples", "sliding": "10 tuples"}, ("count", 100, 10)),
        ({"length": "5 tuples"}, ("count", 5, 5)),
        ({"length": "60s", "sliding": "10s", "timestamp_field": "ts", "lag": "5s"}, ("duration", 60_000, 10_000)),
        ({"length": "1.5s", "timestamp_field": "ts"}, ("duration", 1500, 1500)),
        ({"length": "100 tuples", "sliding": "10 tuples", "timestamp_field": "ts"}, ("count", 100, 10)),
        ({"length": "3 tuples", "timestamp_field": "ts"}, ("count", 3, 3)),
        ({"session_gap": "30s", "timestamp_field": "ts", "key": "user"}, ("session", 30_000, 0)),
    ],
)
def test_storms_eight_forms_and_sessions_parse(block: dict[str, Any], shape: tuple[str, int, int]) -> None:
    spec = _spec(block)
    assert (spec.kind, spec.length, spec.sliding) == shape
    assert spec.event_time == ("timestamp_field" in block)


@pytest.mark.parametrize(
    ("block", "needle"),
    [
        ({"length": "10s", "sliding": "20s"}, "more than its length"),
        ({"length": "10 tuples", "sliding": "5s"}, "mix a count and a duration"),
        ({"length": "60"}, "write it with its unit"),
        ({"length": "60 parsecs"}, "unknown unit 'parsecs'"),
        ({"lenght": "60s"}, "Did you mean 'length'"),
        ({"length": "60s", "lag": "5s"}, "'lag' applies to event time"),
        ({"length": "60s", "late_stream": "late"}, "'late_stream' needs event time"),
        ({"session_gap": "30s", "length": "60s"}, "exclude each other"),
        ({"sliding": "10s"}, "needs 'length'"),
        ({"length": "0.5ms"}, "whole number of milliseconds"),
        ({"session_gap": "10 tuples"}, "is a count; this setting is a duration"),
    ],
)
def test_a_bad_window_spec_names_the_key_and_the_fix(block: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        _spec(block)


def _topology(window: dict[str, Any], **extra: Any) -> Any:
    return topology_from_dict(
        {
            "name": "t",
            "components": [
                {"id": "in", "source": True, "fields": ["ts", "user"]},
                {"id": "w", "bolt": COUNT, "fields": ["a"], "window": window, "inputs": [{"from": "in"}], **extra},
            ],
        }
    )


def test_the_timestamp_field_and_the_key_must_be_input_fields() -> None:
    with pytest.raises(ConfigError, match=r"timestamp_field 'time' is not among the fields of input in/default"):
        _topology({"length": "60s", "timestamp_field": "time"})
    with pytest.raises(ConfigError, match=r"key 'usr' is not among .* did you mean 'user'"):
        _topology({"length": "60s", "key": "usr"})


def test_the_late_stream_is_declared_with_the_input_fields_unless_declared() -> None:
    topo = _topology({"length": "60s", "timestamp_field": "ts", "late_stream": "late"})
    assert topo.components["w"].outputs["late"] == ("ts", "user")
    with pytest.raises(ConfigError, match="late tuples from in/default have 2 fields"):
        _topology({"length": "60s", "timestamp_field": "ts", "late_stream": "late"}, outputs={"late": ["x"]})


def test_storms_config_keys_declare_the_same_window_as_the_block() -> None:
    conf = {
        "topology.bolts.window.length.duration.ms": 60_000,
        "topology.bolts.window.sliding.interval.duration.ms": 10_000,
        "topology.bolts.tuple.timestamp.field.name": "ts",
        "topology.bolts.tuple.timestamp.max.lag.ms": 5000,
    }
    assert window_spec(conf, "c") == _spec({"length": "60s", "sliding": "10s", "timestamp_field": "ts", "lag": "5s"})
    with pytest.raises(ConfigError, match="say the same; keep one"):
        _topology({"length": "60s"}, conf={"topology.bolts.window.length.duration.ms": 5})


def test_a_window_needs_a_windowed_bolt_and_a_windowed_bolt_a_window() -> None:
    from spark_storm.worker.factory import check_window

    topo = _topology({"length": "60s"})
    comp = topo.components["w"]
    with pytest.raises(ConfigError, match="is not a WindowedBolt or WindowedBatchBolt"):
        check_window(comp, object, {})
    plain = topology_from_dict(
        {
            "name": "t",
            "components": [
                {"id": "in", "source": True, "fields": ["ts"]},
                {"id": "w", "bolt": COUNT, "fields": ["a"], "inputs": [{"from": "in"}]},
            ],
        }
    )
    from spark_storm.examples.windows import WindowCount

    with pytest.raises(ConfigError, match="declares no window"):
        check_window(plain.components["w"], WindowCount, {})


# -------------------------------------------------------------------------------- event-time windows
def _events(seed: int, n: int, jitter: int, users: int = 3, start: int = 1_700_000_000_000) -> list[list[Any]]:
    """``n`` events 0-400 ms apart, each shuffled back by up to ``jitter`` ms (out of order within it)."""
    rng = random.Random(seed)
    t = start
    rows = []
    for i in range(n):
        t += rng.randrange(0, 400)
        rows.append([t - rng.randrange(0, jitter + 1), f"u{rng.randrange(users)}", i])
    return rows


def _watermark(rows: list[list[Any]], lag: int) -> int:
    return int(max(r[0] for r in rows)) - lag


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    shape=st.sampled_from([(6000, 1000), (6000, 6000), (5000, 2000), (3000, 1500), (1000, 250)]),
    bolt=st.sampled_from([COUNT, COUNT_TUPLES]),
)
def test_sliding_and_tumbling_event_time_windows_equal_sparks(seed: int, shape: tuple[int, int], bolt: str) -> None:
    length, slide = shape
    rows = _events(seed, 300, jitter=900)
    block = {"length": f"{length}ms", "sliding": f"{slide}ms", "timestamp_field": "ts", "lag": "1s", "key": "user"}
    h = Harness(bolt, block)
    h.send(rows)
    assert h.windows == closed(spark_windows(rows, length, slide), _watermark(rows, 1000))
    assert h.out.acked == len(rows)  # acked on arrival
    ids = [r[4] for r in h.out.emitted["default"]]
    assert len(ids) == len(set(ids))


def test_a_window_spans_new_and_expired_against_the_previous_slide() -> None:
    seen: list[tuple[int, int, int, int]] = []

    from spark_storm.examples import windows

    class Spy(windows.WindowCountTuples):
        def execute_window(self, window: Any) -> None:
            seen.append((window.start, len(window.tuples), len(window.new), len(window.expired)))

    windows.Spy = Spy  # type: ignore[attr-defined]
    try:
        h = Harness("spark_storm.examples.windows:Spy", {"length": "3s", "sliding": "1s", "timestamp_field": "ts"})
        h.send([[t * 1000 + 10, "u", 0] for t in range(8)])
    finally:
        del windows.Spy  # type: ignore[attr-defined]
    # window [s, s+3s) holds the events at s, s+1, s+2; new: the one at s+2; expired: the one at s-1
    assert seen[:4] == [(-2000, 1, 1, 0), (-1000, 2, 1, 0), (0, 3, 1, 0), (1000, 3, 1, 1)]


def test_late_tuples_go_to_the_late_stream_and_are_counted_exactly() -> None:
    rows = _events(7, 400, jitter=4000)
    lag = 1000
    h = Harness(COUNT, {"length": "2s", "timestamp_field": "ts", "lag": "1s", "late_stream": "late"}, late=True)
    h.send(rows)
    newest = -(1 << 62)
    late: list[list[Any]] = []
    kept: list[list[Any]] = []
    for row in rows:
        (late if row[0] < newest - lag else kept).append(row)
        newest = max(newest, row[0])
    assert late, "the data must have late events"
    assert h.out.emitted["late"] == late
    assert h.window_metrics()["late"] == len(late)
    assert h.windows == closed(spark_windows(kept, 2000, 2000, key=None), _watermark(rows, lag))


def test_a_spark_timestamp_and_epoch_millis_give_the_same_windows() -> None:
    rows = _events(3, 200, jitter=500)
    block = {"length": "4s", "sliding": "2s", "timestamp_field": "ts", "lag": "1s", "key": "user"}
    millis = Harness(COUNT, block)
    millis.send(rows)
    stamps = Harness(COUNT, block)
    zone = dt.timezone(dt.timedelta(hours=2))
    stamps.send([[dt.datetime.fromtimestamp(r[0] / 1000, tz=zone), r[1], r[2]] for r in rows])
    assert millis.windows
    assert stamps.windows == millis.windows


def test_a_tuple_without_a_usable_time_is_reported_and_dropped_alone() -> None:
    h = Harness(COUNT, {"length": "1s", "timestamp_field": "ts"})
    h.send([[1000, "a", 0], [None, "a", 1], ["soon", "a", 2], [1500, "a", 3], [2500, "a", 4]])
    assert h.windows == {(1000, 2000, None): 2}
    assert h.window_metrics()["bad_times"] == 2
    assert "holds None (NoneType)" in h.out.errors[0]
    assert "epoch milliseconds" in h.out.errors[0]
    assert h.out.acked == 5


def test_with_two_inputs_the_watermark_is_the_slower_ones() -> None:
    h = Harness(COUNT, {"length": "1s", "timestamp_field": "ts"}, sources=("a", "b"))
    h.send([[1000, "x", 0], [5000, "x", 1]], "a")
    assert h.windows == {}  # b has sent nothing: no watermark
    h.send([[1500, "y", 2]], "b")
    assert h.windows == {}  # min(5000, 1500) = 1500: [1000, 2000) has not ended
    h.send([[2100, "y", 3]], "b")
    assert h.windows == {(1000, 2000, None): 2}


def test_each_upstream_task_is_a_channel_of_its_own() -> None:
    # Two tasks of one input run apart (a micro-batch split over them): per stream, task 0's
    # newest time would make task 1's older tuples late; per task they are on time.
    h = Harness(COUNT, {"length": "1s", "timestamp_field": "ts"}, source_tasks=2)
    h.send([[1000, "x", 0], [5000, "x", 1]], task=0)
    assert h.windows == {}  # task 1 has sent nothing yet
    h.send([[1100, "y", 2], [1900, "y", 3], [2500, "y", 4]], task=1)
    assert h.windows == {(1000, 2000, None): 3}
    assert h.window_metrics()["late"] == 0


def test_a_task_idle_for_a_whole_epoch_stops_holding_the_watermark() -> None:
    h = Harness(COUNT, {"length": "1s", "timestamp_field": "ts"}, source_tasks=2)
    h.send([[1000, "x", 0], [3000, "x", 1]], task=0)
    h.checkpoint(1)  # task 1 never sent: the epoch made it idle (it held nothing back before: -inf)
    h.tick()
    assert h.windows == {(1000, 2000, None): 1}
    h.send([[3500, "x", 2]], task=0)
    h.send([[4000, "y", 3]], task=1)  # back: it holds the watermark again
    h.checkpoint(2)
    h.send([[9000, "x", 4]], task=0)
    assert (3000, 4000, None) in h.windows
    assert (4000, 5000, None) not in h.windows  # task 1 (at 4000) holds it
    h.send([[2000, "y", 5]], task=1)  # older than the watermark (3000 - 0): late
    assert h.window_metrics()["late"] == 1


def test_with_checkpoints_the_watermark_moves_at_epochs_as_sparks_between_batches() -> None:
    # One micro-batch's rows reach the window in any order (its partitions run through several
    # tasks at once): none is late, and its windows close once the epoch is delivered.
    h = Harness(COUNT, {"length": "1s", "timestamp_field": "ts"}, conf={"topology.bolts.watermark.at.epochs": True})
    batch = [[ts, "x", i] for i, ts in enumerate([7000, 1000, 4500, 1200, 2999, 6000])]
    h.send(batch)
    assert h.windows == {}  # the epoch is not delivered yet
    h.checkpoint(1)
    h.tick()
    assert h.windows == {(1000, 2000, None): 2, (2000, 3000, None): 1, (4000, 5000, None): 1, (6000, 7000, None): 1}
    h.send([[6500, "x", 9], [7100, "x", 10]])  # the next batch: 6500 < 7000, the watermark: late
    assert h.window_metrics()["late"] == 1
    h.checkpoint(2)
    h.send([[9000, "x", 11]])
    h.checkpoint(3)
    h.tick()
    assert h.windows[(7000, 8000, None)] == 2


# ---------------------------------------------------------------------------------- session windows
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), gap=st.sampled_from([500, 1500, 4000]), reduce=st.booleans())
def test_session_windows_equal_sparks_session_window(seed: int, gap: int, reduce: bool) -> None:
    rows = _events(seed, 250, jitter=800, users=4)
    h = Harness(
        COUNT if reduce else COUNT_TUPLES,
        {"session_gap": f"{gap}ms", "timestamp_field": "ts", "lag": "1s", "key": "user"},
    )
    h.send(rows)
    assert h.windows == closed(spark_sessions(rows, gap), _watermark(rows, 1000))


# ------------------------------------------------------------------------------------ count windows
def test_count_windows_slide_by_tuples_per_key_in_arrival_order() -> None:
    h = Harness(COUNT_TUPLES, {"length": "5 tuples", "sliding": "2 tuples", "key": "user"})
    h.send([[i, "a" if i % 3 else "b", i] for i in range(30)])
    per_a = [r for r in h.out.emitted["default"] if r[2] == "a"]
    assert [r[3] for r in per_a] == [2, 4, 5, 5, 5, 5, 5, 5, 5, 5]  # 20 a's: one window per 2
    assert per_a[-1][4].endswith("/a/#10")


def test_event_time_count_windows_take_tuples_in_event_time_order() -> None:
    seen: list[list[int]] = []

    from spark_storm.examples import windows

    class Order(windows.WindowCountTuples):
        def execute_window(self, window: Any) -> None:
            seen.append([t.get("v") for t in window.tuples])

    windows.Order = Order  # type: ignore[attr-defined]
    try:
        h = Harness(
            "spark_storm.examples.windows:Order", {"length": "3 tuples", "timestamp_field": "ts", "lag": "10ms"}
        )
        h.send([[t, "u", t] for t in (5, 1, 3, 2, 4, 9, 8, 7, 6, 40)])
    finally:
        del windows.Order  # type: ignore[attr-defined]
    assert seen == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


# ----------------------------------------------------------------------------------- processing time
def test_processing_time_windows_fire_on_the_watermark_interval() -> None:
    h = Harness(COUNT, {"length": "200ms", "watermark_interval": "50ms"})
    h.send([[0, "u", i] for i in range(50)])
    deadline = time.monotonic() + 5

    def fired() -> bool:
        h.tick()
        return sum(h.windows.values()) == 50 or time.monotonic() > deadline

    wait_until(fired, what="the processing-time window to end", timeout=10)
    assert sum(h.windows.values()) == 50
    assert all(end - start == 200 and start % 200 == 0 for start, end, _ in h.windows)


# --------------------------------------------------------------------------------- exact state
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    bolt=st.sampled_from([COUNT, COUNT_TUPLES]),
    block=st.sampled_from(
        [
            {"length": "4s", "sliding": "1s", "timestamp_field": "ts", "lag": "1s", "key": "user"},
            {"session_gap": "1s", "timestamp_field": "ts", "lag": "1s", "key": "user"},
            {"length": "7 tuples", "sliding": "3 tuples", "timestamp_field": "ts", "lag": "1s", "key": "user"},
            {"length": "7 tuples", "sliding": "3 tuples", "key": "user"},
        ]
    ),
    restart=st.booleans(),
)
def test_a_restart_or_rollback_replays_to_the_same_windows_with_the_same_ids(
    seed: int, bolt: str, block: dict[str, Any], restart: bool
) -> None:
    rows = _events(seed, 240, jitter=800)
    rng = random.Random(seed)
    clean = Harness(bolt, block)
    clean.send(rows)
    expected = {r[4]: r for r in clean.out.emitted["default"]}

    h = Harness(bolt, block)
    cut, crash = sorted(rng.sample(range(1, len(rows)), 2))
    h.send(rows[:cut])
    h.checkpoint(1)
    emitted = list(h.out.emitted["default"])
    h.send(rows[cut:crash])  # lost with the worker (or rolled back)
    emitted += h.out.emitted["default"][len(emitted) :]
    (h.restart if restart else h.rollback)(1)
    h.send(rows[cut:])
    emitted += h.out.emitted["default"]
    if "timestamp_field" not in block:  # processing time: a replayed tuple arrives at another time
        emitted = [[None, None, *r[2:]] for r in emitted]
        expected = {i: [None, None, *r[2:]] for i, r in expected.items()}
    got: dict[str, list[Any]] = {}
    for row in emitted:
        assert got.setdefault(row[4], row) == row, f"window {row[4]} emitted twice with different values"
    assert got == expected


# ------------------------------------------------------------------------------------ batch windows
def _batches(rows: list[list[Any]], size: int) -> list[list[list[Any]]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


@pytest.mark.parametrize("shape", [(6000, 2000), (4000, 4000), (3000, 1000)])
def test_batch_windows_equal_sparks_with_panes_combined(shape: tuple[int, int]) -> None:
    length, slide = shape
    rows = _events(11, 600, jitter=700)
    block = {"length": f"{length}ms", "sliding": f"{slide}ms", "timestamp_field": "ts", "lag": "1s"}
    h = Harness(COUNT_BATCH, block, conf={"count.by": "user"})
    for part in _batches(rows, 37):
        h.send_batch(part)
    got = {(r[0], r[1], r[2]): r[3] for r in h.out.emitted["default"]}
    assert got == closed(spark_windows(rows, length, slide), _watermark(rows, 1000))
    assert h.out.acked == len(rows)
    held = h.window_metrics()["held"]
    assert held <= 3 * (length // slide + 2) * 3, f"{held} rows held: sealed panes are combined per key"


def test_batch_windows_take_a_timestamp_column_and_send_late_rows_on() -> None:
    rows = _events(5, 300, jitter=3000)
    schema = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("user", pa.string()), ("v", pa.int64())])
    block = {"length": "2s", "timestamp_field": "ts", "lag": "1s", "late_stream": "late"}
    h = Harness(COUNT_BATCH, block, conf={"count.by": "user"}, late=True)
    for part in _batches(rows, 1):  # one row per batch: lateness is decided row by row, as for tuples
        h.send_batch([[dt.datetime.fromtimestamp(r[0] / 1000, tz=dt.UTC), r[1], r[2]] for r in part], schema)
    newest, kept, late = -(1 << 62), [], 0
    for row in rows:
        if row[0] < newest - 1000:
            late += 1
        else:
            kept.append(row)
        newest = max(newest, row[0])
    assert late
    assert len(h.out.emitted["late"]) == late
    got = {(r[0], r[1], r[2]): r[3] for r in h.out.emitted["default"]}
    assert got == closed(spark_windows(kept, 2000, 2000), _watermark(rows, 1000))


def test_batch_session_windows_equal_sparks() -> None:
    rows = _events(9, 400, jitter=600, users=5)
    h = Harness(
        COUNT_BATCH,
        {"session_gap": "1s", "timestamp_field": "ts", "lag": "1s", "key": "user"},
        conf={"count.by": "user"},
    )
    for part in _batches(rows, 23):
        h.send_batch(part)
    got = {(r[0], r[1], r[2]): r[3] for r in h.out.emitted["default"]}
    assert got == closed(spark_sessions(rows, 1000), _watermark(rows, 1000))


def test_batch_count_windows_slide_by_rows() -> None:
    h = Harness(COUNT_BATCH, {"length": "10 tuples", "sliding": "4 tuples"}, conf={"count.by": "user"})
    rows = [[i, "u", i] for i in range(50)]
    for part in _batches(rows, 7):
        h.send_batch(part)
    counts = [r[3] for r in h.out.emitted["default"]]
    assert counts == [4, 8, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10]


@pytest.mark.parametrize(
    "block",
    [
        {"length": "4s", "sliding": "1s", "timestamp_field": "ts", "lag": "1s"},
        {"session_gap": "1s", "timestamp_field": "ts", "lag": "1s", "key": "user"},
        {"length": "9 tuples", "sliding": "4 tuples", "timestamp_field": "ts", "lag": "1s"},
    ],
)
@pytest.mark.parametrize("restart", [True, False])
def test_batch_windows_replay_to_the_same_results(block: dict[str, Any], restart: bool) -> None:
    rows = _events(21, 400, jitter=700)
    parts = _batches(rows, 13)
    clean = Harness(COUNT_BATCH, block, conf={"count.by": "user"})
    for part in parts:
        clean.send_batch(part)
    expected = {r[4]: r for r in clean.out.emitted["default"]}
    h = Harness(COUNT_BATCH, block, conf={"count.by": "user"})
    for part in parts[:10]:
        h.send_batch(part)
    h.checkpoint(1)
    emitted = list(h.out.emitted["default"])
    for part in parts[10:20]:
        h.send_batch(part)
    emitted += h.out.emitted["default"][len(emitted) :]
    (h.restart if restart else h.rollback)(1)
    for part in parts[10:]:
        h.send_batch(part)
    emitted += h.out.emitted["default"]
    got: dict[str, list[Any]] = {}
    for row in emitted:
        assert got.setdefault(row[4], row) == row
    assert got == expected
