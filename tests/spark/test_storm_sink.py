"""format("storm"), foreachBatch and batch writes into real worker processes, with exact counts."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.topology.hashing import fields_hash
from tests.support import wait_until
from tests.support.spark import health, records, two_stage, write_json_rows

pytestmark = pytest.mark.spark

N = 1200


def _rows(n: int = N, start: int = 0) -> list[dict[str, Any]]:
    return [{"key": f"k{i % 37}", "n": i} for i in range(start, start + n)]


def _stream(spark: Any, src: Path) -> Any:
    return spark.readStream.schema("key string, n long").option("maxFilesPerTrigger", 2).json(str(src))


def _tuples_in(cluster: LocalCluster) -> int:
    """Rows that clients (Spark) put into source-task queues, over all workers."""
    return sum(health(cluster, s)["counters"]["source_tuples_in"] for s in cluster.slots)


def _replayed(cluster: LocalCluster) -> int:
    return sum(health(cluster, s)["server"]["replayed_messages"] for s in cluster.slots)


def _start(df: Any, topo: Path, cluster: LocalCluster, checkpoint: Path, **options: str) -> Any:
    """df.writeStream.format("storm") into ``cluster``, bounded by availableNow."""
    writer = df.writeStream.format("storm").option("topology", str(topo)).option("workers", cluster.workers_arg)
    return writer.options(**options).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()


def _run(q: Any) -> None:
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()


def test_stream_is_delivered_exactly_once_and_routed_like_the_workers(spark: Any, tmp_path: Path) -> None:
    topo = two_stage(tmp_path)
    write_json_rows(tmp_path / "in", _rows())
    with LocalCluster(str(topo), 2) as cluster:
        q = _start(_stream(spark, tmp_path / "in"), topo, cluster, tmp_path / "ck")
        _run(q)
        assert _tuples_in(cluster) == N
    recs = records(tmp_path)
    assert sum(r["count"] for r in recs["in"].values()) == N
    assert sum(r["count"] for r in recs["next"].values()) == N
    tasks = sorted(recs["in"])
    for task, rec in recs["in"].items():  # Spark's routing == the worker-side fields hash
        for key in rec["keys"]:
            assert tasks[fields_hash([key]) % len(tasks)] == task


def test_bad_options_fail_the_query_at_start_naming_the_option(spark: Any, tmp_path: Path) -> None:
    topo = two_stage(tmp_path)
    write_json_rows(tmp_path / "in", _rows(10))
    cases = [
        ({"component": "next"}, "not a source"),
        ({"fields": "key,missing"}, "lacks"),
        ({"delivery": "maybe"}, "use none, accepted"),
        ({"ackTimeoutMS": "-3"}, "positive integer"),
        ({"workerz": "x"}, "Did you mean 'workers'"),
        ({"transport": "tpc"}, "Did you mean 'tcp'"),
    ]
    for extra, match in cases:
        writer = _stream(spark, tmp_path / "in").writeStream.format("storm").option("topology", str(topo))
        writer = writer.option("workers", "127.0.0.1:1,127.0.0.1:2").options(**extra)
        q = writer.option("checkpointLocation", str(tmp_path / f"ck-{match[:5]}")).trigger(availableNow=True).start()
        with pytest.raises(Exception, match=match):
            q.awaitTermination(120)
    from spark_storm.spark import storm_sink

    with pytest.raises(Exception, match="option 'topology' is required"):
        storm_sink(workers="127.0.0.1:1")


def test_a_task_failing_upstream_of_the_writer_is_retried_exactly_once(spark: Any, tmp_path: Path) -> None:
    from pyspark import TaskContext
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    def fail_once(n: int) -> int:
        ctx = TaskContext.get()
        first_attempt = ctx is not None and ctx.attemptNumber() == 0
        if first_attempt and n >= 100:
            time.sleep(0.01)  # let the writer send the first record batches before the failure
        if first_attempt and n == 290:
            msg = "injected failure after half the partition was sent"
            raise RuntimeError(msg)
        return n

    topo = two_stage(tmp_path)
    write_json_rows(tmp_path / "in", _rows(300), files=1)
    with LocalCluster(str(topo), 2) as cluster:
        df = _stream(spark, tmp_path / "in").withColumn("n", F.udf(fail_once, LongType(), useArrow=False)("n"))
        q = (
            df.writeStream.format("storm")
            .option("topology", str(topo))
            .option("workers", cluster.workers_arg)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        _run(q)
        assert _tuples_in(cluster) == 300  # the retry delivered everything, once
    recs = records(tmp_path)
    assert sum(r["count"] for r in recs["in"].values()) == 300


def test_a_task_that_fails_after_sending_is_retried_without_duplicates(spark: Any, tmp_path: Path) -> None:
    # Bolts slower than ackTimeoutMs: the first attempt sends every group, then fails waiting
    # for PROCESSED acks.  Spark retries; the replays wait for the groups in flight.
    topo = two_stage(tmp_path, conf={"record.delay.s": 0.01})
    write_json_rows(tmp_path / "in", _rows(300), files=1)
    with LocalCluster(str(topo), 2) as cluster:
        q = _start(
            _stream(spark, tmp_path / "in"), topo, cluster, tmp_path / "ck", delivery="processed", ackTimeoutMs="1000"
        )
        _run(q)
        assert _replayed(cluster) > 0  # the retry really re-sent groups the first attempt had sent
        assert _tuples_in(cluster) == 300  # ... and none reached a queue twice
    recs = records(tmp_path)
    assert sum(r["count"] for r in recs["in"].values()) == 300


def test_query_stopped_mid_batch_and_restarted_from_its_checkpoint(spark: Any, tmp_path: Path) -> None:
    topo = two_stage(tmp_path, conf={"record.delay.s": 0.004})
    write_json_rows(tmp_path / "in", _rows(400), files=1)
    with LocalCluster(str(topo), 2) as cluster:

        def start() -> Any:
            return _start(_stream(spark, tmp_path / "in"), topo, cluster, tmp_path / "ck", delivery="processed")

        q = start()
        wait_until(lambda: _tuples_in(cluster) > 0, what="the batch to be under way", timeout=120)
        q.stop()  # mid-batch: the batch is not committed
        assert _tuples_in(cluster) < 800
        q = start()  # same checkpoint: Spark replays the uncommitted batch with the same id
        _run(q)
        wait_until(
            lambda: (
                sum(
                    t["executed"]
                    for s in cluster.slots
                    for e in health(cluster, s)["executors"].values()
                    if e["component"] == "in"
                    for t in e["tasks"].values()
                )
                >= 400
            ),
            what="processing",
            timeout=60,
        )
        assert _tuples_in(cluster) == 400 or _replayed(cluster) > 0
        first_attempt_rows = _tuples_in(cluster)
    recs = records(tmp_path)
    # every row reached a queue exactly once (replays dropped), and was processed
    assert first_attempt_rows == 400
    assert sum(r["count"] for r in recs["in"].values()) == 400


def test_worker_killed_mid_batch_and_restarted_query_retries_until_it_succeeds(spark: Any, tmp_path: Path) -> None:
    topo = two_stage(tmp_path, conf={"record.delay.s": 0.003})
    write_json_rows(tmp_path / "in", _rows(400), files=1)
    cluster = LocalCluster(str(topo), 2, overrides={"storm.messaging.tcp.max_wait_ms": 200}).start()
    try:
        q = _start(
            _stream(spark, tmp_path / "in"), topo, cluster, tmp_path / "ck", delivery="processed", ackTimeoutMs="4000"
        )
        victim = cluster.slots[0]
        wait_until(
            lambda: health(cluster, victim)["counters"]["source_tuples_in"] > 0, what="rows at the victim", timeout=120
        )
        cluster.kill(victim)  # SIGKILL: its queues and ledger are gone
        cluster.start_worker(victim)
        cluster.wait_running(60, [victim])
        _run(q)
        survivor = cluster.slots[1]
        restarted_in = health(cluster, victim)["counters"]["source_tuples_in"]
        survivor_in = health(cluster, survivor)["counters"]["source_tuples_in"]
    finally:
        codes = cluster.stop()
    assert all(c == 0 for c in codes.values())
    recs = records(tmp_path)  # only processes that lived to cleanup wrote records
    processed = sum(r["count"] for r in recs["in"].values())
    assert processed == restarted_in + survivor_in == 400  # each row exactly once in the live queues
    assert signal.SIGKILL  # (the victim died by SIGKILL above)


def test_processed_query_survives_a_worker_sigkilled_mid_stream_with_default_settings(
    spark: Any, tmp_path: Path
) -> None:
    """Trees that passed through the killed worker fail at once; the retried tasks go through."""
    import json

    topo = two_stage(tmp_path, conf={"record.delay.s": 0.002, "record.journal": True})
    n = 900
    write_json_rows(tmp_path / "in", _rows(n), files=3)
    cluster = LocalCluster(str(topo), 3).start()
    try:
        stream = (
            spark.readStream.schema("key string, n long").option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
        )
        q = _start(stream, topo, cluster, tmp_path / "ck", delivery="processed", ackTimeoutMs="6000")
        victim = cluster.plan.task_slot[cluster.plan.component_tasks["next"][0]]
        assert all(cluster.plan.task_slot[t] != victim for t in cluster.plan.component_tasks["in"])
        wait_until(
            lambda: any(health(cluster, s)["counters"]["tuples_in"] > 0 for s in cluster.slots if s == victim),
            what="tuples reaching the victim",
            timeout=120,
        )
        killed_at = time.monotonic()
        cluster.kill(victim)  # SIGKILL: trees rooted on the survivors passed through it
        cluster.start_worker(victim)  # what a supervisor does
        cluster.wait_running(60, [victim])
        _run(q)  # no "Task failed 4 times": the retry after the kill succeeded
        recovered_s = time.monotonic() - killed_at
        failed_trees = sum(health(cluster, s)["acker"]["failed"] for s in cluster.slots if s != victim)
    finally:
        cluster.stop()
    seen: set[int] = set()
    for path in (tmp_path / "records").glob("journal-next-*.jsonl"):
        seen.update(json.loads(line)[1] for line in path.read_text().splitlines())
    assert seen == set(range(n))  # every row reached the last bolt at least once
    assert failed_trees > 0  # the survivors failed the trees through the dead worker (not a timeout)
    print(f"query finished {recovered_s:.1f} s after the SIGKILL; {failed_trees} trees failed and replayed")


def test_foreach_batch_and_batch_writes_deliver_exactly_once(spark: Any, tmp_path: Path) -> None:
    from spark_storm.spark import storm_sink

    topo = two_stage(tmp_path)
    write_json_rows(tmp_path / "in", _rows(500))
    with LocalCluster(str(topo), 2) as cluster:
        sink = storm_sink(topology=str(topo), workers=cluster.workers_arg)
        q = (
            _stream(spark, tmp_path / "in")
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        _run(q)
        assert _tuples_in(cluster) == 500
        batch_df = spark.read.schema("key string, n long").json(str(tmp_path / "in"))
        batch_df.write.format("storm").mode("append").option("topology", str(topo)).option(
            "workers", cluster.workers_arg
        ).save()
        assert _tuples_in(cluster) == 1000
    recs = records(tmp_path)
    assert sum(r["count"] for r in recs["in"].values()) == 1000


def test_task_column_routes_explicitly_and_rejects_foreign_task_ids(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    topo = two_stage(tmp_path)
    with LocalCluster(str(topo), 2) as cluster:
        tasks = list(cluster.plan.component_tasks["in"])
        df = spark.range(200).select(
            F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
            F.col("id").alias("n"),
            (F.lit(tasks[0]) + F.col("id") % len(tasks)).alias("task"),
        )
        df.write.format("storm").mode("append").option("topology", str(topo)).option(
            "workers", cluster.workers_arg
        ).option("taskColumn", "task").save()
        assert _tuples_in(cluster) == 200
        bad = df.withColumn("task", F.lit(999))
        with pytest.raises(Exception, match=r"outside the component's tasks"):
            bad.write.format("storm").mode("append").option("topology", str(topo)).option(
                "workers", cluster.workers_arg
            ).option("taskColumn", "task").save()
        time.sleep(0)
    recs = records(tmp_path)
    per_task = {t: r["count"] for t, r in recs["in"].items()}
    assert per_task == {t: 50 for t in tasks}
