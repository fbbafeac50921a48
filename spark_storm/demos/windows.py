"""``spark-storm demo --windows``: the top words of every minute of event time, from local Spark.

The same embedded set-up as the wordcount demo (Spark ``local[2]``, a rate source mapped
onto the bundled corpus, ``format("storm")`` into a LocalCluster), with each sentence's
event time in a ``TimestampType`` column ``ts``: the rate source's row ``n`` happens at
``start + n / rate`` seconds, so event time keeps pace with the clock and a window is
reproducible from its rows.  The topology (``examples/wordcount-windows.yaml``):
``sentences -> split (word, ts) -> top`` (a tumbling event-time window, 60 s by default,
lag 2 s: :class:`~spark_storm.examples.windows.TopWords`) ``-> results`` (each window once,
by its id, in checkpointed state).  Windows are printed as they close (before their
epoch commits).  At the end Spark
computes ``groupBy(window(ts, ...), word).count()`` over the same sentences, and every
committed window must agree with it: its word count, its top words' counts, and no window
missing up to the last one closed.  ``--kill-worker`` SIGKILLs a worker half-way: a window
open at the time still ends exact, and no window is emitted twice with different values.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import tempfile
import time
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.config import default_config
from spark_storm.demos.scaffold import (
    TRIGGER_S,
    Sent,
    acked,
    health,
    kill_one,
    logs_line,
    wind_down,
)
from spark_storm.spark.session import local_session
from spark_storm.ui import serve_local_ui

__all__ = ["WINDOWS_RATE", "run_windows_demo"]

#: Default sentences per second (about 10 words each, all through one windowed task).
WINDOWS_RATE = 1000
TOPOLOGY = "wordcount-windows.yaml"


def _topology(work: Path, window_s: int) -> Path:
    topo = yaml.safe_load(resources.files("spark_storm.examples").joinpath(TOPOLOGY).read_text())
    topo.setdefault("conf", {})["topology.state.provider.config"] = {"dir": str(work / "state")}
    for comp in topo["components"]:
        if comp["id"] == "top":
            comp["window"]["length"] = f"{window_s}s"
        if comp["id"] == "results":
            comp.setdefault("conf", {})["results.file"] = str(work / "windows.jsonl")
    path = work / TOPOLOGY
    path.write_text(yaml.safe_dump(topo))
    return path


def _sentences(source: str, corpus: list[str], start_ms: int, rate: int) -> Any:
    """(sentence, ts) of the rate source's rows (or ``spark.range``'s: ``id`` for ``value``)."""
    from pyspark.sql import functions as F

    sentences = F.array(*[F.lit(s) for s in corpus])
    n = F.col(source)
    return (
        F.element_at(sentences, (n % len(corpus) + 1).cast("int")).alias("sentence"),
        F.expr(f"timestamp_millis({start_ms} + ({source} * 1000) div {rate})").alias("ts"),
    )


def _start_query(
    spark: Any,
    corpus: list[str],
    rate: int,
    start_ms: int,
    topo: Path,
    cluster: LocalCluster,
    work: Path,
    listener: Sent,
    finish: bool = False,
) -> Any:
    """Start the stream (``finish``: again, from its checkpoint, until what is available now is done)."""
    df = spark.readStream.format("rate").option("rowsPerSecond", rate).load()
    df = df.select(*_sentences("value", corpus, start_ms, rate))
    writer = (
        df.writeStream.format("storm")
        .option("topology", str(topo))
        .option("workers", cluster.workers_arg)
        .option("checkpointLocation", str(work / "checkpoint"))
    )
    if finish:
        return writer.trigger(availableNow=True).start()  # the same query id: the listener follows it
    spark.streams.addListener(listener)
    query = writer.trigger(processingTime=f"{TRIGGER_S:g} second").start()
    listener.query_id = str(query.id)
    return query


def _clock(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%H:%M:%S")


def _line(values: list[Any]) -> str:
    start, end, top, words = values[0], values[1], json.loads(values[2]), values[3]
    tops = " · ".join(f"{w} {n:,}" for w, n in top)
    return f"window {_clock(start)}-{_clock(end)} UTC  {words:>9,} words  top: {tops}"


class _Printer:
    """Prints each window the results bolt appended to its file, once (a replay may append it again)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.seen: dict[str, list[Any]] = {}
        self.conflicts: list[str] = []

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for raw in complete.splitlines():
            entry = json.loads(raw)
            wid, values = str(entry["id"]), list(entry["values"])
            if wid in self.seen:
                if self.seen[wid] != values:
                    self.conflicts.append(wid)
                continue
            self.seen[wid] = values
            print(_line(values), flush=True)


