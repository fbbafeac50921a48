"""What the worker adds on top of the transport, as ratios measured in one run.

Sides (best of --rounds; the client process sends, worker processes on loopback):

* transport: raw tcp TaskMessages of 100 bytes into a counting server process
  (bench/transport.py) — the baseline of every ratio;
* 1 worker: 100-byte msgpack tuples (one per message, as Storm sends them) to a source
  task whose bolt is a no-op tuple bolt (decode, queue, ``execute``, ack);
* 2w 3 stages: source (pass-through, shuffle) -> mid (pass-through, fields) -> sink
  (no-op), spread over two worker processes, so most tuples cross the network twice;
* 1 worker, batch: the same 100-byte rows as Arrow IPC payloads of --rows-per-message
  rows (what the Spark writer sends) into a no-op *batch* bolt — rows, not messages;
* wordcount arrow 2w: the columnar wordcount (conf/topologies/wordcount-arrow.yaml) over
  two workers fed Arrow sentence batches from the bundled corpus: words counted per second.

Throughput is rows (tuples) sent by the client / time until the last component executed
them all (read from the workers' /health endpoints).  Also printed: each side's rate per
worker process, and the executes per second per process of the 3-stage side (three
``execute`` calls per source tuple).

    python -m bench.worker [--messages 200000] [--rows 4000000] [--rounds 2] [--set KEY=VALUE] [--sides ...]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import yaml

from bench.transport import SIDES, run_transport
from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.codec.payloads import arrow_payload
from spark_storm.messaging import TaskMessage
from spark_storm.topology import Slot
from spark_storm.transport import make_context

NOOP = "spark_storm.examples.noop:NoopBolt"
NOOP_BATCH = "spark_storm.examples.noop:NoopBatchBolt"
PASS = "spark_storm.worker.bolt:PassThroughBolt"

ONE_STAGE = {
    "name": "bench1",
    "components": [{"id": "in", "source": True, "bolt": NOOP, "fields": ["v"]}],
}
ONE_STAGE_BATCH = {
    "name": "bench1b",
    "components": [{"id": "in", "source": True, "bolt": NOOP_BATCH, "fields": ["v"]}],
}
THREE_STAGES = {
    "name": "bench3",
    "components": [
        {"id": "in", "source": True, "bolt": PASS, "fields": ["v"], "parallelism": 2},
        {"id": "mid", "bolt": PASS, "fields": ["v"], "parallelism": 2, "inputs": [{"from": "in"}]},
        {
            "id": "sink",
            "bolt": NOOP,
            "parallelism": 2,
            "inputs": [{"from": "mid", "grouping": "fields", "fields": ["v"]}],
        },
    ],
}


def executed(cluster: LocalCluster, component: str) -> int:
    """Tuples (rows) the tasks of ``component`` executed, over every worker (from /health)."""
    total = 0
    for slot in cluster.slots:
        for ex in cluster.health(slot)["executors"].values():
            if ex["component"] == component:
                total += sum(t["executed"] for t in ex["tasks"].values())
    return total


def run_topology(
    topo: dict[str, Any],
    workers: int,
    sink: str,
    total: int,
    make: Callable[[list[int]], list[tuple[int, bytes]]],
    repeat: int,
    overrides: dict[str, Any] | None = None,
) -> float:
    """Send ``repeat`` times the messages ``make(source tasks)`` builds; seconds until ``sink`` executed ``total``."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    cluster = LocalCluster(str(path), workers, overrides=overrides).start()
    ctx = make_context({"storm.messaging.transport": "tcp"})
    try:
        sources = list(cluster.plan.component_tasks[next(c["id"] for c in topo["components"] if c.get("source"))])
        conns = {s: ctx.connect(topo["name"], s.host, s.port) for s in cluster.slots}
        for c in conns.values():
            c.wait_ready(30)
        msgs: dict[Slot, list[TaskMessage]] = {}
        for task, payload in make(sources):
            msgs.setdefault(cluster.plan.task_slot[task], []).append(TaskMessage(task, payload))
        t0 = time.perf_counter()
        for _ in range(repeat):
            for slot, chunk in msgs.items():
                conns[slot].send(chunk)
        while executed(cluster, sink) < total:
            time.sleep(0.02)
        return time.perf_counter() - t0
    finally:
        ctx.term()
        cluster.stop()


def _tuples(batch: int) -> Callable[[list[int]], list[tuple[int, bytes]]]:
    def make(sources: list[int]) -> list[tuple[int, bytes]]:
        # ~100-byte tuples, spread over the source tasks (values differ, for fields grouping)
        return [(sources[i % len(sources)], msgpack.packb([f"{i:06d}" + "x" * 91])) for i in range(batch)]

    return make


