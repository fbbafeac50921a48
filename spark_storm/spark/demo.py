"""``spark-storm demo``: local Spark streaming sentences into a 2-worker wordcount topology.

Everything is embedded: Spark ``local[2]``, a rate source mapped onto a bundled corpus
(no server needed), ``format("storm")`` into a LocalCluster of worker processes running
``split -> count -> report`` — tuple bolts by default, the columnar (batch-bolt) wordcount
with ``--arrow``.  Progress is printed every second: rows Spark sent (counted from every
micro-batch by a query listener), tuples per second per bolt, queue depth and whether
Spark's micro-batches keep up with the trigger.  The ``count`` bolt keeps its counts in
checkpointed state (docs/state.md), committed with each micro-batch; ``--kill-worker``
SIGKILLs a worker half-way and restarts it, as a supervisor would.  At the end: the top
words from the committed state, the check that every row sent was processed (when no
worker was killed: a killed worker's input is replayed), and ``counts exact: OK`` when
the committed counts equal the counts Spark computes from the same sentences.  Spark's
own console output (progress bar, INFO/WARN log) is off unless ``--verbose``.

``--on-spark`` hosts the workers in the demo's own Spark instead (``deploy()``: one
supervisor task per worker in ``local[workers + 2]``, nimbus and ZooKeeper on the driver),
fed through ZooKeeper; ``--kill-worker`` then SIGKILLs a supervisor task and Spark runs it again.
"""

from __future__ import annotations

import os
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

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.cluster.state import ClusterState
from spark_storm.config import default_config
from spark_storm.errors import StormError
from spark_storm.reports import WorkerMetrics
from spark_storm.spark.deploy import Deployment, deploy
from spark_storm.spark.session import local_session
from spark_storm.topology import Plan, Slot, Topology, load_topology, parse_slots, plan
from spark_storm.ui import serve_local_ui

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
        self.last_batch_id = -1  # the newest micro-batch reported, with rows or without
        self._lock = threading.Lock()

    def onQueryStarted(self, event: Any) -> None:
        return None

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if str(progress.id) != self.query_id:
            return
        with self._lock:
            self.last_batch_id = max(self.last_batch_id, int(progress.batchId))
        if not progress.numInputRows:
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


class _Hosted:
    """The demo's workers as its own Spark hosts them (``deploy()``), asked what a LocalCluster answers."""

    def __init__(self, topo: Deployment, topology: Topology) -> None:
        self.topo = topo
        self.topology = topology
        self._plan: Plan | None = None

    @property
    def plan(self) -> Plan:
        """The current assignment's plan; after stop() the last one seen (its tasks are the topology's)."""
        if self.topo.state in ("starting", "running"):
            self._plan = self.topo.plan() or self._plan
        return self._plan or plan(self.topology, "127.0.0.1:1")

    @property
    def slots(self) -> list[Slot]:
        workers = self.topo.workers()
        return parse_slots(",".join(workers)) if workers else []

    def health(self, slot: Slot, timeout: float = 5.0) -> WorkerMetrics:
        metrics = self.topo.worker_metrics(timeout).get(str(slot))
        if metrics is None:
            msg = f"worker {slot} of {self.topology.name} does not answer yet"
            raise StormError(msg)
        return metrics

    def kill(self, slot: Slot) -> None:
        """SIGKILL the supervisor task (Spark's Python worker) that runs ``slot``: Spark runs the task again."""
        with ClusterState(self.topo.zookeeper, self.topo.settings) as state:
            pids = [info.pid for info in state.supervisors().values() if slot in info.slots]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)


Workers = LocalCluster | _Hosted


def _health(cluster: Workers) -> list[WorkerMetrics]:
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


