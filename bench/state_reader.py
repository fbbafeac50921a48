"""What ``spark.read.format("storm_state")`` costs on a savepoint of 1 M keys (issue 27: <= 5 s in ``local[2]``).

The savepoint: ``--keys`` keys (str keys, ``[count, sum]`` values: the ledger's) over
``--tasks`` tasks of one component, committed in the embedded backend as the workers leave
it (a full snapshot, then ``--deltas`` delta epochs each changing 1 % of the keys), and
copied into a savepoint with :func:`~spark_storm.state.savepoint.write_task` (no workers).

Then, in a ``local[2]`` session started beforehand (its start is not counted), ``--rounds``
times: the read planned (the driver samples the values to infer the types) and counted
(every task's entries decoded into Arrow batches on the executors), and the same read
collected to the driver as Arrow (``toArrow``).  The figure is absolute seconds, not a
ratio; beside it, the floor: the same tasks restored into dicts in this one process.

The machine is shared: before timing, the bench waits (60 s steps, up to ``--max-wait``)
for the 1-minute load average to fall to ``--load`` or below, and prints the load it ran at.

    python -m bench.state_reader [--keys 1000000] [--tasks 4] [--deltas 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from spark_storm.state.files import EmbeddedBackend
from spark_storm.state.savepoint import ComponentManifest, Manifest, Savepoint, write_manifest, write_task

TARGET_S = 5.0


def build(root: Path, keys: int, tasks: int, deltas: int) -> Path:
    """Write the savepoint (see the module doc) under ``root``; return its directory."""
    backend = EmbeddedBackend("ledger", root / "state")
    target = root / "savepoint"
    target.mkdir()
    files: dict[str, tuple[int, int]] = {}
    epoch = 1 + deltas
    for index in range(tasks):
        store = backend.task_store(index + 1)
        mine = {f"user-{k}": [k % 97, k] for k in range(index, keys, tasks)}
        store.write(1, True, mine)
        names = list(mine)
        for d in range(deltas):
            store.write(2 + d, False, {k: [d, d] for k in names[d::100]})
        store.commit(epoch)
        files.update(write_task(target, "ledger", index, store, epoch))
    components = {"ledger": ComponentManifest(tasks)}
    manifest = Manifest("bench", "ledger", "v1", epoch, time.time(), {}, {}, components, files)
    write_manifest(target, manifest)
    return target


def load_average() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def wait_for_load(limit: float, max_wait: float) -> float:
    """Wait (60 s steps, up to ``max_wait`` s) for the load to fall to ``limit``; return the load then."""
    waited = 0.0
    load = load_average()
    while load > limit and waited < max_wait:
        print(f"load {load:.2f} > {limit}: waiting 60 s ({waited:.0f}/{max_wait:.0f} s waited)", flush=True)
        time.sleep(60)
        waited += 60
        load = load_average()
    return load


def main(argv: list[str] | None = None) -> None:
    """Run the bench (see the module doc)."""
    parser = argparse.ArgumentParser(prog="python -m bench.state_reader", description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--deltas", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=float, default=1.5, help="wait until the 1-minute load is at most this")
    parser.add_argument("--max-wait", type=float, default=900.0, help="seconds to wait for the load at most")
    args = parser.parse_args(argv)

    from spark_storm.spark import register
    from spark_storm.spark.session import local_session

    with tempfile.TemporaryDirectory(prefix="bench-state-reader-") as tmp:
        started = time.perf_counter()
        path = build(Path(tmp), args.keys, args.tasks, args.deltas)
        print(f"savepoint of {args.keys} keys over {args.tasks} tasks written in {time.perf_counter() - started:.2f} s")
        spark = local_session("bench-state-reader", "local[2]", quiet=True)
        register(spark, check=False)
        try:
            warm = spark.read.format("storm_state").option("path", str(path)).load()
            assert warm.count() == args.keys  # Spark's Python workers started, the files in the page cache
            load = wait_for_load(args.load, args.max_wait)
            print(f"uptime: {os.popen('uptime').read().strip()}")
            counts, arrows = [], []
            for _ in range(args.rounds):
                t = time.perf_counter()
                n = spark.read.format("storm_state").option("path", str(path)).load().count()
                counts.append(time.perf_counter() - t)
                assert n == args.keys, n
                t = time.perf_counter()
                table = spark.read.format("storm_state").option("path", str(path)).load().toArrow()
                arrows.append(time.perf_counter() - t)
                assert table.num_rows == args.keys, table.num_rows
            saved = Savepoint.open(path)
            t = time.perf_counter()
            floor = sum(len(saved.read_task("ledger", i)) for i in range(args.tasks))
            floor_s = time.perf_counter() - t
            assert floor == args.keys
        finally:
            spark.stop()
    status = "met" if min(counts) <= TARGET_S and min(arrows) <= TARGET_S else "NOT met"
    print(
        f"storm_state read of {args.keys} keys in local[2] (load {load:.2f} at the start, "
        f"{load_average():.2f} at the end): count best {min(counts):.2f} s "
        f"(rounds {', '.join(f'{s:.2f}' for s in counts)}), toArrow best {min(arrows):.2f} s "
        f"(rounds {', '.join(f'{s:.2f}' for s in arrows)}); target <= {TARGET_S:.0f} s: {status}. "
        f"Floor: the same tasks restored in one process {floor_s:.2f} s"
    )


if __name__ == "__main__":
    main()
