"""``spark.read.format("storm_state")``: committed state read back as a DataFrame, against the answer.

The keyed ledger runs in real worker processes (tests/support/ledger.py: the test plays
Spark's writer and driver), a savepoint is taken through a worker (what ``spark-storm
savepoint`` does), and Spark reads it: every key's [count, sum] must equal the answer
computed from the input, the change feed must be the task's changelog entries, and the
same read goes into parquet in one line.  The live read goes through ZooKeeper to the
running workers' embedded state.  Types and error messages use savepoints written directly.
"""

from __future__ import annotations

import datetime as dt
import decimal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_storm.state.kv import DELETED
from spark_storm.state.memory import MemoryBackend
from spark_storm.state.savepoint import ComponentManifest, Manifest, Savepoint, write_manifest, write_task
from tests.support.ledger import Ledger, expected

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

BATCHES = 4


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Ledger, str]]:
    """The ledger after 4 committed batches (still running), and a savepoint of it."""
    tmp = tmp_path_factory.mktemp("ledger")
    with Ledger(tmp) as run:
        for batch in range(BATCHES):
            run.feed(batch, 300)
            run.commit(batch)
        taken = run.cluster.savepoint(tmp / "savepoints")
        print(f"savepoint {taken['path']} at epoch {taken['epoch']}")
        yield run, str(taken["path"])


def _read(spark: Any, path: str, **options: Any) -> Any:
    reader = spark.read.format("storm_state").option("path", path)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_a_savepoint_reads_back_equal_to_the_answer(spark: Any, ledger: tuple[Ledger, str]) -> None:
    run, path = ledger
    saved = Savepoint.open(path)
    df = _read(spark, path, component="ledger")
    assert df.schema.simpleString() == "struct<task:int,key:string,value:array<bigint>,epoch:bigint>"
    rows = df.collect()
    got = {r.key: r.value for r in rows}
    assert len(got) == len(rows), "a key is in two tasks"
    assert got == expected(run.batches)
    assert {r.epoch for r in rows} == {saved.manifest.epoch}
    for r in rows:  # each row's task index holds the key in the savepoint
        assert r.key in saved.read_task("ledger", r.task)
    assert {r.task for r in rows} == set(range(4))
    assert df.rdd.getNumPartitions() == 4  # one partition per task


def test_the_change_feed_is_the_changelog_from_fromEpoch_on(spark: Any, ledger: tuple[Ledger, str]) -> None:
    _, path = ledger
    saved = Savepoint.open(path)
    start = 3
    df = _read(spark, path, component="ledger", changes="true", fromEpoch=start)
    got = sorted((r.task, r.epoch, r.op, r.key, tuple(r.value or ())) for r in df.collect())
    want = []
    for index in range(4):
        store = saved.task_store("ledger", index)
        for epoch in store.epochs():
            entry = store.read(epoch)
            if epoch < start:
                continue
            want += [(index, epoch, "put", k, tuple(v)) for k, v in entry.puts.items()]
            want += [(index, epoch, "expire" if k in entry.expired else "delete", k, ()) for k in entry.deletes]
    assert got == sorted(want)
    assert got, "no changes read"
    assert {e for _, e, *_ in got} <= set(range(start, saved.manifest.epoch + 1))
    # the whole feed replayed in epoch order is the state
    whole = _read(spark, path, changes="true").orderBy("epoch").collect()
    state: dict[str, list[int]] = {}
    for r in whole:
        if r.op == "put":
            state[r.key] = list(r.value)
        else:
            state.pop(r.key, None)
    assert state == {r.key: list(r.value) for r in _read(spark, path).collect()}


def test_a_read_goes_into_parquet_in_one_line(spark: Any, ledger: tuple[Ledger, str], tmp_path: Path) -> None:
    run, path = ledger
    _read(spark, path, component="ledger").write.mode("overwrite").parquet(str(tmp_path / "ledger.parquet"))
    back = spark.read.parquet(str(tmp_path / "ledger.parquet")).collect()
    assert {r.key: r.value for r in back} == expected(run.batches)