def _stop_between_batches(query: Any, listener: _Sent, timeout: float = 60.0) -> bool:
    """Stop when no micro-batch is running, then wait for the listener to hear of the last one.

    Spark delivers progress events to listeners asynchronously: right after ``stop()`` the
    last batch's rows may not be counted yet, and the exact counts would be of fewer rows.
    Return False when a batch was still running at the deadline (it was stopped mid-batch).
    """
    deadline = time.monotonic() + timeout
    while query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.01)
    between = not query.status.get("isTriggerActive")
    query.stop()
    last = query.lastProgress
    target = int(last["batchId"]) if last else -1
    deadline = time.monotonic() + timeout
    while listener.last_batch_id < target and time.monotonic() < deadline:
        time.sleep(0.01)
    return between


def _drained(cluster: Workers, sent: int, killed: bool, timeout: float = 60.0) -> int:
    """Wait until every queue is empty and the entry bolts acked ``sent`` rows (or timeout); return the acked rows.

    After a kill the acks cannot add up to ``sent``: the killed worker's counts died with it and
    its restart counts from 0.  Then only the queues are waited for; what the demo checks after
    a kill is the committed state, which each micro-batch's commit made durable (before, the
    demo waited out the whole timeout after every ``--kill-worker``).
    """
    deadline = time.monotonic() + timeout
    while True:
        per, depth = _acked(_health(cluster))
        if (depth == 0 and (killed or per["sentences"] >= sent)) or time.monotonic() > deadline:
            return per["sentences"]
        time.sleep(0.2)


def _topology(work: Path, arrow: bool) -> Path:
    name = "wordcount-arrow.yaml" if arrow else "wordcount.yaml"
    topo = yaml.safe_load(resources.files("spark_storm.examples").joinpath(name).read_text())
    # this run's own state: the exact counts are of this run's sentences
    topo.setdefault("conf", {})["topology.state.provider.config"] = {"dir": str(work / "state")}
    for comp in topo["components"]:
        if comp["id"] == "report":
            comp.setdefault("conf", {})["report.dir"] = str(work / "report")
    path = work / name
    path.write_text(yaml.safe_dump(topo))
    return path


def _start_query(spark: Any, corpus: list[str], rate: int, target: dict[str, str], work: Path, listener: _Sent) -> Any:
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
        .options(**target)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(processingTime=f"{TRIGGER_S:g} second")
        .start()
    )
    listener.query_id = str(query.id)
    return query


def _kill_one(cluster: Workers) -> str:
    """SIGKILL a worker that runs a source task, and restart it (what a supervisor does); hosted: its task."""
    the_plan = cluster.plan
    hosting = {the_plan.task_slot[t] for t in the_plan.component_tasks["sentences"]}
    victim = next(s for s in cluster.slots if s in hosting)
    cluster.kill(victim)
    if isinstance(cluster, LocalCluster):
        cluster.start_worker(victim)
        return f"worker {victim}"
    return f"the supervisor task of worker {victim} (Spark runs it again)"


def _stream(query: Any, cluster: Workers, listener: _Sent, seconds: float, kill_worker: bool = False) -> bool:
    """Print progress every second for ``seconds`` (and until a micro-batch with data went through).

    Returns whether a worker was killed (``kill_worker``: half-way, once data flows).
    """
    killed = False
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
        if kill_worker and not killed and listener.rows and now - started >= seconds / 2:
            victim = _kill_one(cluster)
            killed = True
            print(f"t={now - started:5.1f}s  SIGKILLed {victim} and restarted it", flush=True)
        print(
            f"t={now - started:5.1f}s  sent {listener.rows:>9,} rows  | tuples/s"
            f"  sentences {rates['sentences']:>9,.0f}"
            f"  split {rates['split']:>9,.0f}  count {rates['count']:>9,.0f}  report {rates['report']:>9,.0f}"
            f"  | queue depth {depth:>7,}  | batch {listener.last_ms:>5,} ms ({pace})",
            flush=True,
        )
    return killed


def _committed_counts(work: Path, cluster: Workers) -> Counter[str]:
    """Every count task's committed state, merged (read from the embedded backend's files)."""
    from spark_storm.state.files import EmbeddedBackend

    backend = EmbeddedBackend(cluster.topology.name, work / "state")
    counts: Counter[str] = Counter()
    for task in cluster.plan.component_tasks["count"]:
        _, data = backend.task_store(task).restore()
        counts.update({str(word): int(n) for word, n in data.items()})
    return counts


