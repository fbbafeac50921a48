"""Savepoints without processes: what a savepoint holds, what a broken one says, how state is matched and moved."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spark_storm.errors import SavepointError
from spark_storm.state.memory import MemoryBackend
from spark_storm.state.savepoint import ComponentManifest, Manifest, Savepoint, write_manifest, write_task
from spark_storm.topology.hashing import fields_hash, pmod
from spark_storm.topology.loader import topology_from_dict
from spark_storm.topology.model import Topology
from spark_storm.topology.restore import check_state_version, plan_restore, split_keyed, task_share


def _topology(tasks: int = 4, grouping: str = "fields", extra: dict[str, Any] | None = None) -> Topology:
    ledger: dict[str, Any] = {
        "id": "ledger",
        "bolt": "tests.integration.bolts:LedgerBolt",
        "tasks": tasks,
        "inputs": [{"from": "in", "grouping": grouping, **({"fields": ["key"]} if grouping == "fields" else {})}],
    }
    ledger.update(extra or {})
    return topology_from_dict(
        {"name": "ledger", "components": [{"id": "in", "source": True, "fields": ["key", "n"]}, ledger]}, origin="test"
    )


def _keyed(tasks: int, keys: int = 60) -> list[dict[Any, Any]]:
    """Per task index, the keys the fields grouping sends it, with a value each."""
    out: list[dict[Any, Any]] = [{} for _ in range(tasks)]
    for i in range(keys):
        key = f"u{i}"
        out[pmod(fields_hash([key]), tasks)][key] = [i, i * 10]
    return out


def _savepoint(tmp: Path, states: list[dict[Any, Any]], epoch: int = 3, topology: str = "ledger") -> Path:
    """A savepoint of one component 'ledger' whose task i held ``states[i]`` (written over three epochs)."""
    root = tmp / "sp"
    backend = MemoryBackend()
    files: dict[str, tuple[int, int]] = {}
    for index, state in enumerate(states):
        store = backend.task_store(index)
        items = list(state.items())
        store.write(1, True, dict(items[: len(items) // 2]))
        store.write(2, False, dict(items[len(items) // 2 :]))
        store.write(3, False, {})
        store.commit(epoch)
        files.update(write_task(root, "ledger", index, store, epoch))
    manifest = Manifest(
        "id1",
        topology,
        "v",
        epoch,
        0.0,
        {"q": 4},
        {"in": [("q", 5, 0, 0)]},
        {"ledger": ComponentManifest(len(states))},
        files,
    )
    write_manifest(root, manifest)
    return root


def test_a_savepoint_reads_back_every_task_at_its_epoch(tmp_path: Path) -> None:
    states = _keyed(4)
    saved = Savepoint.open(_savepoint(tmp_path, states), topology="ledger")
    assert saved.manifest.epoch == 3
    assert saved.manifest.batches == {"q": 4}
    assert saved.manifest.kept == {"in": [("q", 5, 0, 0)]}
    assert [saved.read_task("ledger", i) for i in range(4)] == states
    assert saved.task_store("ledger", 0).committed() == 3


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ("nothing there", "does not exist"),
        ("no manifest", "is partial"),
        ("manifest not json", "is unreadable"),
        ("newer format", "is newer than this spark-storm reads"),
        ("a file missing", "is missing (the manifest lists it)"),
        ("a file truncated", "the manifest says"),
        ("a file changed", "fails its CRC-32 check"),
        ("another topology", "is of topology 'other', not 'ledger'"),
    ],
)
def test_a_broken_savepoint_is_refused_in_one_line_naming_the_file(tmp_path: Path, damage: str, says: str) -> None:
    root = _savepoint(tmp_path, _keyed(2), topology="other" if damage == "another topology" else "ledger")
    manifest = root / "MANIFEST.json"
    entry = next(root.glob("ledger/task-0/e*.full"))
    if damage == "nothing there":
        root = tmp_path / "nope"
    elif damage == "no manifest":
        manifest.unlink()
    elif damage == "manifest not json":
        manifest.write_text("{not json")
    elif damage == "newer format":
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": 99}))
    elif damage == "a file missing":
        entry.unlink()
    elif damage == "a file truncated":
        entry.write_bytes(entry.read_bytes()[:-3])
    elif damage == "a file changed":
        data = bytearray(entry.read_bytes())
        data[-1] ^= 0xFF
        entry.write_bytes(bytes(data))
    with pytest.raises(SavepointError) as err:
        Savepoint.open(root, topology="ledger")
    text = str(err.value)
    assert says in text, text
    assert "\n" not in text
    if damage.startswith("a file"):
        assert "e000000000001.full" in text, text


def test_a_saved_component_the_topology_lacks_is_refused_unless_allowed(tmp_path: Path) -> None:
    saved = Savepoint.open(_savepoint(tmp_path, _keyed(4)))
    topo = topology_from_dict({"name": "ledger", "components": [{"id": "in", "source": True}]}, origin="test")
    with pytest.raises(SavepointError, match=r"holds the state of 'ledger'.*--allow-unmatched-state"):
        plan_restore(saved, topo, lambda cid: False)
    assert plan_restore(saved, topo, lambda cid: False, allow_unmatched=True).dropped == ("ledger",)


def test_a_new_stateful_component_starts_empty_and_a_same_size_one_is_copied(tmp_path: Path) -> None:
    saved = Savepoint.open(_savepoint(tmp_path, _keyed(4)))
    plan = plan_restore(saved, _topology(4), lambda cid: cid == "ledger")
    assert not plan.components["ledger"].rescaled
    assert plan.components["ledger"].saved_tasks == 4


@pytest.mark.parametrize(("grouping", "extra"), [("shuffle", {}), ("fields", {"window": {"length": "10s"}})])
def test_a_rescale_of_state_that_cannot_move_is_refused(tmp_path: Path, grouping: str, extra: dict[str, Any]) -> None:
    saved = Savepoint.open(_savepoint(tmp_path, _keyed(4)))
    with pytest.raises(SavepointError, match="keep its tasks at 4"):
        plan_restore(saved, _topology(6, grouping, extra), lambda cid: cid == "ledger")


@pytest.mark.parametrize("tasks", [1, 3, 6, 8])
def test_keyed_state_moves_to_the_task_its_key_now_hashes_to(tmp_path: Path, tasks: int) -> None:
    states = _keyed(4)
    shares = [task_share(enumerate(states), 4, tasks, j, "test") for j in range(tasks)]
    merged: dict[Any, Any] = {}
    for j, share in enumerate(shares):
        assert all(pmod(fields_hash([k]), tasks) == j for k in share)
        merged.update(share)
    assert merged == {k: v for s in states for k, v in s.items()}
    assert sum(len(s) for s in shares) == len(merged)  # each key on one task


def test_state_not_keyed_by_its_grouping_values_is_refused_naming_the_key() -> None:
    states = _keyed(4)
    stray = next(k for k in (f"stray{i}" for i in range(100)) if pmod(fields_hash([k]), 4) != 0)
    states[0][stray] = [1, 1]  # kept on task 0 though it does not hash there
    with pytest.raises(SavepointError, match=rf"state key '{stray}' is on task 0.*restore it with 4 tasks"):
        task_share(enumerate(states), 4, 6, 0, "test")


class _V1:
    state_version = 1


class _V2:
    state_version = 2


class _V2Migrating(_V2):
    def migrate_state(self, key: Any, value: Any, from_version: int) -> Any:
        return value


def test_state_versions_are_checked_before_anything_is_restored(tmp_path: Path) -> None:
    saved = Savepoint.open(_savepoint(tmp_path, _keyed(1)))
    check_state_version(_V1, 1, "ledger", saved)
    check_state_version(_V2Migrating, 1, "ledger", saved)
    with pytest.raises(SavepointError, match="has no migrate_state"):
        check_state_version(_V2, 1, "ledger", saved)
    with pytest.raises(SavepointError, match="saved state_version 2, newer than"):
        check_state_version(_V1, 2, "ledger", saved)


@pytest.mark.parametrize(
    "keys",
    [
        [f"u{i}" for i in range(300)] + ["", "é", "日本語"],
        [*range(-150, 150), 2**40, -(2**40)],
        [0.5 * i for i in range(-50, 50)] + [-0.0],
        [True, False],
        [b"\x00", b"abc", b"abcde"],
        [("a", 1), ("b", 2), ("c", -3)],
        ["mixed", 1, 2.5, None, b"x"],  # one column of many types: hashed one by one
    ],
)
def test_the_split_hashes_each_key_as_the_fields_grouping_routes_it(keys: list[Any]) -> None:
    """Vectorised or one by one, a key's task is pmod(fields_hash(values), tasks), as the workers route tuples."""
    saved = 3
    states: list[dict[Any, Any]] = [{} for _ in range(saved)]
    for i, key in enumerate(keys):
        values = list(key) if isinstance(key, tuple) else [key]
        states[pmod(fields_hash(values), saved)][key] = i
    shares = split_keyed(enumerate(states), saved, 5, "test")
    for j, share in enumerate(shares):
        for key in share:
            values = list(key) if isinstance(key, tuple) else [key]
            assert pmod(fields_hash(values), 5) == j, key
    assert sum(len(s) for s in shares) == len({k for s in states for k in s})
