"""Savepoints with real worker processes: the upgrade (a new bolt version and value format) and rescaling.

The keyed ledger runs as in test_state_exact (the test plays Spark's writer and driver).  A
savepoint is taken through a worker's ``POST /savepoint`` (what ``spark-storm savepoint``
does), the workers stop, and a new topology starts from it; the "query" then goes on from
its own checkpoint: it resends its last batches (which the savepoint holds: replays, dropped)
and new ones.  Every key's committed state must equal the answer over every batch once.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_storm.state.files import EmbeddedBackend
from spark_storm.state.protocol import SAVEPOINT_PRIORITY, Coordinator
from spark_storm.state.savepoint import Savepoint
from tests.integration.ui_support import LedgerUI
from tests.support import wait_until
from tests.support.ledger import ExactRun, expected, ledger_topology, rows_for

pytestmark = pytest.mark.integration


def _topology(
    tmp: Path,
    run: str,
    *,
    tasks: int = 4,
    bolt: str = "",
    savepoint: str | None = None,
    conf: dict[str, Any] | None = None,
) -> Path:
    """The ledger topology in ``tmp/run``, with ``tasks`` ledger tasks, from ``savepoint`` if given."""
    where = tmp / run
    where.mkdir()
    path = ledger_topology(where)
    topo = yaml.safe_load(path.read_text())
    ledger = next(c for c in topo["components"] if c["id"] == "ledger")
    ledger["tasks"] = tasks
    ledger["parallelism"] = min(2, tasks)
    if bolt:
        ledger["bolt"] = bolt
    topo["conf"].update(conf or {})
    if savepoint is not None:
        topo["conf"]["topology.state.savepoint.path"] = savepoint
        topo["conf"]["topology.state.savepoint.restore.id"] = uuid.uuid4().hex
    path.write_text(yaml.safe_dump(topo))
    return path


class Run(ExactRun):
    def __init__(self, path: Path, batches: dict[int, list[list[Any]]]) -> None:
        super().__init__(path, 2)
        self.batches = batches  # one query across the runs: its batches so far
        self.dir = path.parent

    def feed(self, batch: int, n: int = 400) -> None:
        rows = self.batches.get(batch) or rows_for(batch, n)
        self.send(batch, rows)

    def state(self) -> dict[str, Any]:
        """Every ledger task's committed state, merged (a key in two tasks fails)."""
        backend = EmbeddedBackend(self.cluster.topology.name, self.dir / "state")
        out: dict[str, Any] = {}
        for task in self.cluster.plan.component_tasks["ledger"]:
            for key, value in backend.task_store(task).restore()[1].items():
                assert key not in out, f"key {key} is in two tasks' state"
                out[key] = value if isinstance(value, dict) else list(value)
        return out


def _as_v2(answer: dict[str, list[int]]) -> dict[str, dict[str, int]]:
    return {k: {"count": c, "sum": s} for k, (c, s) in answer.items()}


def test_an_upgrade_with_a_new_value_format_continues_exact_from_a_savepoint(tmp_path: Path) -> None:
    batches: dict[int, list[list[Any]]] = {}
    with Run(_topology(tmp_path, "v1"), batches) as run:
        for batch in range(2):
            run.feed(batch)
            run.commit(batch)
        run.feed(2)  # accepted, not committed by the "driver": kill --savepoint commits it first
        taken = run.cluster.savepoint(tmp_path / "savepoints", commit_first=True)
        v1_state = run.state()
    print(f"savepoint {taken['path']} at epoch {taken['epoch']}: {taken['components']}, batches {taken['batches']}")
    saved = Savepoint.open(taken["path"], topology="ledger")
    assert saved.manifest.components["ledger"].tasks == 4
    assert saved.manifest.batches == {"q-ledger": 1}
    # batch 2 is in the state (commit_first's round), its "driver" never committed it: its groups are kept
    assert {k[1] for k in saved.manifest.kept["in"]} == {2}
    assert v1_state == expected(batches)

    bolt = "tests.integration.savepoint_bolts:LedgerBoltV2"
    with Run(_topology(tmp_path, "v2", bolt=bolt, savepoint=taken["path"]), batches) as run:
        assert run.state() == _as_v2(expected(batches))  # migrated at restore, before any input
        run.feed(2)  # the query restarts from its checkpoint: batch 2 again, every group a replay
        run.commit(2)
        run.feed(3)
        result = run.commit(3)
        print(f"after the upgrade: epoch {result.epoch} (savepoint epoch {taken['epoch']})")
        assert result.epoch == taken["epoch"] + 2
        assert run.state() == _as_v2(expected(batches))


