"""Multilang and pystorm bolts through one worker, as ratios to a native bolt in the same run.

Sides (best of --rounds; a client process sends ~100-byte tuples to a source task; the
source passes them to component ``b``, whose emits go to a no-op sink; one worker process):

* native: ``b`` is a spark-storm Bolt (emit anchored, ack) — the baseline;
* pystorm in-process: ``b`` is the same bolt written for pystorm/streamparse, run inside
  the worker by the in-process adapter (no child);
* pystorm child json / msgpack: the same pystorm bolt as a multilang child
  (``python bench/multilang_bolts.py [--serializer msgpack]``), Storm's ShellBolt protocol;
* storm.py child: Storm's own ``storm.py`` BasicBolt doing the same (``need_task_ids``
  round trips on every emit), when scripts/fetch-jars got Storm's multilang jars.

Throughput is tuples sent / time until the sink executed them all.  Where the time goes:
CPU seconds of the worker process and of its children over each side (``/proc``), per tuple.

    python -m bench.multilang [--messages 100000] [--rounds 2] [--parallelism 1] [--sides ...] [--set KEY=VALUE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import msgpack
import yaml

from bench.worker import executed
from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.messaging import TaskMessage
from spark_storm.transport import make_context

ROOT = Path(__file__).resolve().parents[1]
CHILD = str(ROOT / "bench" / "multilang_bolts.py")
NOOP = "spark_storm.examples.noop:NoopBolt"
PASS = "spark_storm.worker.bolt:PassThroughBolt"
_CLK = os.sysconf("SC_CLK_TCK")

STORM_PY_BOLT = """\
import storm


class Echo(storm.BasicBolt):
    def process(self, tup):
        storm.emit(tup.values)


Echo().run()
"""


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK
    except (OSError, IndexError, ValueError):
        return 0.0


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _topology(kind: str, parallelism: int, workdir: Path) -> dict[str, Any]:
    b: dict[str, Any] = {"id": "b", "fields": ["v"], "parallelism": parallelism, "inputs": [{"from": "in"}]}
    conf: dict[str, Any] = {}
    if kind == "native":
        b["bolt"] = "bench.multilang_bolts:NativeEcho"
    elif kind == "pystorm in-process":
        b["bolt"] = "bench.multilang_bolts:PystormEcho"
    elif kind.startswith("pystorm child"):
        serializer = kind.rsplit(" ", 1)[1]
        b["shell"] = [sys.executable, CHILD, "--serializer", serializer]
        conf["topology.multilang.serializer"] = serializer
    else:  # storm.py
        b["shell"] = [sys.executable, str(workdir / "echo_storm.py")]
    return {
        "name": "bench-ml",
        "conf": conf,
        "components": [
            {"id": "in", "source": True, "bolt": PASS, "fields": ["v"]},
            b,
            {"id": "out", "bolt": NOOP, "inputs": [{"from": "b"}]},
        ],
    }


def run_side(kind: str, n: int, batch: int, parallelism: int, overrides: dict[str, Any]) -> tuple[float, float, float]:
    """Return (seconds, worker CPU s, children CPU s) to get ``n`` tuples through ``b`` into the sink."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-multilang-"))
    if kind == "storm.py child":
        jar = next((ROOT / "jars" / "multilang").glob("multilang-python-*.jar"))
        with zipfile.ZipFile(jar) as z:
            (tmp / "storm.py").write_bytes(z.read("resources/storm.py"))
        (tmp / "echo_storm.py").write_text(STORM_PY_BOLT)
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(_topology(kind, parallelism, tmp)))
    env_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + env_path if env_path else "")
    cluster = LocalCluster(str(path), 1, overrides=overrides).start()
    ctx = make_context({"storm.messaging.transport": "tcp"})
    try:
        slot = cluster.slots[0]
        heartbeat = cluster.heartbeat(slot)
        assert heartbeat is not None
        pid = int(heartbeat["pid"])
        task = cluster.plan.component_tasks["in"][0]
        conn = ctx.connect("bench-ml", slot.host, slot.port)
        conn.wait_ready(30)
        chunk = [TaskMessage(task, msgpack.packb([f"{i:06d}" + "x" * 91])) for i in range(batch)]
        kids = _children(pid)
        cpu0, kid0 = _cpu(pid), sum(_cpu(k) for k in kids)
        t0 = time.perf_counter()
        for _ in range(n // batch):
            conn.send(chunk)
        while executed(cluster, "out") < n:
            time.sleep(0.02)
        secs = time.perf_counter() - t0
        return secs, _cpu(pid) - cpu0, sum(_cpu(k) for k in kids) - kid0
    finally:
        if env_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_path
        ctx.term()
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000, help="messages per send")
    parser.add_argument("--parallelism", type=int, default=1, help="tasks (children) of the bolt")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a worker setting")
    parser.add_argument("--sides", help="comma-separated sides (default: all)")
    args = parser.parse_args(argv)
    ov = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.set)}
    n = args.messages - args.messages % args.batch
    sides = ["native", "pystorm in-process", "pystorm child json", "pystorm child msgpack", "storm.py child"]
    if not list((ROOT / "jars" / "multilang").glob("multilang-python-*.jar")):
        sides.remove("storm.py child")
        print("(no storm.py side: scripts/fetch-jars gets Storm's multilang jars)", file=sys.stderr)
    if args.sides:
        wanted = {"native", *(s.strip() for s in args.sides.split(","))}
        sides = [s for s in sides if s in wanted]
    best: dict[str, tuple[float, float, float]] = {}
    for r in range(args.rounds):
        for side in sides:
            count = n if side != "storm.py child" else max(args.batch, n // 10)
            secs, cpu, kids = run_side(side, count, args.batch, args.parallelism, ov)
            if side not in best or secs / count < best[side][0]:
                best[side] = (secs / count, cpu / count, kids / count)
            print(f"round {r + 1}: {side:22s} {count / secs:12,.0f} tuples/s", file=sys.stderr, flush=True)
    base = 1 / best["native"][0]
    print(f"\n{n:,} tuples of ~100 bytes through one worker; bolt parallelism {args.parallelism}", end="")
    print(f"; best of {args.rounds} rounds")
    if ov:
        print("worker settings: " + ", ".join(f"{k}={v}" for k, v in ov.items()))
    print(f"{'side':22s} {'tuples/s':>12s} {'vs native':>10s} {'worker us/tuple':>16s} {'children us/tuple':>18s}")
    for side, (per, cpu, kids) in best.items():
        print(f"{side:22s} {1 / per:12,.0f} {1 / per / base:9.0%} {cpu * 1e6:16.1f} {kids * 1e6:18.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