def _exact_counts(spark: Any, corpus: list[str], rows: int) -> Counter[str]:
    """Count with Spark the words of the first ``rows`` sentences the rate source made (values 0..rows-1)."""
    from pyspark.sql import functions as F

    sentences = F.array(*[F.lit(s) for s in corpus])
    words = (
        spark.range(rows)
        .select(F.element_at(sentences, (F.col("id") % len(corpus) + 1).cast("int")).alias("sentence"))
        .select(F.explode(F.split(F.lower("sentence"), r"(?U)[^\w']+")).alias("word"))
        .where(F.col("word") != "")
        .groupBy("word")
        .count()
        .collect()
    )
    return Counter({row["word"]: int(row["count"]) for row in words})


def run_demo(
    seconds: float,
    rows_per_second: int | None = None,
    workers: int = 2,
    *,
    arrow: bool = False,
    verbose: bool = False,
    kill_worker: bool = False,
    on_spark: bool = False,
) -> int:
    """Run the demo; return 0 when every sentence sent was processed and the committed counts are exact."""
    rate = rows_per_second or (ARROW_RATE if arrow else TUPLE_RATE)
    work = Path(tempfile.mkdtemp(prefix="spark-storm-demo-"))
    corpus = resources.files("spark_storm.examples").joinpath("corpus.txt").read_text(encoding="utf-8").splitlines()
    topo_path = _topology(work, arrow)
    kind = "columnar (batch bolts)" if arrow else "tuple"
    if on_spark:
        return _run_on_spark(seconds, rate, workers, work, corpus, topo_path, kind, verbose, kill_worker)
    print(f"starting {workers} workers of the {kind} wordcount topology ...", flush=True)
    cluster = LocalCluster(str(topo_path), workers, work_dir=work / "workers")
    ui = serve_local_ui(cluster.heartbeat_dir, default_config(), any_port_if_busy=True)
    query = spark = None
    listener = _Sent()
    killed = False
    between = True
    exact: Counter[str] | None = None
    try:
        cluster.start()
        print(cluster.plan.describe(), flush=True)
        print(f"UI: {ui.url}topology.html?id={cluster.topology.name}  (live while the demo runs)", flush=True)
        print(f"starting Spark (local[2]), streaming {rate:,} sentences/s ...", flush=True)
        spark = local_session("spark-storm-demo", master="local[2,4]", quiet=not verbose)
        target = {"topology": str(topo_path), "workers": cluster.workers_arg}
        query = _start_query(spark, corpus, rate, target, work, listener)
        killed = _stream(query, cluster, listener, seconds, kill_worker)
    finally:
        if query is not None:
            print("stopping the query between two micro-batches ...", flush=True)
            between = _stop_between_batches(query, listener)
        if spark is not None:
            if listener.rows:
                print("Spark counts the words of the same sentences ...", flush=True)
                exact = _exact_counts(spark, corpus, listener.rows)
            spark.stop()
        print("letting the workers drain what they accepted ...", flush=True)
        processed = _drained(cluster, listener.rows, killed)
        codes = cluster.stop()
        ui.close()
    exited = all(c == 0 for c in codes.values())
    return _report(work, cluster, listener, processed, exact, between, killed, exited, _logs_line(cluster, codes))


