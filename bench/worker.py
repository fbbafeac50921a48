"""What the worker adds on top of the transport, as ratios measured in one run.

Sides (100-byte tuples, batches of 1000, best of --rounds):

* transport: raw tcp TaskMessages into a counting server process (bench/transport.py);
* 1 worker: the same messages to a source task whose bolt is a no-op (deserialize,
  queue, execute, ack);
* 2 workers, 3 stages: source (pass-through, shuffle) -> mid (pass-through, fields) ->
  sink (no-op), spread over two worker processes, so most tuples cross the network twice.

Throughput is messages sent by the client / time until every sink task executed them
(read from the workers' /health endpoints).

    python -m bench.worker [--messages 200000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import yaml

from bench.transport import SIDES, run_transport
from spark_storm.messaging import TaskMessage
from spark_storm.topology import Slot
from spark_storm.transport import make_context
from spark_storm.worker.cluster import LocalCluster

NOOP = "spark_storm.examples.noop:NoopBolt"
PASS = "spark_storm.worker.bolt:PassThroughBolt"

ONE_STAGE = {
    "name": "bench1",
    "components": [{"id": "in", "source": True, "bolt": NOOP, "fields": ["v"]}],
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


def _executed(cluster: LocalCluster, component: str) -> int:
    total = 0
    for slot in cluster.slots:
        hb = cluster.heartbeat(slot) or {}
        with urllib.request.urlopen(f"http://127.0.0.1:{hb['metrics_port']}/health", timeout=10) as r:
            health = json.loads(r.read())
        for ex in health["executors"].values():
            if ex["component"] == component:
                total += sum(t["executed"] for t in ex["tasks"].values())
    return total


def run_topology(topo: dict[str, Any], workers: int, sink: str, n: int, batch: int) -> float:
    tmp = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    cluster = LocalCluster(str(path), workers).start()
    ctx = make_context({"storm.messaging.transport": "tcp"})
    try:
        sources = list(cluster.plan.component_tasks["in"])
        conns = {s: ctx.connect(topo["name"], s.host, s.port) for s in cluster.slots}
        for c in conns.values():
            c.wait_ready(30)
        # ~100-byte tuples, spread over the source tasks (values differ, for fields grouping)
        msgs: dict[Slot, list[TaskMessage]] = {}
        for i in range(batch):
            task = sources[i % len(sources)]
            payload = msgpack.packb([f"{i:06d}" + "x" * 91])
            msgs.setdefault(cluster.plan.task_slot[task], []).append(TaskMessage(task, payload))
        t0 = time.perf_counter()
        for _ in range(n // batch):
            for slot, chunk in msgs.items():
                conns[slot].send(chunk)
        while _executed(cluster, sink) < n:
            time.sleep(0.05)
        return time.perf_counter() - t0
    finally:
        ctx.term()
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    n = args.messages - args.messages % args.batch
    best: dict[str, float] = {}
    sides: dict[str, Callable[[], float]] = {
        "transport": lambda: run_transport(SIDES["tcp"], n, args.batch),
        "1 worker": lambda: run_topology(ONE_STAGE, 1, "in", n, args.batch),
        "2w 3 stages": lambda: run_topology(THREE_STAGES, 2, "sink", n, args.batch),
    }
    for r in range(args.rounds):
        for name, fn in sides.items():
            secs = fn()
            best[name] = min(best.get(name, float("inf")), secs)
            print(f"round {r + 1}: {name:12s} {n / secs:12,.0f} msg/s", file=sys.stderr, flush=True)
    base = n / best["transport"]
    print(f"\n{n:,} tuples of ~100 bytes, batches of {args.batch}, best of {args.rounds} rounds")
    print(f"{'side':13s} {'msg/s':>12s} {'vs transport':>13s}")
    for name in sides:
        rate = n / best[name]
        print(f"{name:13s} {rate:12,.0f} {rate / base:12.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
