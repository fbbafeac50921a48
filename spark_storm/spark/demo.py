"""``spark-storm demo``: local Spark streaming sentences into a 2-worker wordcount topology.

Everything is embedded: Spark ``local[2]``, a rate source mapped onto a bundled corpus
(no server needed), ``format("storm")`` into a LocalCluster of worker processes running
``split -> count -> report`` — tuple bolts by default, the columnar (batch-bolt) wordcount
with ``--arrow``.  Progress is printed every second: rows Spark sent (counted from every
micro-batch by a query listener), tuples per second per bolt, queue depth and whether
Spark's micro-batches keep up with the trigger.  At the end: the top words and the check
that every row sent was processed.  Spark's own console output (progress bar, INFO/WARN
log) is off unless ``--verbose``.
"""

from __future__ import annotations

import json
import signal
import tempfile
import threading
import time
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pyspark.sql.streaming.listener import StreamingQueryListener

from spark_storm.config import default_config
from spark_storm.errors import StormError
from spark_storm.reports import WorkerMetrics
from spark_storm.spark.session import local_session
from spark_storm.ui import serve_local_ui
from spark_storm.worker.local_cluster import LocalCluster

__all__ = ["ARROW_RATE", "TUPLE_RATE", "run_demo"]

#: Default rows per second: what the tuple wordcount keeps up with on a 2-core machine,
#: and 20 times that for the columnar one.
TUPLE_RATE = 2000
ARROW_RATE = 20 * TUPLE_RATE
TRIGGER_S = 1.0


class _Sent(StreamingQueryListener):
    """Counts the rows of every micro-batch of one query (``recentProgress`` keeps only 100)."""

    def __init__(self) -> None:
        self.query_id: str | None = None
        self.rows = 0
        self.batches = 0
        self.slow = 0  # micro-batches that took longer than the trigger interval
        self.last_ms = 0
        self._lock = threading.Lock()

    def onQueryStarted(self, event: Any) -> None:
        return None

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if str(progress.id) != self.query_id or not progress.numInputRows:
            return
        took = int(progress.durationMs.get("triggerExecution", 0))
        with self._lock:
            self.rows += int(progress.numInputRows)
            self.batches += 1
            self.last_ms = took
            self.slow += int(took > TRIGGER_S * 1000)

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: Any) -> None:
        return None


def _health(cluster: LocalCluster) -> list[WorkerMetrics]:
    out = []
    for slot in cluster.slots:
        try:
            out.append(cluster.health(slot, timeout=5))
        except (OSError, StormError):
            continue  # not up yet, or stopping: the caller reads again
    return out


