"""``spark.read.format("storm_state")`` from a Spark Connect client: found by the server itself, read, written."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from spark_storm.state.kv import DELETED
from spark_storm.state.memory import MemoryBackend
from spark_storm.state.savepoint import ComponentManifest, Manifest, write_manifest, write_task

pytestmark = [pytest.mark.connect, pytest.mark.spark]


def _savepoint(root: Path, tasks: int = 3, keys: int = 50) -> tuple[str, dict[str, list[int]]]:
    """A savepoint of a ledger-like component at epoch 2 (a full entry, then a delta); and its state."""
    backend = MemoryBackend()
    files: dict[str, tuple[int, int]] = {}
    state: dict[str, list[int]] = {}
    for index in range(tasks):
        store = backend.task_store(index + 1)
        mine = {f"u{k}": [k, k * 10] for k in range(keys) if k % tasks == index}
        store.write(1, True, mine)
        store.commit(1)
        first = min(mine)
        store.write(2, False, {first: [1, 1], f"u{index}": DELETED} if first != f"u{index}" else {first: DELETED})
        store.commit(2)
        files.update(write_task(root, "ledger", index, store, 2))
        state.update(store.restore(2)[1])
    manifest = Manifest("c", "ledger", "v1", 2, time.time(), {}, {}, {"ledger": ComponentManifest(tasks)}, files)
    write_manifest(root, manifest)
    return str(root), state


def test_storm_state_reads_and_writes_from_a_connect_client(connect: Any, tmp_path: Path) -> None:
    path, state = _savepoint(tmp_path / "savepoint")
    df = connect.read.format("storm_state").option("path", path).option("component", "ledger").load()
    rows = df.collect()
    assert {r.key: list(r.value) for r in rows} == state
    assert {r.epoch for r in rows} == {2}
    df.write.mode("overwrite").parquet(str(tmp_path / "out"))  # a savepoint into a table: one line
    assert connect.read.parquet(str(tmp_path / "out")).count() == len(state)
    feed = connect.read.format("storm_state").option("path", path).option("changes", "true").option("fromEpoch", 2)
    ops = {(r.op, r.epoch) for r in feed.load().collect()}
    assert ops == {("put", 2), ("delete", 2)}
    with pytest.raises(Exception, match="has no state of component 'ledgr'"):
        connect.read.format("storm_state").option("path", path).option("component", "ledgr").load().collect()