def _report(
    work: Path,
    cluster: Workers,
    listener: _Sent,
    processed: int,
    exact: Counter[str] | None,
    between: bool,
    killed: bool,
    exited: bool,
    where: str,
) -> int:
    """Print the committed top words and the closing checks; 0 when sent == processed and the counts are exact."""
    sent = listener.rows
    committed = _committed_counts(work, cluster)
    print("\ntop words (committed state):")
    for word, count in committed.most_common(12):
        print(f"  {word:12s} {count:>10,}")
    words = sum(committed.values())
    print(
        f"\nsentences sent by Spark: {sent:,}; micro-batches: {listener.batches} ({listener.slow} slower than "
        f"the {TRIGGER_S:g} s trigger); processed by the topology: {processed:,}; words counted: {words:,}"
    )
    logs = f" (see {where})"
    if not between:
        # The stopped batch's rows reached the workers without a progress event from Spark.
        print(
            "sent == processed and counts exact: not checked (every micro-batch ran behind: the query was "
            "stopped mid-batch)" + logs
        )
        return 0 if exited else 1
    if killed:
        print("sent == processed: not checked (the killed worker's input was replayed after it restarted)")
        ok = exited
    else:
        ok = sent == processed and exited
        print("sent == processed: OK" if ok else "sent != processed: MISMATCH" + logs)
    if exact is not None and committed == exact:
        print(f"counts exact: OK ({len(exact):,} words, the same counts as Spark's)")
    else:
        wrong = sorted(w for w in set(committed) | set(exact or {}) if committed[w] != (exact or Counter())[w])
        print(f"counts exact: MISMATCH in {len(wrong)} words, e.g. {wrong[:5]}" + logs)
        ok = False
    return 0 if ok else 1


def _run_on_spark(
    seconds: float,
    rate: int,
    workers: int,
    work: Path,
    corpus: list[str],
    topo_path: Path,
    kind: str,
    verbose: bool,
    kill_worker: bool,
) -> int:
    """``--on-spark``: the demo's own Spark hosts the workers (``deploy()``), and feeds them through ZooKeeper."""
    master = f"local[{workers + 2},4]"  # a task slot per worker, and two for the stream (its 2 partitions)
    print(f"starting Spark ({master}) with {workers} workers of the {kind} wordcount topology as its tasks ...")
    spark = local_session("spark-storm-demo", master=master, quiet=not verbose)
    query = None
    listener = _Sent()
    killed = False
    between = True
    exact: Counter[str] | None = None
    processed = 0
    try:
        topo = deploy(spark, str(topo_path), workers=workers, ui_port=0)
        hosted = _Hosted(topo, load_topology(topo_path))
        try:
            print(hosted.plan.describe(), flush=True)
            print(
                f"hosted by Spark: ZooKeeper {topo.zookeeper} (on the driver), workers {', '.join(topo.workers())} "
                f"(supervisor tasks of Spark job group spark-storm-{topo.name})",
                flush=True,
            )
            print(f"UI: {topo.ui_url}  (live while the demo runs)", flush=True)
            print(f"streaming {rate:,} sentences/s ...", flush=True)
            target = {"topology": topo.name, "zookeeper": topo.zookeeper}
            query = _start_query(spark, corpus, rate, target, work, listener)
            killed = _stream(query, hosted, listener, seconds, kill_worker)
        finally:
            if query is not None:
                print("stopping the query between two micro-batches ...", flush=True)
                between = _stop_between_batches(query, listener)
            if listener.rows:
                print("Spark counts the words of the same sentences ...", flush=True)
                exact = _exact_counts(spark, corpus, listener.rows)
            print("letting the workers drain what they accepted ...", flush=True)
            processed = _drained(hosted, listener.rows, killed)
            print("stopping the topology and its Spark tasks ...", flush=True)
            topo.stop()
    finally:
        spark.stop()
    where = "the worker logs in the supervisor tasks' folders under Spark's local dir"
    return _report(work, hosted, listener, processed, exact, between, killed, topo.state == "stopped", where)


def _logs_line(cluster: LocalCluster, codes: dict[Any, int]) -> str:
    """Name the workers' log files that exist, with the exit code of each worker that failed."""
    logs = [
        f"{path} (exit code {codes[slot]})" if codes.get(slot) else str(path)
        for slot, path in cluster.logs.items()
        if path.exists()
    ]
    if not logs:
        return f"the workers' folder {cluster.heartbeat_dir}: no worker wrote a log"
    return "the worker logs: " + ", ".join(logs)