def test_a_rollback_by_another_coordinator_between_the_savepoints_round_and_its_copy_is_rolled_back_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The savepoint's own round ends with its COMMIT, which ends its lease on every worker: the
    # driver's (or the interval's) coordinator may PAUSE them for a rollback before the SAVEPOINT
    # comes. That failed a 3-process run's kill --savepoint ("worker ... is dirty (paused for a
    # rollback that has not resumed)"): the savepoint now rolls back with a round and copies then.
    batches: dict[int, list[list[Any]]] = {}
    with Run(_topology(tmp_path, "v1"), batches) as run:
        run.feed(0)
        run.commit(0)
        run.feed(1)
        saver = Coordinator(
            "a savepoint", lambda: {str(s): c for s, c in run.conns.items()}, 60.0, 3, priority=SAVEPOINT_PRIORITY
        )
        own_round = saver._checkpoint
        paused: list[int] = []

        def round_then_a_pause(batch_ids: Any, skip_if_stateless: bool) -> Any:
            result = own_round(batch_ids, skip_if_stateless)
            if not paused:
                paused.append(max(s.generation for s in run.coordinator.status().values()) + 1)
                run.coordinator.pause(paused[0])  # the driver's rollback, half-way: no RESUME from it
            return result

        monkeypatch.setattr(saver, "_checkpoint", round_then_a_pause)
        root, manifest = saver.savepoint(tmp_path / "savepoints", "ledger", "v1", commit_first=True)
        assert paused, "the pause was not injected"
        statuses = run.coordinator.status()
        assert not any(s.dirty for s in statuses.values()), statuses
        assert all(s.generation > paused[0] for s in statuses.values())  # the savepoint's round rolled back
        assert manifest.epoch == max(s.committed for s in statuses.values())
        assert Savepoint.open(str(root), topology="ledger").manifest.epoch == manifest.epoch
        assert run.state() == expected(batches)


def test_keyed_state_rescales_from_four_tasks_to_six_and_then_to_three(tmp_path: Path) -> None:
    batches: dict[int, list[list[Any]]] = {}
    with Run(_topology(tmp_path, "four"), batches) as run:
        for batch in range(2):
            run.feed(batch)
            run.commit(batch)
        first = run.cluster.savepoint(tmp_path / "savepoints")
    assert first["batches"] == {"q-ledger": 1}
    for run_name, tasks in (("six", 6), ("three", 3)):
        with Run(_topology(tmp_path, run_name, tasks=tasks, savepoint=first["path"]), batches) as run:
            assert run.state() == expected(batches)
            run.feed(max(batches))  # the query's restart resends its last batch: a replay, dropped
            run.commit(max(batches))
            run.feed(max(batches) + 1)
            run.commit(max(batches))
            state = run.state()
            print(f"{tasks} tasks: {len(state)} keys, exact: {state == expected(batches)}")
            assert state == expected(batches)
            first = run.cluster.savepoint(tmp_path / "savepoints")


def test_a_ttl_turned_on_for_state_restored_from_a_savepoint_taken_without_one_expires_it(tmp_path: Path) -> None:
    """Quix had to ship a migration for this: old keys have no write time; they get the first barrier's clock."""
    batches: dict[int, list[list[Any]]] = {}
    with Run(_topology(tmp_path, "plain"), batches) as run:
        for batch in range(2):
            run.feed(batch)
            run.commit(batch)
        taken = run.cluster.savepoint(tmp_path / "savepoints")
    ttl = {"topology.state.ttl.ms": 1, "topology.state.ttl.clock": "processing"}
    with Run(_topology(tmp_path, "ttl", savepoint=taken["path"], conf=ttl), batches) as run:
        assert run.state() == expected(batches)  # restored whole: nothing expires before a barrier
        run.commit(1)  # the first barrier: every restored key gets its clock as its write time
        run.feed(2, n=10)  # ten keys written again; the rest were last written a barrier ago
        run.commit(2)
        touched = {key for key, _ in batches[2]}
        answer = expected(batches)
        state = run.state()
        print(f"TTL on after the restore: {len(state)} of {len(answer)} keys left, {len(touched)} written again")
        assert state == {k: answer[k] for k in touched}


def test_the_rest_api_writes_a_savepoint_and_refuses_a_request_without_a_dir(tmp_path: Path) -> None:
    with LedgerUI(tmp_path) as run:
        run.feed_and_commit(0)
        run.feed_and_commit(1)
        wait_until(lambda: run.get("topology/ledger")["actions"]["savepoint"], what="the savepoint action offered")
        answer = _post(run.base, "topology/ledger/savepoint", {"dir": str(tmp_path / "sp")})
        assert answer["topologyOperation"] == "savepoint"
        assert answer["status"] == "success"
        saved = Savepoint.open(answer["path"], topology="ledger")
        assert saved.manifest.epoch == answer["epoch"] == 2
        assert saved.manifest.batches == {"q-ledger": 1}
        merged: dict[str, Any] = {}
        for index in range(4):
            merged.update({k: list(v) for k, v in saved.read_task("ledger", index).items()})
        assert merged == expected(run.batches)
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(run.base, "topology/ledger/savepoint", {})
        assert err.value.code == 400
        assert "wants JSON" in json.loads(err.value.read())["errorMessage"]
        a_file = tmp_path / "a-file"
        a_file.write_text("not a directory")
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(run.base, "topology/ledger/savepoint", {"dir": str(a_file / "under")})
        assert err.value.code == 502
        message = json.loads(err.value.read())["errorMessage"]
        assert "cannot create the savepoint directory" in message, message
        assert "\n" not in message


def _post(base: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{base}/api/v1/{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())
