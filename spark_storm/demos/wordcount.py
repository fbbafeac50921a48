"""``spark-storm demo``: local Spark streaming sentences into a 2-worker wordcount topology.

Everything is embedded: Spark ``local[2]``, a rate source mapped onto a bundled corpus
(no server needed), ``format("storm")`` into a LocalCluster of worker processes running
``split -> count -> report`` — tuple bolts by default, the columnar (batch-bolt) wordcount
with ``--arrow``.  Progress is printed every second: rows Spark sent (counted from every
micro-batch by a query listener), tuples per second per bolt, queue depth and whether
Spark's micro-batches keep up with the trigger.  The ``count`` bolt keeps its counts in
checkpointed state (docs/design/state.md), committed with each micro-batch; ``--kill-worker``
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
    Hosted,
    Sent,
    Workers,
    acked,
    health,
    kill_one,
    logs_line,
    wind_down,
)
from spark_storm.spark.deployment import deploy
from spark_storm.spark.session import local_session
from spark_storm.topology import load_topology
from spark_storm.ui import serve_local_ui

__all__ = ["ARROW_RATE", "TUPLE_RATE", "run_demo"]

#: Default rows per second: what the tuple wordcount keeps up with on a 2-core machine,
#: and 20 times that for the columnar one.
TUPLE_RATE = 2000
ARROW_RATE = 20 * TUPLE_RATE
WORDS = "the words of the same sentences"


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


def _start_query(
    spark: Any, corpus: list[str], rate: int, target: dict[str, str], work: Path, listener: Sent, finish: bool = False
) -> Any:
    """Start the stream (``finish``: again, from its checkpoint, until what is available now is done)."""
    from pyspark.sql import functions as F

    sentences = F.array(*[F.lit(s) for s in corpus])
    df = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .load()
        .select(F.element_at(sentences, (F.col("value") % len(corpus) + 1).cast("int")).alias("sentence"))
    )
    writer = df.writeStream.format("storm").options(**target).option("checkpointLocation", str(work / "checkpoint"))
    if finish:
        return writer.trigger(availableNow=True).start()  # the same query id: the listener follows it
    spark.streams.addListener(listener)
    query = writer.trigger(processingTime=f"{TRIGGER_S:g} second").start()
    listener.query_id = str(query.id)
    return query


def _stream(query: Any, cluster: Workers, listener: Sent, seconds: float, kill_worker: bool = False) -> bool:
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
        per, depth = acked(health(cluster))
        now = time.monotonic()
        rates = {c: (per[c] - last[1][c]) / (now - last[0]) for c in ("sentences", "split", "count", "report")}
        last = (now, per)
        pace = "keeping up" if listener.last_ms <= TRIGGER_S * 1000 else "BEHIND"
        if kill_worker and not killed and listener.rows and now - started >= seconds / 2:
            victim = kill_one(cluster)
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
    listener = Sent(TRIGGER_S)
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
        between, exact, processed = wind_down(
            query,
            spark,
            listener,
            cluster,
            killed,
            lambda: _exact_counts(spark, corpus, listener.rows),
            WORDS,
            lambda: _start_query(spark, corpus, rate, target, work, listener, finish=True),
            checkpoint=work / "checkpoint",
        )
        if spark is not None:
            spark.stop()
        codes = cluster.stop()
        ui.close()
    exited = all(c == 0 for c in codes.values())
    return _report(work, cluster, listener, processed, exact, between, killed, exited, logs_line(cluster, codes))


def _report(
    work: Path,
    cluster: Workers,
    listener: Sent,
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
    listener = Sent(TRIGGER_S)
    killed = False
    between = True
    exact: Counter[str] | None = None
    processed = 0
    try:
        topo = deploy(spark, str(topo_path), workers=workers, ui_port=0)
        hosted = Hosted(topo, load_topology(topo_path))
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
            between, exact, processed = wind_down(
                query,
                spark,
                listener,
                hosted,
                killed,
                lambda: _exact_counts(spark, corpus, listener.rows),
                WORDS,
                lambda: _start_query(spark, corpus, rate, target, work, listener, finish=True),
                checkpoint=work / "checkpoint",
            )
            print("stopping the topology and its Spark tasks ...", flush=True)
            topo.stop()
    finally:
        spark.stop()
    where = "the worker logs in the supervisor tasks' folders under Spark's local dir"
    return _report(work, hosted, listener, processed, exact, between, killed, topo.state == "stopped", where)
