"""What a savepoint of 1 M keys costs (issue 27's targets: written in <= 2 s, restored in <= 2 s).

The state: ``--keys`` keys (str keys, ``[count, sum]`` values: the ledger's) over ``--tasks``
tasks of one component, committed in the embedded backend (files) as the workers leave it:
a full snapshot, then ``--deltas`` delta epochs each changing 1 % of the keys.  Then, best
of ``--rounds``:

* **write**: what the workers do for ``spark-storm savepoint`` (their SAVEPOINT answer):
  each task's entries from its last full snapshot up to the committed epoch copied into
  the savepoint (:func:`~spark_storm.state.savepoint.write_task`), then the manifest;
* **restore**: what a topology started ``--from-savepoint`` does before its first tuple:
  the savepoint opened and checked whole (every file's size and CRC-32), each task reset
  from it by the workers' :class:`~spark_storm.worker.checkpoint.seed.Seeder` (same task
  count: entries copied byte for byte), and each task's state read back into memory as its
  executor does at start (``TaskStore.restore``);
* **rescale**: the same restore onto ``--rescale`` tasks (every key rehashed to its new
  task), for reference: the issue sets no target for it.

Beside each: the floor, copying the same files with ``shutil.copyfile``, and decoding the
entries alone, so the ratio says what the savepoint's own work adds.

    python -m bench.savepoint [--keys 1000000] [--tasks 4] [--deltas 3] [--rounds 3] [--rescale 6]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_storm.state.files import EmbeddedBackend
from spark_storm.state.savepoint import ComponentManifest, Manifest, Savepoint, write_manifest, write_task
from spark_storm.topology import Slot, plan
from spark_storm.topology.hashing import fields_hash, pmod
from spark_storm.topology.loader import topology_from_dict
from spark_storm.topology.restore import plan_restore
from spark_storm.worker.checkpoint.seed import Seeder

NAME = "ledger"


def _topology(tasks: int) -> Any:
    return topology_from_dict(
        {
            "name": NAME,
            "components": [
                {"id": "in", "source": True, "fields": ["key", "n"]},
                {
                    "id": "ledger",
                    "bolt": "tests.integration.bolts:LedgerBolt",
                    "tasks": tasks,
                    "inputs": [{"from": "in", "grouping": "fields", "fields": ["key"]}],
                },
            ],
        },
        origin="bench",
    )


def _fill(root: Path, keys: int, tasks: int, deltas: int) -> tuple[EmbeddedBackend, list[int], int]:
    """Commit ``keys`` keys over ``tasks`` tasks (a full entry, ``deltas`` deltas); return backend, tasks, epoch."""
    topo = _topology(tasks)
    the_plan = plan(topo, [Slot("127.0.0.1", 1)])
    task_ids = list(the_plan.component_tasks["ledger"])
    backend = EmbeddedBackend(NAME, root)
    shares: list[dict[Any, Any]] = [{} for _ in task_ids]
    for i in range(keys):
        key = f"user{i:08d}"
        shares[pmod(fields_hash([key]), tasks)][key] = [i % 97, i]
    epoch = 1 + deltas
    for index, task in enumerate(task_ids):
        store = backend.task_store(task)
        store.write(1, True, shares[index])
        items = list(shares[index].items())
        for d in range(deltas):
            step = items[d::100]
            store.write(2 + d, False, {k: [v[0] + 1, v[1] + d] for k, v in step})
        store.commit(epoch)
    return backend, task_ids, epoch


def _best(rounds: int, run: Callable[[int], float]) -> float:
    return min(run(r) for r in range(rounds))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--deltas", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rescale", type=int, default=6)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-savepoint-"))
    try:
        started = time.perf_counter()
        backend, task_ids, epoch = _fill(work / "state", args.keys, args.tasks, args.deltas)
        print(
            f"state: {args.keys:,} keys over {args.tasks} tasks, committed at epoch {epoch} "
            f"(a full entry and {args.deltas} deltas per task; made in {time.perf_counter() - started:.1f}s); "
            f"load {os.getloadavg()[0]:.2f}"
        )
        sizes = sum(p.stat().st_size for p in (work / "state").rglob("e*.*"))
        print(f"entries on disk: {sizes / 1e6:.1f} MB")

        def write(r: int) -> float:
            root = work / f"sp{r}"
            t0 = time.perf_counter()
            files: dict[str, tuple[int, int]] = {}
            for index, task in enumerate(task_ids):
                files.update(write_task(root, "ledger", index, backend.task_store(task), epoch))
            manifest = Manifest(
                f"bench{r}",
                NAME,
                "bench",
                epoch,
                time.time(),
                {},
                {},
                {"ledger": ComponentManifest(len(task_ids))},
                files,
            )
            write_manifest(root, manifest)
            return time.perf_counter() - t0

        def copy_floor(r: int) -> float:
            target = work / f"copy{r}"
            target.mkdir()
            t0 = time.perf_counter()
            for path in (work / "state").rglob("e*.*"):
                shutil.copyfile(path, target / f"{path.parent.name}-{path.name}")
            return time.perf_counter() - t0

        wrote = _best(args.rounds, write)
        floor = _best(args.rounds, copy_floor)
        print(f"write:   {wrote:.2f}s (target <= 2 s); copying the same files: {floor:.2f}s (x{wrote / floor:.1f})")

        def restore(tasks: int) -> Callable[[int], float]:
            def run(r: int) -> float:
                target = EmbeddedBackend(NAME, work / f"restored-{tasks}-{r}")
                topo = _topology(tasks)
                the_plan = plan(topo, [Slot("127.0.0.1", 1)])
                t0 = time.perf_counter()
                saved = Savepoint.open(work / "sp0", topology=NAME)
                restore_plan = plan_restore(saved, topo, lambda cid: cid == "ledger", f"restore{r}")
                seeder = Seeder(the_plan, restore_plan)
                total = 0
                for task in the_plan.component_tasks["ledger"]:
                    store = target.task_store(task)
                    seeder.seed_task(task, store)
                    total += len(store.restore()[1])
                elapsed = time.perf_counter() - t0
                assert total == args.keys, (total, args.keys)
                return elapsed

            return run

        def decode_floor(r: int) -> float:
            t0 = time.perf_counter()
            for task in task_ids:
                backend.task_store(task).restore()
            return time.perf_counter() - t0

        restored = _best(args.rounds, restore(args.tasks))
        decoded = _best(args.rounds, decode_floor)
        print(
            f"restore: {restored:.2f}s (target <= 2 s: checked, copied, read back); "
            f"reading the state back alone: {decoded:.2f}s (x{restored / decoded:.1f})"
        )
        if args.rescale:
            rescaled = _best(1, restore(args.rescale))
            print(f"rescale: {rescaled:.2f}s onto {args.rescale} tasks (every key rehashed; no target)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