def _stream(
    query: Any, cluster: LocalCluster, listener: Sent, printer: _Printer, seconds: float, kill_worker: bool
) -> bool:
    killed = False
    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__("now", True))
    started = time.monotonic()
    while not stop["now"] and (
        time.monotonic() - started < seconds or (not listener.rows and time.monotonic() - started < seconds + 120)
    ):
        time.sleep(1.0)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        healths = health(cluster)
        per, depth = acked(healths)
        metrics = [ex.get("windows") for h in healths for ex in h["executors"].values()]
        marks = [m["watermark_ms"] for m in metrics if m is not None and m["watermark_ms"] is not None]
        now = time.monotonic()
        if kill_worker and not killed and listener.rows and now - started >= seconds / 2:
            victim = kill_one(cluster)
            killed = True
            print(f"t={now - started:5.1f}s  SIGKILLed worker {victim} and restarted it", flush=True)
        mark = _clock(min(marks)) if marks else "-"
        print(
            f"t={now - started:5.1f}s  sent {listener.rows:>9,} sentences  words windowed {per['top']:>10,}"
            f"  | watermark {mark}  | queue depth {depth:>7,}  | batch {listener.last_ms:>5,} ms",
            flush=True,
        )
        printer.poll()
    return killed


def _spark_windows(
    spark: Any, corpus: list[str], rows: int, start_ms: int, rate: int, window_s: int
) -> dict[int, Counter[str]]:
    """Spark's own ``groupBy(window(ts, ...), word).count()`` of the first ``rows`` sentences."""
    from pyspark.sql import functions as F

    counted = (
        spark.range(rows)
        .select(*_sentences("id", corpus, start_ms, rate))
        .select("ts", F.explode(F.split(F.lower("sentence"), r"(?U)[^\w']+")).alias("word"))
        .where(F.col("word") != "")
        .groupBy(F.window("ts", f"{window_s} seconds"), "word")
        .count()
        .select(F.expr("unix_millis(window.start)").alias("start"), "word", "count")
        .collect()
    )
    out: dict[int, Counter[str]] = {}
    for row in counted:
        out.setdefault(int(row["start"]), Counter())[row["word"]] = int(row["count"])
    return out


def _committed(work: Path, cluster: LocalCluster) -> tuple[dict[int, list[Any]], int]:
    """Return the results bolt's committed windows by start, and its conflicts count."""
    from spark_storm.state.files import EmbeddedBackend

    backend = EmbeddedBackend(cluster.topology.name, work / "state")
    windows: dict[int, list[Any]] = {}
    conflicts = 0
    for task in cluster.plan.component_tasks["results"]:
        _, data = backend.task_store(task).restore()
        for key, value in data.items():
            if isinstance(key, (list, tuple)) and key and key[0] == "window":
                windows[int(value[0])] = list(value)
            elif key == "conflicts":
                conflicts += int(value)
    return windows, conflicts


def _check(committed: dict[int, list[Any]], spark_counts: dict[int, Counter[str]], top_n: int) -> list[str]:
    """Return what differs between the committed windows and Spark's counts (empty: exact)."""
    wrong = []
    last = max(committed, default=None)
    for start, counts in sorted(spark_counts.items()):
        if last is not None and start <= last and start not in committed:
            wrong.append(f"window {_clock(start)}: missing (Spark counted {sum(counts.values()):,} words in it)")
    for start, values in sorted(committed.items()):
        counts = spark_counts.get(start, Counter())
        top, words = json.loads(values[2]), int(values[3])
        if words != sum(counts.values()):
            wrong.append(f"window {_clock(start)}: {words:,} words, Spark counted {sum(counts.values()):,}")
        if any(counts[w] != n for w, n in top):
            wrong.append(f"window {_clock(start)}: top {top}, Spark's counts {[(w, counts[w]) for w, _ in top]}")
        if sorted((n for _, n in top), reverse=True) != [n for _, n in counts.most_common(top_n)]:
            wrong.append(f"window {_clock(start)}: top counts {top}, Spark's top {counts.most_common(top_n)}")
    return wrong


