"""Key-value state, changelogs with snapshots, input logs: embedded (files) and memory backends."""

from __future__ import annotations

import datetime as dt
import decimal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark_storm.config import Config
from spark_storm.errors import CheckpointError, ConfigError, StateCorruptError, StateError
from spark_storm.state import DELETED, KeyValueState, LogRecord, StateBackend, StateWriter, make_backend
from spark_storm.state.files import EmbeddedBackend
from spark_storm.state.memory import MemoryBackend
from tests.support.state import check_changelog, check_input_log


@pytest.fixture(params=["embedded", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> StateBackend:
    if request.param == "embedded":
        return EmbeddedBackend("topo", tmp_path)
    return MemoryBackend()


def test_key_value_state_is_storms_api_with_any_key_tuples_carry() -> None:
    state = KeyValueState()
    keys: list[Any] = ["", "\x00", "ünï", b"\x00b", 0, -1, 2.5, True, None, ["a", 1], {"m": [1]}, dt.date(2024, 1, 1)]
    for i, key in enumerate(keys):
        state.put(key, i)
    for i, key in enumerate(keys):
        assert state.get(key) == i
    assert len(state) == len(keys)
    assert state.get("missing", 7) == 7
    assert ["a", 1] in state
    assert sorted(map(repr, state.keys())) == sorted(map(repr, keys))
    state.delete(["a", 1])
    state.delete("not there")
    assert state.get(["a", 1]) is None
    assert len(state) == len(keys) - 1
    assert ("", 0) in list(state.items())


def test_a_value_the_codec_cannot_store_is_refused_naming_its_type() -> None:
    state = KeyValueState()
    with pytest.raises(StateError, match=r"state value of type object cannot be stored"):
        state.put("k", object())
    lock = threading.Lock()
    with pytest.raises(StateError, match=r"state key of type _thread\.lock cannot be stored"):
        state.put(lock, 1)
    assert len(state) == 0


def test_ints_beyond_64_bits_are_refused_as_keys_values_and_inside_lists() -> None:
    state = KeyValueState()
    big = 2**64
    with pytest.raises(StateError, match=r"state key 18446744073709551616 is an int outside 64 bits.*as a str"):
        state.put(big, 1)
    with pytest.raises(StateError, match=r"state value 18446744073709551616 is an int outside 64 bits"):
        state.put("k", big)
    with pytest.raises(StateError, match=r"state key of type list cannot be stored"):
        state.put(["user", big], 1)
    with pytest.raises(StateError, match=r"state value of type list cannot be stored"):
        state.put_many(["k"], [[1, -(2**63) - 1]])
    state.put(2**64 - 1, -(2**63))  # the edges fit
    assert state.get(2**64 - 1) == -(2**63)
    assert len(state) == 1


def test_list_keys_nested_or_flat_are_one_key_whatever_the_sequence_type() -> None:
    state = KeyValueState()
    state.put(["user", 1], 1)
    state.put(("user", 1), state.get(["user", 1]) + 1)
    state.put(["n", [1, {"x": [2]}]], 5)
    assert state.get(("n", (1, {"x": (2,)}))) == 5
    assert sorted(map(repr, state.items())) == sorted(map(repr, [(["user", 1], 2), (["n", [1, {"x": [2]}]], 5)]))
    assert state.changed == 2


def test_changes_are_the_keys_put_or_deleted_since_the_last_checkpoint() -> None:
    state = KeyValueState({"a": 1, "b": 2})
    state.put("a", 10)
    state.delete("b")
    state.put("c", 3)
    assert state.take_changes() == {"a": 10, "b": DELETED, "c": 3}
    assert state.take_changes() == {}


def test_get_many_put_many_take_arrow_numpy_or_lists() -> None:
    import numpy as np
    import pyarrow as pa

    state = KeyValueState()
    state.put_many(pa.array(["x", "y"]), np.array([1, 2]))
    assert state.get_many(pa.array(["x", "y", "z"]), 0).to_pylist() == [1, 2, 0]
    assert state.get_many(["y"]) == [2]
    assert list(state.get_many(np.array(["x"]))) == [1]
    with pytest.raises(StateError, match="2 keys but 1 values"):
        state.put_many(["a", "b"], [1])


def test_restore_any_epoch_since_the_last_snapshot_and_commit_compacts(backend: StateBackend) -> None:
    check_changelog(backend)


def test_missing_or_corrupt_entries_fail_the_restore_naming_the_task(tmp_path: Path) -> None:
    backend = EmbeddedBackend("topo", tmp_path)
    store = backend.task_store(9)
    for epoch in (1, 2, 3):
        store.write(epoch, False, {"k": epoch})
    store.commit(3)
    (tmp_path / "topo" / "task-9" / "e000000000002.delta").unlink()
    with pytest.raises(
        StateCorruptError, match=r"task 9: cannot restore epoch 3: the entries of epoch\(s\) 2 are missing"
    ):
        store.restore()
    path = tmp_path / "topo" / "task-9" / "e000000000003.delta"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(StateCorruptError, match=r"task 9: .*e000000000003.delta: checksum mismatch"):
        store.read(3)
    (tmp_path / "topo" / "task-9" / "COMMITTED").write_text("{not json")
    with pytest.raises(StateCorruptError, match=r"COMMITTED is unreadable"):
        store.committed()


def test_a_task_whose_state_is_elsewhere_is_an_error_not_empty_state(tmp_path: Path) -> None:
    store = EmbeddedBackend("topo", tmp_path).task_store(2)
    with pytest.raises(StateCorruptError, match=r"needs topology\.state\.provider: redis"):
        store.restore(12)


def test_spark_values_round_trip_through_the_changelog(backend: StateBackend) -> None:
    store = backend.task_store(1)
    value = {"when": dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC), "amount": decimal.Decimal("1.50"), "tags": ["a"]}
    state = KeyValueState()
    state.put(("user", 7), value)
    store.write(1, False, state.take_changes())
    _, data = store.restore(1)
    assert KeyValueState(data).get(["user", 7]) == value


def test_input_log_segments_by_epoch_replay_retag_and_truncate(backend: StateBackend) -> None:
    check_input_log(backend)


def test_a_sealed_segment_takes_no_more_appends_and_is_made_durable_afterwards(tmp_path: Path) -> None:
    log = EmbeddedBackend("topo", tmp_path).input_log(3, "h:6700")
    log.append(LogRecord(("q", 1, 0, 0), [b"before"]), 5)
    make_durable = log.seal(5)  # under the worker's gate: cheap
    assert log.last_barrier() < 5  # the marker is written by make_durable, after the gate
    log.append(LogRecord(("q", 1, 0, 1), [b"after"]), 6)  # a receive thread, meanwhile
    make_durable()
    assert log.last_barrier() == 5
    again = EmbeddedBackend("topo", tmp_path).input_log(3, "h:6701")
    assert [r.payloads for r in again.entries(4)] == [[b"before"], [b"after"]]
    assert [r.payloads for r in again.entries(5)] == [[b"after"]]


def test_input_log_survives_the_process_and_a_truncated_tail_is_skipped(tmp_path: Path) -> None:
    log = EmbeddedBackend("topo", tmp_path).input_log(3, "h:6700")
    log.append(LogRecord(("q", 1, 0, 0), [b"x" * 10]), 5)
    log.append(LogRecord(None, [b"plain"]), 5)
    [segment] = (tmp_path / "topo" / "task-3" / "log").glob("*.log")
    with segment.open("ab") as f:
        f.write(b"\x00\x00\x01\x00garbage")  # a write cut short by a crash
    again = EmbeddedBackend("topo", tmp_path).input_log(3, "h:6701")  # another worker, later
    assert again.has(("q", 1, 0, 0))
    assert [r.payloads for r in again.entries(0)] == [[b"x" * 10], [b"plain"]]


def test_providers_and_their_settings_are_checked() -> None:
    def conf(**values: Any) -> Config:
        return Config.of({"topology.state.provider": "embedded", **values})

    with pytest.raises(ConfigError, match=r"'embeded' is not a provider\. Did you mean 'embedded'"):
        make_backend(Config.of({"topology.state.provider": "embeded"}), "t")
    with pytest.raises(ConfigError, match=r"'dri' is not a setting of the embedded provider\. Did you mean 'dir'"):
        make_backend(conf(**{"topology.state.provider.config": {"dri": "/x"}}), "t")
    with pytest.raises(ConfigError, match=r"log\.fsync must be 'commit' or 'group'"):
        make_backend(conf(**{"topology.state.provider.config": {"log.fsync": "always"}}), "t")
    with pytest.raises(ConfigError, match="is not a StateBackend subclass"):
        make_backend(Config.of({"topology.state.provider": "spark_storm.state:KeyValueState"}), "t")


def _reference_entry(epoch: int, full: bool, changes: dict[Any, Any]) -> bytes:
    """A changelog entry as one msgpack body (what the parts must add up to, byte for byte)."""
    import zlib

    from spark_storm.codec.serializer import pack_value
    from spark_storm.state.format import ENTRY_MAGIC
    from spark_storm.state.kv import thaw

    puts = [(thaw(k), v) for k, v in changes.items() if v is not DELETED]
    deletes = [thaw(k) for k, v in changes.items() if v is DELETED]
    body = pack_value([epoch, full, [k for k, _ in puts], [v for _, v in puts], deletes])
    return ENTRY_MAGIC + zlib.crc32(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("blob", [10, 4096, 70_000])
@pytest.mark.parametrize("count", [1, 15, 16, 70_000])
def test_entries_and_records_written_as_parts_are_byte_for_byte_one_msgpack_body(
    tmp_path: Path, blob: int, count: int
) -> None:
    """Big values (a window pane's Arrow streams) are written from where they are, never copied into
    the body: the file holds the same bytes one ``packb`` would make, so every reader is unchanged."""
    import os
    import zlib

    from spark_storm.codec.serializer import pack_value
    from spark_storm.state.format import encode_entry, encode_record
    from spark_storm.state.kv import freeze

    blobs = [os.urandom(blob) for _ in range(min(count, 20))]
    changes: dict[Any, Any] = {freeze(["w", "b", i]): blobs[: 1 + i % len(blobs)] for i in range(min(count, 40))}
    changes.update({freeze(["n", i]): [i, i * 2.5] for i in range(count)})
    changes[freeze(["gone"])] = DELETED
    changes[freeze(["mixed"])] = [blobs[0], 3]
    assert encode_entry(7, False, changes) == _reference_entry(7, False, changes)
    record = LogRecord(("q", 1, 2, 3), (blobs * 2)[: min(count, 17)])  # 1, 15, 16 and 17 payloads
    body = pack_value([["q", 1, 2, 3], record.payloads])
    assert encode_record(record) == len(body).to_bytes(4, "big") + zlib.crc32(body).to_bytes(4, "big") + body
    backend = EmbeddedBackend("parts", tmp_path)
    store = backend.task_store(1)
    assert store.write(7, False, changes) == len(_reference_entry(7, False, changes))
    entry = store.read(7)
    assert entry.puts[freeze(["w", "b", 0])] == blobs[:1]
    assert entry.deletes == [freeze(["gone"])]
    log = backend.input_log(2, "w")
    log.append(record, 1)
    log.append(LogRecord(None, [b"small"]), 1)
    assert [r.payloads for r in log.entries(0)] == [record.payloads, [b"small"]]


def test_the_state_writer_runs_jobs_in_order_off_the_caller_and_drain_waits_for_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer = StateWriter("test-writer")
    release = threading.Event()
    ran: list[int] = []
    threads: set[str] = set()

    def job(i: int) -> Callable[[], None]:
        def run() -> None:
            if i == 0:
                release.wait(10)
            if i == 2:
                msg = "a job that lets its error out"
                raise RuntimeError(msg)
            ran.append(i)
            threads.add(threading.current_thread().name)

        return run

    for i in range(5):
        writer.submit(job(i))
    assert writer.pending == 5
    assert not writer.drain(0.05)  # job 0 holds the rest behind it
    assert ran == []
    release.set()
    assert writer.drain(10)
    assert ran == [0, 1, 3, 4]  # in order; job 2's error is logged and the writer goes on
    assert threads == {"test-writer"}
    assert "a job that lets its error out" in caplog.text
    assert writer.close(1)
    with pytest.raises(CheckpointError, match="worker is stopping"):
        writer.submit(job(5))