def test_a_live_read_through_zookeeper_is_the_last_committed_epoch(
    spark: Any, ledger: tuple[Ledger, str], zookeeper: str
) -> None:
    import uuid

    from spark_storm.cluster.records import TopologyRecord
    from spark_storm.cluster.state import ClusterState

    run, _ = ledger
    zk = f"{zookeeper}/state-reader-{uuid.uuid4().hex[:8]}"
    with ClusterState(zk) as state:  # the ledger's definition in ZooKeeper, as `spark-storm submit` stores it
        state.submit_topology(TopologyRecord("ledger", run.topology.read_text(), submitted=time.time()))
    run.feed(BATCHES, 300)
    result = run.commit(BATCHES)
    df = (
        spark.read.format("storm_state")
        .option("zookeeper", zk)
        .option("topology", "ledger")
        .option("component", "ledger")
        .load()
    )
    rows = df.collect()
    print(f"live read: {len(rows)} keys at epoch {rows[0].epoch} (committed {result.epoch})")
    assert {r.key: r.value for r in rows} == expected(run.batches) == run.state()
    assert {r.epoch for r in rows} == {result.epoch}
    with pytest.raises(Exception, match=r"has no state of component 'ledgr'.*one of: in, ledger, mid"):
        spark.read.format("storm_state").option("zookeeper", zk).option("topology", "ledger").option(
            "component", "ledgr"
        ).load()


# --- types and errors, on savepoints written directly ------------------------------------------------


def _savepoint(root: Path, components: dict[str, list[dict[Any, Any]]], epoch: int = 2) -> str:
    """A savepoint of ``components`` (per task, its state at ``epoch``, written as a full entry then a delta)."""
    backend = MemoryBackend()
    files: dict[str, tuple[int, int]] = {}
    task = 0
    for comp, states in components.items():
        for index, data in enumerate(states):
            store = backend.task_store(task)
            task += 1
            store.write(1, True, {k: "old" for k in data})
            store.commit(1)
            store.write(epoch, False, {**data, "gone": DELETED})
            store.commit(epoch)
            files.update(write_task(root, comp, index, store, epoch))
    manifest = Manifest(
        id="test",
        topology="typed",
        version="v1",
        epoch=epoch,
        created=time.time(),
        batches={},
        kept={},
        components={c: ComponentManifest(len(s)) for c, s in components.items()},
        files=files,
    )
    write_manifest(root, manifest)
    return str(root)


NOW = dt.datetime(2024, 2, 29, 12, 30, 1, 5, tzinfo=dt.UTC)
TYPED: dict[str, Any] = {
    "s": "text",
    "i": 2**40,
    "f": 1.5,
    "b": True,
    "bin": b"\x00\xff",
    "d": dt.date(2024, 2, 29),
    "ts": NOW,
    "ntz": dt.datetime(2024, 2, 29, 12, 30),
    "dec": decimal.Decimal("12.340"),
    "iv": dt.timedelta(days=1, seconds=3),
    "arr": [1, 2, 3],
    "map": {"a": 1, "b": 2},
    "time": dt.time(12, 30, 1, 5),
}


@pytest.mark.parametrize("name", sorted(TYPED))
def test_values_come_back_as_spark_types(spark: Any, tmp_path: Path, name: str) -> None:
    value = TYPED[name]
    path = _savepoint(tmp_path, {"c": [{"k1": value, "k2": None}]})
    df = _read(spark, path)
    got = {r.key: r.value for r in df.collect()}
    want = {
        "s": "string",
        "i": "bigint",
        "f": "double",
        "b": "boolean",
        "bin": "binary",
        "d": "date",
        "ts": "timestamp",
        "ntz": "timestamp_ntz",
        "dec": "decimal(38,3)",
        "iv": "interval day to second",
        "arr": "array<bigint>",
        "map": "map<string,bigint>",
        "time": "time(6)",
    }[name]
    assert df.schema["value"].dataType.simpleString() == want
    back = got["k1"]
    if name == "ts":
        back = back.astimezone(dt.UTC)  # Spark hands timestamps back in the session's zone
    assert (bytes(back) if name == "bin" else back) == value
    assert got["k2"] is None


