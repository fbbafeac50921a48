"""``spark-storm demo``: local Spark streaming sentences into a 2-worker wordcount topology.

Everything is embedded: Spark ``local[2]``, a rate source mapped onto a bundled corpus
(no server needed), ``format("storm")`` into a LocalCluster of worker processes running
``split -> count -> report``.  Progress is printed every second; at the end the top words
and the check that every row sent was processed.
"""

from __future__ import annotations

import json
import signal
import tempfile
import time
import urllib.request
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from spark_storm.config import default_config
from spark_storm.spark.session import local_session
from spark_storm.ui import serve_local_ui
from spark_storm.worker.cluster import LocalCluster

__all__ = ["run_demo"]


def _health(cluster: LocalCluster) -> list[dict[str, Any]]:
    out = []
    for slot in cluster.slots:
        hb = cluster.heartbeat(slot) or {}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{hb.get('metrics_port')}/health", timeout=5) as r:
                out.append(json.loads(r.read()))
        except OSError:
            continue
    return out


def _acked(healths: list[dict[str, Any]]) -> tuple[Counter[str], int]:
    """Tuples acked per component (ticks are never acked) and the total queue depth."""
    per: Counter[str] = Counter()
    depth = 0
    for h in healths:
        for ex in h["executors"].values():
            per[ex["component"]] += sum(t["acked"] for t in ex["tasks"].values())
            depth += ex["queue"]["population"]
        depth += h["transfer_queue"]["population"]
    return per, depth


def _stop_between_batches(query: Any, timeout: float = 30.0) -> None:
    """Stop when no micro-batch is running, so every batch sent is also reported by Spark."""
    deadline = time.monotonic() + timeout
    while query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.01)
    query.stop()


def _drained(cluster: LocalCluster, sent: int, timeout: float = 60.0) -> int:
    """Wait until every queue is empty and the entry bolts acked ``sent`` tuples (or timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        per, depth = _acked(_health(cluster))
        if (depth == 0 and per["sentences"] >= sent) or time.monotonic() > deadline:
            return per["sentences"]
        time.sleep(0.2)


def run_demo(seconds: float, rows_per_second: int, workers: int = 2) -> int:
    """Run the demo; return 0 when every sentence sent was processed."""
    work = Path(tempfile.mkdtemp(prefix="spark-storm-demo-"))
    corpus = resources.files("spark_storm.examples").joinpath("corpus.txt").read_text(encoding="utf-8").splitlines()
    topo = yaml.safe_load(resources.files("spark_storm.examples").joinpath("wordcount.yaml").read_text())
    for comp in topo["components"]:
        if comp["id"] == "report":
            comp.setdefault("conf", {})["report.dir"] = str(work / "report")
    topo_path = work / "wordcount.yaml"
    topo_path.write_text(yaml.safe_dump(topo))
    print(f"starting {workers} workers of the wordcount topology ...", flush=True)
    cluster = LocalCluster(str(topo_path), workers)
    ui = serve_local_ui(cluster.heartbeat_dir, default_config(), any_port_if_busy=True)
    cluster.start()
    print(cluster.plan.describe(), flush=True)
    print(f"UI: {ui.url}topology.html?id={cluster.topology.name}  (live while the demo runs)", flush=True)
    print("starting Spark (local[2]) ...", flush=True)
    spark = local_session("spark-storm-demo", master="local[2,4]")
    from pyspark.sql import functions as F

    sentences = F.array(*[F.lit(s) for s in corpus])
    df = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rows_per_second)
        .load()
        .select(F.element_at(sentences, (F.col("value") % len(corpus) + 1).cast("int")).alias("sentence"))
    )
    query = (
        df.writeStream.format("storm")
        .option("topology", str(topo_path))
        .option("workers", cluster.workers_arg)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )
    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__("now", True))
    started = time.monotonic()
    last: tuple[float, Counter[str]] = (started, Counter())
    try:
        # Stream for `seconds`, and at least until one micro-batch with data went through
        # (Spark's first batch waits for its JVM and Python workers to start).
        while not stop["now"] and (
            time.monotonic() - started < seconds
            or (not any(p["numInputRows"] for p in query.recentProgress) and time.monotonic() - started < seconds + 120)
        ):
            time.sleep(1.0)
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            sent = sum(p["numInputRows"] for p in query.recentProgress)
            per, depth = _acked(_health(cluster))
            now = time.monotonic()
            rates = {c: (per[c] - last[1][c]) / (now - last[0]) for c in ("sentences", "split", "count", "report")}
            last = (now, per)
            print(
                f"t={now - started:5.1f}s  sent {sent:>8,} rows  | tuples/s  sentences {rates['sentences']:>8,.0f}"
                f"  split {rates['split']:>8,.0f}  count {rates['count']:>8,.0f}  report {rates['report']:>8,.0f}"
                f"  | queue depth {depth:>6,}",
                flush=True,
            )
    finally:
        print("stopping the query between two micro-batches ...", flush=True)
        _stop_between_batches(query)
        sent = sum(p["numInputRows"] for p in query.recentProgress)
        spark.stop()
        print("letting the workers drain what they accepted ...", flush=True)
        processed = _drained(cluster, sent)
        codes = cluster.stop()
        ui.close()
    final: Counter[str] = Counter()
    for path in (work / "report").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "final" in rec:
                final.update(rec["final"])
    print("\ntop words:")
    for word, count in final.most_common(12):
        print(f"  {word:12s} {count:>8,}")
    words = sum(final.values())
    print(f"\nsentences sent by Spark: {sent:,}; processed by the topology: {processed:,}; words counted: {words:,}")
    ok = sent == processed and all(c == 0 for c in codes.values())
    print("sent == processed: OK" if ok else "sent != processed: MISMATCH (see the worker logs in " + str(work) + ")")
    return 0 if ok else 1