def _acked(healths: list[WorkerMetrics]) -> tuple[Counter[str], int]:
    """Tuples (rows) acked per component and the total queue depth."""
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
    """Wait until every queue is empty and the entry bolts acked ``sent`` rows (or timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        per, depth = _acked(_health(cluster))
        if (depth == 0 and per["sentences"] >= sent) or time.monotonic() > deadline:
            return per["sentences"]
        time.sleep(0.2)


def _topology(work: Path, arrow: bool) -> Path:
    name = "wordcount-arrow.yaml" if arrow else "wordcount.yaml"
    topo = yaml.safe_load(resources.files("spark_storm.examples").joinpath(name).read_text())
    for comp in topo["components"]:
        if comp["id"] == "report":
            comp.setdefault("conf", {})["report.dir"] = str(work / "report")
    path = work / name
    path.write_text(yaml.safe_dump(topo))
    return path


def _start_query(
    spark: Any, corpus: list[str], rate: int, topo_path: Path, cluster: LocalCluster, work: Path, listener: _Sent
) -> Any:
    from pyspark.sql import functions as F

    sentences = F.array(*[F.lit(s) for s in corpus])
    df = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .load()
        .select(F.element_at(sentences, (F.col("value") % len(corpus) + 1).cast("int")).alias("sentence"))
    )
    spark.streams.addListener(listener)
    query = (
        df.writeStream.format("storm")
        .option("topology", str(topo_path))
        .option("workers", cluster.workers_arg)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(processingTime=f"{TRIGGER_S:g} second")
        .start()
    )
    listener.query_id = str(query.id)
    return query


def _stream(query: Any, cluster: LocalCluster, listener: _Sent, seconds: float) -> None:
    """Print progress every second for ``seconds`` (and until a micro-batch with data went through)."""
    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__("now", True))
    started = time.monotonic()
    last: tuple[float, Counter[str]] = (started, Counter())
    # Spark's first batch waits for its JVM and Python workers to start: wait for it too.
    while not stop["now"] and (
        time.monotonic() - started < seconds or (not listener.rows and time.monotonic() - started < seconds + 120)
    ):
        time.sleep(1.0)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        per, depth = _acked(_health(cluster))
        now = time.monotonic()
        rates = {c: (per[c] - last[1][c]) / (now - last[0]) for c in ("sentences", "split", "count", "report")}
        last = (now, per)
        pace = "keeping up" if listener.last_ms <= TRIGGER_S * 1000 else "BEHIND"
        print(
            f"t={now - started:5.1f}s  sent {listener.rows:>9,} rows  | tuples/s"
            f"  sentences {rates['sentences']:>9,.0f}"
            f"  split {rates['split']:>9,.0f}  count {rates['count']:>9,.0f}  report {rates['report']:>9,.0f}"
            f"  | queue depth {depth:>7,}  | batch {listener.last_ms:>5,} ms ({pace})",
            flush=True,
        )


def run_demo(
    seconds: float,
    rows_per_second: int | None = None,
    workers: int = 2,
    *,
    arrow: bool = False,
    verbose: bool = False,
) -> int:
    """Run the demo; return 0 when every sentence sent was processed."""
    rate = rows_per_second or (ARROW_RATE if arrow else TUPLE_RATE)
    work = Path(tempfile.mkdtemp(prefix="spark-storm-demo-"))
    corpus = resources.files("spark_storm.examples").joinpath("corpus.txt").read_text(encoding="utf-8").splitlines()
    topo_path = _topology(work, arrow)
    kind = "columnar (batch bolts)" if arrow else "tuple"
    print(f"starting {workers} workers of the {kind} wordcount topology ...", flush=True)
    cluster = LocalCluster(str(topo_path), workers)
    ui = serve_local_ui(cluster.heartbeat_dir, default_config(), any_port_if_busy=True)
    query = spark = None
    listener = _Sent()
    try:
        cluster.start()
        print(cluster.plan.describe(), flush=True)
        print(f"UI: {ui.url}topology.html?id={cluster.topology.name}  (live while the demo runs)", flush=True)
        print(f"starting Spark (local[2]), streaming {rate:,} sentences/s ...", flush=True)
        spark = local_session("spark-storm-demo", master="local[2,4]", quiet=not verbose)
        query = _start_query(spark, corpus, rate, topo_path, cluster, work, listener)
        _stream(query, cluster, listener, seconds)
    finally:
        if query is not None:
            print("stopping the query between two micro-batches ...", flush=True)
            _stop_between_batches(query)
        if spark is not None:
            spark.stop()
        print("letting the workers drain what they accepted ...", flush=True)
        processed = _drained(cluster, listener.rows)
        codes = cluster.stop()
        ui.close()
    sent = listener.rows
    final: Counter[str] = Counter()
    for path in (work / "report").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "final" in rec:
                final.update(rec["final"])
    print("\ntop words:")
    for word, count in final.most_common(12):
        print(f"  {word:12s} {count:>10,}")
    words = sum(final.values())
    print(
        f"\nsentences sent by Spark: {sent:,}; micro-batches: {listener.batches} ({listener.slow} slower than "
        f"the {TRIGGER_S:g} s trigger); processed by the topology: {processed:,}; words counted: {words:,}"
    )
    ok = sent == processed and all(c == 0 for c in codes.values())
    print("sent == processed: OK" if ok else "sent != processed: MISMATCH (see the worker logs in " + str(work) + ")")
    return 0 if ok else 1