def test_mixed_values_and_keys_are_json_text(spark: Any, tmp_path: Path) -> None:
    data = {"a": 1, 7: "seven", ("x", 1): [1, "two"], "when": dt.date(2024, 1, 2), "raw": b"\x01"}
    path = _savepoint(tmp_path, {"mixed": [data]})
    df = _read(spark, path)
    assert df.schema.simpleString() == "struct<task:int,key:string,value:string,epoch:bigint>"
    by_key = {r.key: r.value for r in df.collect()}
    assert by_key == {
        '"a"': "1",
        "7": '"seven"',
        '["x",1]': '[1,"two"]',
        '"when"': '"2024-01-02"',
        '"raw"': '"AQ=="',
    }
    forced = _read(spark, _savepoint(tmp_path / "b", {"c": [{"k": 1}]}), types="json").collect()
    assert [(r.key, r.value) for r in forced] == [('"k"', "1")]


def test_a_user_schema_is_used_and_checked(spark: Any, tmp_path: Path) -> None:
    path = _savepoint(tmp_path, {"c": [{"k": 5}, {"j": 6}]})
    df = spark.read.format("storm_state").schema("task int, key string, value double, epoch bigint").load(path)
    assert sorted((r.task, r.key, r.value) for r in df.collect()) == [(0, "k", 5.0), (1, "j", 6.0)]
    with pytest.raises(Exception, match=r"a schema given with .schema\(\) must be 'task int, key <type>"):
        spark.read.format("storm_state").schema("key string, value double").load(path).collect()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "give option 'path' \\(a savepoint directory"),
        ({"path": "P", "zookeeper": "127.0.0.1:1"}, "options 'path' and 'zookeeper' exclude each other"),
        (
            {"path": "P", "component": "nope"},
            "has no state of component 'nope'; set option 'component' to one of: a, b",
        ),
        ({"path": "P"}, "option 'component' is required: savepoint .* holds the state of a, b"),
        ({"path": "P", "fromEpoch": "2"}, "'fromEpoch' is for the change feed; add option\\('changes', 'true'\\)"),
        ({"path": "P", "component": "a", "typs": "json"}, "unknown storm_state option 'typs'. Did you mean 'types'"),
        ({"path": "NOT"}, "savepoint .* does not exist; pass the directory `spark-storm savepoint` printed"),
        ({"path": "EMPTY"}, "is partial: it has no MANIFEST.json"),
        ({"zookeeper": "127.0.0.1:1"}, "option 'topology' is required with 'zookeeper'"),
    ],
)
def test_errors_are_one_line_naming_the_fix(spark: Any, tmp_path: Path, options: dict[str, str], message: str) -> None:
    path = _savepoint(tmp_path / "sp", {"a": [{"k": 1}], "b": [{"k": 2}]})
    (tmp_path / "empty").mkdir()
    places = {"P": path, "NOT": str(tmp_path / "nowhere"), "EMPTY": str(tmp_path / "empty")}
    reader = spark.read.format("storm_state")
    for key, value in options.items():
        reader = reader.option(key, places.get(value, value))
    with pytest.raises(Exception, match=message) as info:
        reader.load().collect()
    print(next((ln.strip() for ln in str(info.value).splitlines() if "Error: " in ln), str(info.value)[:300]))


def test_a_live_read_names_the_fix_when_the_state_is_not_on_this_host(tmp_path: Path) -> None:
    from spark_storm.errors import StateError
    from spark_storm.spark.state_source import _live_store

    conf = {"topology.state.provider.config": {"dir": str(tmp_path / "elsewhere")}}
    with pytest.raises(StateError, match=r"embedded state dir .* is not on this host.*take a savepoint"):
        _live_store("ledger", conf, 1)
    assert not (tmp_path / "elsewhere").exists()  # looked at, not created
    with pytest.raises(StateError, match=r"keeps its state in memory .* use the embedded or redis provider"):
        _live_store("ledger", {"topology.state.provider": "memory"}, 1)
