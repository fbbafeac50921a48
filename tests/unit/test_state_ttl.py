"""State TTL: expiry at barriers, per-put TTLs, entries that carry it, restores and replays that decide the same."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from spark_storm.codec.serializer import pack_value
from spark_storm.codec.tuples import Tuple as StormTuple
from spark_storm.codec.tuples import TupleSource
from spark_storm.errors import ConfigError, StateError
from spark_storm.state import KeyValueState, StateBackend, TaskStore
from spark_storm.state.files import EmbeddedBackend
from spark_storm.state.format import ENTRY_MAGIC, TtlMeta, decode_entry, encode_entry, encode_entry_parts
from spark_storm.state.kv import TtlKeyValueState
from spark_storm.state.memory import MemoryBackend
from spark_storm.state.ttl import restore_with_ttl
from spark_storm.worker.checkpoint.ttl import EventClock, TtlSettings


@pytest.fixture(params=["embedded", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> StateBackend:
    if request.param == "embedded":
        return EmbeddedBackend("topo", tmp_path)
    return MemoryBackend()


def barrier(store: TaskStore, state: KeyValueState, epoch: int, now: int | None, *, full: bool = False) -> list[Any]:
    """What ExecutorCheckpoints._encode_ttl does at barrier ``epoch``, written at once; returns the expired keys."""
    assert isinstance(state, TtlKeyValueState)
    expired = state.advance(now)
    changes = state.snapshot() if full else state.take_changes()
    clock, written, ttls = state.entry_ttl(full)
    store.write_encoded(epoch, full, encode_entry_parts(epoch, full, changes, TtlMeta(clock, written, ttls, expired)))
    return sorted(map(repr, expired))


def tick(state: KeyValueState, now: int | None) -> list[Any]:
    """A barrier without a store: advance, then the changes are taken (as the entry would)."""
    assert isinstance(state, TtlKeyValueState)
    expired = state.advance(now)
    state.take_changes()
    return sorted(expired, key=repr)


def restored(store: TaskStore, epoch: int, ttl: int | None) -> TtlKeyValueState:
    _, data, meta = restore_with_ttl(store, epoch)
    state = KeyValueState(data)
    out = state.enable_ttl(ttl)
    out.load_ttl(meta.written, meta.ttls, meta.clock)
    return out


def test_a_key_not_written_for_the_ttl_is_gone_at_the_first_barrier_whose_clock_reaches_it() -> None:
    state = KeyValueState().enable_ttl(100)
    state.put("a", 1)
    state.put("b", 1)
    assert tick(state, 1000) == []  # written at this barrier's clock: 1000
    assert tick(state, 1099) == []
    state.put("b", 2)  # written again: its clock is the next barrier's
    assert tick(state, 1099) == []  # a clock never goes back: 1099 again
    assert tick(state, 1100) == ["a"]
    assert state.get("a") is None
    assert "a" not in state
    assert state.get("b") == 2
    assert tick(state, 1198) == []
    assert tick(state, 1199) == ["b"]
    assert len(state) == 0
    assert state.ttl_clock == 1199


def test_a_barrier_without_a_clock_expires_nothing_and_the_first_clock_stamps_what_was_written() -> None:
    state = KeyValueState().enable_ttl(10)
    state.put("early", 1)
    assert tick(state, None) == []
    assert state.ttl_clock is None
    assert state.advance(500) == []  # "early" gets 500, recorded as a change of this barrier
    assert state.take_changes() == {"early": 1}
    assert tick(state, 509) == []
    assert tick(state, 510) == ["early"]


def test_per_put_ttl_overrides_the_component_ttl_and_the_last_put_of_an_epoch_wins() -> None:
    state = KeyValueState().enable_ttl(1000)
    state.put("short", 1, ttl=10)
    state.put("delta", 1, ttl=dt.timedelta(milliseconds=20))
    state.put("plain", 1)
    state.put("undone", 1, ttl=10)
    state.put("undone", 2)  # a put without ttl: the component's again
    state.put_many(["m1", "m2"], [1, 2], ttl=10)
    tick(state, 0)
    assert sorted(tick(state, 10)) == ["m1", "m2", "short"]
    assert tick(state, 20) == ["delta"]
    assert tick(state, 999) == []
    assert sorted(tick(state, 1000)) == ["plain", "undone"]


def test_a_put_with_ttl_turns_ttl_on_for_a_component_without_one() -> None:
    state = KeyValueState()
    state.put("forever", 1)
    assert not state.ttl_on
    state.put("session", 1, ttl=50)
    assert state.ttl_on
    assert isinstance(state, TtlKeyValueState)
    assert tick(state, 0) == []
    assert tick(state, 50) == ["session"]
    assert tick(state, 10**9) == []  # no component TTL: the rest stays
    assert state.get("forever") == 1


def test_bad_ttls_and_a_component_without_a_clock_are_refused_naming_the_fix() -> None:
    state = KeyValueState()
    for bad in (0, -5, 1.5, "10s", True):
        with pytest.raises(StateError, match=r"TTL|ttl"):
            state.put("k", 1, ttl=bad)  # type: ignore[arg-type]
    state.refuse_ttl("component 'c': no event time; give it 'timestamp_field: <field>'")
    with pytest.raises(StateError, match="timestamp_field"):
        state.put("k", 1, ttl=10)


def test_window_keys_never_expire() -> None:
    state = KeyValueState().enable_ttl(10, exempt="__window")
    state.put(["__window", "meta"], {"clock": 1})
    state.put("user", 1)
    tick(state, 0)
    assert tick(state, 10**6) == ["user"]
    assert state.get(["__window", "meta"]) == {"clock": 1}


def test_memory_stays_flat_under_an_unbounded_key_space() -> None:
    state = KeyValueState().enable_ttl(5)
    book = state._ttl
    sizes = []
    for epoch in range(60):
        for i in range(200):
            state.put(f"k{epoch}-{i}", i)
            state.get(f"k{epoch}-{i}")
        state.put("hot", epoch)  # written every epoch: never expires, leaves stale bucket entries behind
        tick(state, epoch)
        state.take_changes()
        sizes.append((len(state), len(book.stamp), sum(map(len, book.buckets.values())), len(book.heap)))
    assert sizes[-1] == sizes[20]  # flat after the first TTL period
    assert sizes[-1][0] == 5 * 200 + 1


def test_entries_carry_write_times_ttls_and_expiries_apart_from_deletes(backend: StateBackend) -> None:
    store = backend.task_store(1)
    state = KeyValueState().enable_ttl(100)
    state.put("a", 1)
    state.put("b", 1, ttl=1000)
    state.put("c", 1)
    barrier(store, state, 1, 0)
    state.delete("c")
    state.put("d", [1, 2])
    assert barrier(store, state, 2, 100) == ["'a'"]
    entry = store.read(2)
    assert entry.ttl
    assert entry.clock == 100
    assert entry.expired == ["a"]
    assert sorted(entry.deletes) == ["a", "c"]  # a restore that knows no TTL drops expired keys too
    assert entry.written == {"d": 100}
    first = store.read(1)
    assert first.written == {"a": 0, "b": 0, "c": 0}
    assert first.ttls == {"b": 1000}
    assert store.restore(2) == (2, {"b": 1, "d": [1, 2]})
    _, data, meta = restore_with_ttl(store, 2)
    assert data == {"b": 1, "d": [1, 2]}
    assert meta.written == {"b": 0, "d": 100}
    assert meta.ttls == {"b": 1000}
    assert meta.clock == 100
    barrier(store, state, 3, 150, full=True)
    full = store.read(3)
    assert full.full
    assert full.written == {"b": 0, "d": 100}
    assert full.ttls == {"b": 1000}


def test_entries_without_ttl_are_byte_for_byte_the_old_format_and_old_entries_decode() -> None:
    changes = {"a": 1, ("l", 2): [3]}
    assert encode_entry(4, False, changes) == b"".join(encode_entry_parts(4, False, changes, None))
    import zlib

    body = pack_value([7, True, ["a", ["l", 2]], [1, [3]], ["gone"]])  # an entry written before TTL existed
    old = ENTRY_MAGIC + zlib.crc32(body).to_bytes(4, "big") + body
    entry = decode_entry(old, "old")
    assert (entry.epoch, entry.full, entry.puts, entry.deletes) == (7, True, {"a": 1, ("l", 2): [3]}, ["gone"])
    assert (entry.expired, entry.written, entry.ttls, entry.clock, entry.ttl) == ([], {}, {}, None, False)


def test_big_values_with_ttl_encode_as_one_body_would() -> None:
    blob = [b"x" * 5000, b"y"]
    meta = TtlMeta(5, 5, {"k": 9}, ["old"])
    parts = encode_entry_parts(1, False, {"k": blob}, meta)
    entry = decode_entry(b"".join(parts), "big")
    assert entry.puts == {"k": blob}
    assert entry.ttls == {"k": 9}
    assert entry.expired == ["old"]
    assert entry.written == {"k": 5}


def test_turning_ttl_on_for_state_written_without_it_stamps_every_key_at_the_first_barrier(
    backend: StateBackend,
) -> None:
    store = backend.task_store(2)
    plain = KeyValueState()
    for i in range(10):
        plain.put(f"k{i}", i)
    store.write(1, False, plain.take_changes())  # TTL off: the old format
    plain.put("k0", 100)
    store.write(2, False, plain.take_changes())
    state = restored(store, 2, 50)
    assert len(state) == 10
    assert barrier(store, state, 3, 1000) == []  # write time of every key: this barrier's clock
    assert store.read(3).written == {f"k{i}": 1000 for i in range(10)}  # recorded, so a rollback to 3 knows
    again = restored(store, 3, 50)
    assert barrier(store, again, 4, 1049) == []
    assert len(barrier(store, again, 5, 1050)) == 10


def test_a_replay_after_a_rollback_expires_the_same_keys(backend: StateBackend) -> None:
    """Epochs of writes and barrier clocks; a rollback to 3 (or to 5, past a snapshot) replays the same."""
    store = backend.task_store(3)
    epochs: list[tuple[list[tuple[str, int, int | None]], int]] = [
        ([(f"u{i}", i, None) for i in range(20)], 100),
        ([(f"u{i}", i, 30 if i % 3 == 0 else None) for i in range(10, 30)], 120),
        ([(f"u{i}", i, None) for i in range(25, 35)], 140),
        ([("u1", 1, None)], 150),
        ([(f"u{i}", i, None) for i in range(40, 45)], 190),
        ([], 230),
        ([(f"u{i}", i, None) for i in range(5)], 260),
    ]

    def play(state: KeyValueState, first: int) -> list[list[Any]]:
        out = []
        for epoch in range(first, len(epochs) + 1):
            puts, clock = epochs[epoch - 1]
            for key, value, ttl in puts:
                state.put(key, (state.get(key) or 0) + value, ttl=ttl)
            out.append(barrier(store, state, epoch, clock, full=epoch == 5))
        return out

    state = KeyValueState().enable_ttl(60)
    straight = play(state, 1)
    final = dict(state.items())
    assert any(straight)
    assert final
    for rollback_to in (3, 5):
        store.discard_after(rollback_to)
        replayed = play(restored(store, rollback_to, 60), rollback_to + 1)
        assert replayed == straight[rollback_to:]
        assert dict(restored(store, len(epochs), 60).items()) == final


def test_settings_read_once_with_errors_naming_key_value_and_fix() -> None:
    conf = {"topology.state.ttl.ms": 60_000, "timestamp_field": "ts"}
    s = TtlSettings.from_conf(conf, "ledger", conf)
    assert (s.ttl_ms, s.clock, s.timestamp_field, s.tracks, s.on) == (60_000, "event", "ts", True, True)
    assert TtlSettings.from_conf({"topology.state.ttl.ms": "10m", "timestamp_field": "ts"}, "c", {}).ttl_ms == 600_000
    s = TtlSettings.from_conf({"topology.state.ttl.clock": "processing"}, "c", {})
    assert s.ttl_ms is None
    assert s.refused is None
    assert not s.on
    assert TtlSettings.from_conf({}, "c", {}).refused is not None  # event clock, no event time, no TTL: put(ttl=) fails
    with pytest.raises(ConfigError, match=r"component 'c': topology.state.ttl.ms is -5; give a positive"):
        TtlSettings.from_conf({"topology.state.ttl.ms": -5}, "c", {})
    with pytest.raises(ConfigError, match=r"topology.state.ttl.clock is 'wall'; use 'event'"):
        TtlSettings.from_conf({"topology.state.ttl.ms": 5, "topology.state.ttl.clock": "wall"}, "c", {})
    with pytest.raises(ConfigError, match=r"no event time; give it 'timestamp_field: <field>'.*processing"):
        TtlSettings.from_conf({"topology.state.ttl.ms": 5}, "c", {})
    window = {"topology.bolts.window.length.duration.ms": 1000, "topology.bolts.tuple.timestamp.field.name": "ts"}
    s = TtlSettings.from_conf({"topology.state.ttl.ms": 5, **window}, "w", window)
    assert s.windowed
    assert not s.tracks
    assert s.on


def test_the_event_clock_is_the_newest_event_time_the_tuples_carried() -> None:
    import pyarrow as pa

    from spark_storm.codec.columnar import ColumnarBatch

    src = TupleSource("mid", 3, "default", ("key", "ts"))
    other = TupleSource("side", 4, "default", ("key",))
    clock = EventClock("ts")
    assert clock.now() is None
    clock.observe([(1, [StormTuple(["a", 50], src), StormTuple(["b", 40], src), StormTuple(["c", None], src)])])
    clock.observe([(1, [StormTuple(["x"], other)])])  # no such field: logged, does not move it
    assert clock.now() == 50
    assert clock.bad == 1
    stamp = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    clock.observe([(1, [StormTuple(["d", stamp], src)])])
    assert clock.now() == int(stamp.timestamp() * 1000)
    batch = ColumnarBatch(pa.record_batch({"key": ["a", "b"], "ts": [10**13, None]}), src)
    clock.observe([(1, batch)])
    assert clock.now() == 10**13