def _arrow_rows(rows_per_message: int, messages: int) -> Callable[[list[int]], list[tuple[int, bytes]]]:
    def make(sources: list[int]) -> list[tuple[int, bytes]]:
        data = pa.record_batch({"v": [f"{i:06d}" + "x" * 91 for i in range(rows_per_message)]})
        payload = arrow_payload(data)
        return [(sources[i % len(sources)], payload) for i in range(messages)]

    return make


def _wordcount_topology() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(
        resources.files("spark_storm.examples").joinpath("wordcount-arrow.yaml").read_text()
    )
    spec["name"] = "bench-wordcount"
    # each run counts from empty state: the host's shared state dir would restore the last run's
    # counts and replay what it left uncommitted, so a round would time a recovery
    spec.setdefault("conf", {})["topology.state.provider.config"] = {"dir": tempfile.mkdtemp(prefix="bench-state-")}
    for comp in spec["components"]:
        if comp["id"] == "report":
            comp["conf"]["report.dir"] = tempfile.mkdtemp(prefix="bench-report-")
    return spec


def _sentences(rows_per_message: int) -> tuple[Callable[[list[int]], list[tuple[int, bytes]]], int]:
    corpus = resources.files("spark_storm.examples").joinpath("corpus.txt").read_text().splitlines()
    lines = [corpus[i % len(corpus)] for i in range(rows_per_message)]
    words = sum(len(re.findall(r"[\w']+", s.lower())) for s in lines)
    payload = arrow_payload(pa.record_batch({"sentence": lines}))

    def make(sources: list[int]) -> list[tuple[int, bytes]]:
        return [(sources[i % len(sources)], payload) for i in range(4)]

    return make, words * 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000, help="tuples of the tuple sides")
    parser.add_argument("--rows", type=int, default=4_000_000, help="rows of the batch side")
    parser.add_argument("--words", type=int, default=4_000_000, help="about this many words for the wordcount side")
    parser.add_argument("--batch", type=int, default=1000, help="messages per send of the tuple sides")
    parser.add_argument("--rows-per-message", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a worker setting")
    parser.add_argument("--sides", help="comma-separated sides to run (default: all)")
    args = parser.parse_args(argv)
    ov = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.set)}
    n = args.messages - args.messages % args.batch
    per_msg = args.rows_per_message
    batch_messages = 16
    batch_repeat = max(1, args.rows // (per_msg * batch_messages))
    rows = per_msg * batch_messages * batch_repeat
    make_sentences, words_per_round = _sentences(per_msg)
    wc_repeat = max(1, args.words // words_per_round)
    words = words_per_round * wc_repeat
    sides: dict[str, tuple[Callable[[], float], int, int]] = {
        "transport": (lambda: run_transport(SIDES["tcp"], n, args.batch), n, 1),
        "1 worker": (lambda: run_topology(ONE_STAGE, 1, "in", n, _tuples(args.batch), n // args.batch, ov), n, 1),
        "2w 3 stages": (
            lambda: run_topology(THREE_STAGES, 2, "sink", n, _tuples(args.batch), n // args.batch, ov),
            n,
            2,
        ),
        "1 worker, batch": (
            lambda: run_topology(
                ONE_STAGE_BATCH, 1, "in", rows, _arrow_rows(per_msg, batch_messages), batch_repeat, ov
            ),
            rows,
            1,
        ),
        "wordcount arrow 2w": (
            lambda: run_topology(_wordcount_topology(), 2, "count", words, make_sentences, wc_repeat, ov),
            words,
            2,
        ),
    }
    if args.sides:
        wanted = {"transport", *(s.strip() for s in args.sides.split(","))}
        sides = {k: v for k, v in sides.items() if k in wanted}
    best: dict[str, float] = {}
    for r in range(args.rounds):
        for name, (fn, count, _) in sides.items():
            secs = fn()
            best[name] = min(best.get(name, float("inf")), secs)
            print(f"round {r + 1}: {name:20s} {count / secs:14,.0f} /s", file=sys.stderr, flush=True)
    base = n / best["transport"]
    print(f"\n{n:,} tuples of ~100 bytes (batches of {args.batch}); {rows:,} rows of ~100 bytes in Arrow payloads")
    if ov:
        print("worker settings: " + ", ".join(f"{k}={v}" for k, v in ov.items()))
    print(f"of {per_msg} rows; {words:,} words; best of {args.rounds} rounds")
    print(f"{'side':20s} {'rows/s':>14s} {'per process':>14s} {'vs transport':>13s}")
    for name, (_, count, procs) in sides.items():
        rate = count / best[name]
        print(f"{name:20s} {rate:14,.0f} {rate / procs:14,.0f} {rate / base:12.0%}")
    if "2w 3 stages" in best:
        three = n / best["2w 3 stages"]
        print(f"\n2w 3 stages: {3 * three / 2:,.0f} bolt executes per second per worker process")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