def run_windows_demo(
    seconds: float | None = None,
    rows_per_second: int | None = None,
    workers: int = 2,
    *,
    window_s: int = 60,
    verbose: bool = False,
    kill_worker: bool = False,
) -> int:
    """Run the windows demo; return 0 when every committed window equals Spark's counts."""
    rate = rows_per_second or WINDOWS_RATE
    seconds = seconds if seconds is not None else 2 * window_s + 15  # at least one whole window closes
    work = Path(tempfile.mkdtemp(prefix="spark-storm-demo-windows-"))
    corpus = resources.files("spark_storm.examples").joinpath("corpus.txt").read_text(encoding="utf-8").splitlines()
    topo_path = _topology(work, window_s)
    top_n = 5
    print(f"starting {workers} workers of the windowed wordcount (top words per {window_s} s of event time) ...")
    cluster = LocalCluster(str(topo_path), workers, work_dir=work / "workers")
    ui = serve_local_ui(cluster.heartbeat_dir, default_config(), any_port_if_busy=True)
    printer = _Printer(work / "windows.jsonl")
    query = spark = None
    listener = Sent(TRIGGER_S)
    killed = False
    between = True
    start_ms = int(time.time()) * 1000
    spark_counts: dict[int, Counter[str]] | None = None
    try:
        cluster.start()
        print(cluster.plan.describe(), flush=True)
        print(f"UI: {ui.url}topology.html?id={cluster.topology.name}  (live while the demo runs)", flush=True)
        print(f"starting Spark (local[2]), streaming {rate:,} sentences/s for {seconds:g} s ...", flush=True)
        spark = local_session("spark-storm-demo-windows", master="local[2,4]", quiet=not verbose)
        start_ms = int(time.time()) * 1000
        query = _start_query(spark, corpus, rate, start_ms, topo_path, cluster, work, listener)
        killed = _stream(query, cluster, listener, printer, seconds, kill_worker)
    finally:
        between, spark_counts, _ = wind_down(
            query,
            spark,
            listener,
            cluster,
            killed,
            lambda: _spark_windows(spark, corpus, listener.rows, start_ms, rate, window_s),
            "the words of the same sentences per window",
            lambda: _start_query(spark, corpus, rate, start_ms, topo_path, cluster, work, listener, finish=True),
            checkpoint=work / "checkpoint",
        )
        if spark is not None:
            spark.stop()
        codes = cluster.stop()
        ui.close()
    committed, conflicts = _committed(work, cluster)
    exited = all(c == 0 for c in codes.values())
    logs = f" (see {logs_line(cluster, codes)})"
    print(
        f"\nsentences sent by Spark: {listener.rows:,}; windows closed and committed: {len(committed)}"
        + (" (a worker was SIGKILLed and restarted)" if killed else "")
    )
    if not committed:
        print(f"no window closed: stream longer than the {window_s} s window (--seconds) to see one")
    if not between:
        print("windows exact: not checked (every micro-batch ran behind: the query was stopped mid-batch)" + logs)
        return 0 if exited else 1
    wrong = _check(committed, spark_counts or {}, top_n)
    if conflicts or printer.conflicts:
        wrong.append(f"windows emitted twice with different values: {conflicts or printer.conflicts}")
    if wrong:
        print("windows exact: MISMATCH\n  " + "\n  ".join(wrong[:10]) + logs)
        return 1
    print(f"windows exact: OK ({len(committed)} windows, each the same as Spark's window() counts)")
    return 0 if exited else 1
