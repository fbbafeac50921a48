"""Every Spark entry point over Spark Connect, into real worker processes, with exact counts.

A Spark Connect client (``pyspark.sql.connect``) on pyspark's own local Connect server:
``format("storm")`` streaming and batch, ``foreachBatch(storm_sink(...))``, ``foreach(
storm_foreach(...))`` under a micro-batch trigger and in real-time mode (over the real Kafka
broker), ``delivery=processed`` through a retried task, ``register()``'s check of the server,
a client whose server lacks spark-storm (and ``ship()``), and the notebook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.spark import is_connect, register, storm_foreach, storm_sink
from tests.support import wait_until
from tests.support.connect import install_spec
from tests.support.spark import health, records, run_notebook, two_stage, write_json_rows

pytestmark = [pytest.mark.connect, pytest.mark.spark]

# The UDFs below run in the server's Python workers, which import neither this module nor tests/.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

ROOT = Path(__file__).resolve().parents[2]
N = 1200


def _rows(n: int = N) -> list[dict[str, Any]]:
    return [{"key": f"k{i % 37}", "n": i} for i in range(n)]


def _stream(spark: Any, src: Path) -> Any:
    return spark.readStream.schema("key string, n long").option("maxFilesPerTrigger", 2).json(str(src))


def _tuples_in(cluster: LocalCluster) -> int:
    """Rows that clients (Spark) put into source-task queues, over all workers (their /health)."""
    return sum(health(cluster, s)["counters"]["source_tuples_in"] for s in cluster.slots)


def _run(q: Any) -> None:
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()


def _counts(tmp: Path) -> dict[str, int]:
    return {comp: sum(r["count"] for r in recs.values()) for comp, recs in records(tmp).items()}


def test_the_session_is_spark_connect_and_register_checks_its_server(connect: Any) -> None:
    assert is_connect(connect)
    assert type(connect).__module__ == "pyspark.sql.connect.session"
    register(connect)  # one probe job on the server's Python workers, then the session's registration


def test_stream_format_storm_is_delivered_exactly_once(connect: Any, tmp_path: Path) -> None:
    topo = two_stage(tmp_path)
    write_json_rows(tmp_path / "in", _rows())
    with LocalCluster(str(topo), 2) as cluster:
        q = (
            _stream(connect, tmp_path / "in")
            .writeStream.format("storm")
            .option("topology", str(topo))
            .option("workers", cluster.workers_arg)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        _run(q)
        assert _tuples_in(cluster) == N
    assert _counts(tmp_path) == {"in": N, "next": N}


def test_foreach_batch_storm_sink_is_delivered_exactly_once(connect: Any, tmp_path: Path) -> None:
    topo = two_stage(tmp_path)
    write_json_rows(tmp_path / "in", _rows())  # 4 files, 2 per trigger: 2 micro-batches
    with LocalCluster(str(topo), 2) as cluster:
        q = (
            _stream(connect, tmp_path / "in")
            .writeStream.foreachBatch(storm_sink(topology=str(topo), workers=cluster.workers_arg))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        _run(q)
        assert _tuples_in(cluster) == N
    assert _counts(tmp_path) == {"in": N, "next": N}


def test_batch_write_is_delivered_exactly_once(connect: Any, tmp_path: Path) -> None:
    topo = two_stage(tmp_path)
    write_json_rows(tmp_path / "in", _rows())
    with LocalCluster(str(topo), 2) as cluster:
        df = connect.read.schema("key string, n long").json(str(tmp_path / "in"))
        df.write.format("storm").mode("append").option("topology", str(topo)).option(
            "workers", cluster.workers_arg
        ).save()
        assert _tuples_in(cluster) == N
    assert _counts(tmp_path) == {"in": N, "next": N}


def _pad_failing_once(n: int) -> str:
    """2 KB per row (so that Spark's 64 KiB stream buffers flush rows to the writer before the failure)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() == 0 and n == 290:
        msg = "injected failure after the writer sent groups of this partition"
        raise RuntimeError(msg)
    return "x" * 2000


def test_delivery_processed_survives_a_retried_task_exactly_once(connect: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    topo = two_stage(tmp_path)
    write_json_rows(tmp_path / "in", _rows(300), files=1)
    with LocalCluster(str(topo), 2) as cluster:
        pad = F.udf(_pad_failing_once, StringType(), useArrow=False)
        df = _stream(connect, tmp_path / "in").withColumn("pad", pad("n"))
        q = (
            df.writeStream.format("storm")
            .option("topology", str(topo))
            .option("workers", cluster.workers_arg)
            .option("fields", "key,n")
            .option("delivery", "processed")
            .option("maxRowsPerMessage", "10")  # groups leave every 40 rows
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        _run(q)
        assert _tuples_in(cluster) == 300  # the retry delivered everything, once
        replayed = sum(health(cluster, s)["server"]["replayed_messages"] for s in cluster.slots)
    assert replayed > 0, "the retried task sent nothing again: the failure came before any send"
    assert _counts(tmp_path) == {"in": 300, "next": 300}  # every tuple through the last bolt


def test_foreach_storm_foreach_under_a_micro_batch_trigger(connect: Any, tmp_path: Path) -> None:
    topo = two_stage(tmp_path)
    write_json_rows(tmp_path / "in", _rows(400))
    with LocalCluster(str(topo), 2) as cluster:
        q = (
            _stream(connect, tmp_path / "in")
            .writeStream.foreach(storm_foreach(topology=str(topo), workers=cluster.workers_arg, delivery="processed"))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        _run(q)
        assert _tuples_in(cluster) == 400
    assert _counts(tmp_path) == {"in": 400, "next": 400}


@pytest.mark.kafka
def test_foreach_storm_foreach_in_real_time_mode_over_kafka(connect: Any, kafka_broker: str, tmp_path: Path) -> None:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    if not any("spark-sql-kafka" in p.name for p in (ROOT / "jars" / "spark").glob("*.jar")):
        pytest.skip("no Spark Kafka connector in jars/spark: scripts/fetch-jars could not reach Maven Central")
    topic = f"connect-rt-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker)
    admin.create_topics([NewTopic(topic, 2, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=kafka_broker, acks="all")
    for i in range(200):
        producer.send(topic, json.dumps({"key": f"k{i % 7}", "n": i}).encode())
    producer.flush()
    producer.close()
    topo = two_stage(tmp_path)
    with LocalCluster(str(topo), 2) as cluster:
        q = (
            connect.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka_broker)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("from_json(cast(value as string), 'key STRING, n BIGINT') as r")
            .selectExpr("r.key as key", "r.n as n")
            .writeStream.outputMode("update")
            .foreach(storm_foreach(topology=str(topo), workers=cluster.workers_arg))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(realTime="5 seconds")
            .start()
        )
        try:
            wait_until(
                lambda: _tuples_in(cluster) >= 200 or q.exception() is not None,
                what="200 rows in the workers' source tasks",
                timeout=120,
                interval=0.2,
            )
            assert q.exception() is None, q.exception()
            assert _tuples_in(cluster) == 200
        finally:
            q.stop()


def _hold_until(path: str) -> Any:
    def hold(df: Any, batch_id: int) -> None:  # keeps its query's trigger active until ``path`` exists
        deadline = time.monotonic() + 120
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)

    return hold


def test_storm_sink_asks_for_query_id_when_two_queries_are_in_a_batch(connect: Any, tmp_path: Path) -> None:
    # Over Connect the foreachBatch function learns its query's id from the one query of the
    # session whose trigger is active; with two at once it cannot tell, and says what to pass.
    topo = two_stage(tmp_path)
    write_json_rows(tmp_path / "in", _rows(10), files=1)
    release = tmp_path / "release"
    holder = (
        _stream(connect, tmp_path / "in")
        .writeStream.foreachBatch(_hold_until(str(release)))
        .queryName("holder")
        .option("checkpointLocation", str(tmp_path / "ck-hold"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        wait_until(
            lambda: holder.status["isTriggerActive"],
            what="the holder query's trigger active",
            timeout=120,
            interval=0.05,
        )
        q = (
            _stream(connect, tmp_path / "in")
            .writeStream.foreachBatch(storm_sink(topology=str(topo), workers="127.0.0.1:1"))
            .queryName("storm")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(Exception, match=r"pass queryId=\.\.\. to storm_sink") as info:
            q.awaitTermination(300)
        assert "holder, storm" in str(info.value)
    finally:
        release.touch()
        holder.awaitTermination(300)
    assert holder.exception() is None


CLIENT_ONLY = """
import json, os, sys, time, urllib.request
from spark_storm.spark import ServerPackageError, register, ship, storm_foreach, storm_sink
from spark_storm.spark.session import connect_session
from spark_storm.cluster.local_cluster import LocalCluster

topo, out = sys.argv[1], {}
def received(cluster):
    total = 0
    for slot in cluster.slots:
        total += cluster.health(slot)["counters"]["source_tuples_in"]
    return total
with LocalCluster(topo, 2) as cluster:
    spark = connect_session("client-only", "local[2]")
    df = spark.range(100).selectExpr("concat('a b ', CAST(id AS STRING)) AS sentence")
    def write():
        df.write.format("storm").mode("append").option("topology", topo).option("workers", cluster.workers_arg).save()
    try:
        write()
    except Exception as exc:
        out["write"] = str(exc).splitlines()[0]
    try:
        register(spark)
    except ServerPackageError as exc:
        out["register"] = str(exc)
    os.makedirs("in", exist_ok=True)
    with open("in/part0.json", "w") as f:
        f.writelines(json.dumps({"sentence": f"c d {i}"}) + "\\n" for i in range(50))
    def sink_query(name):
        return (spark.readStream.schema("sentence string").json(os.path.join(os.getcwd(), "in")).writeStream
                .foreachBatch(storm_sink(topology=topo, workers=cluster.workers_arg))
                .option("checkpointLocation", os.path.join(os.getcwd(), name)).trigger(availableNow=True).start())
    try:
        sink_query("ck-before").awaitTermination(300)
    except Exception as exc:
        out["sink_before_ship"] = " ".join(str(exc).split())
    ship(spark)
    write()
    out["after_ship"] = received(cluster)
    q = sink_query("ck-fb")
    q.awaitTermination(300)
    out["foreach_batch_error"] = str(q.exception()) if q.exception() else None
    out["after_foreach_batch"] = received(cluster)
    q = (spark.readStream.schema("sentence string").json(os.path.join(os.getcwd(), "in")).writeStream
         .foreach(storm_foreach(topology=topo, workers=cluster.workers_arg))
         .option("checkpointLocation", os.path.join(os.getcwd(), "ck-fe")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    out["foreach_error"] = str(q.exception()) if q.exception() else None
    out["after_foreach"] = received(cluster)
    spark.stop()
print("RESULT " + json.dumps(out))
"""


@pytest.mark.timeout(900)  # a client process with a Connect server of its own and four queries
def test_a_server_without_spark_storm_gets_our_error_and_ship_fixes_it(tmp_path: Path) -> None:
    # The server's Python workers run this venv's Python minus this checkout on sys.path: a Spark
    # server where spark-storm is not installed.  Only where spark-storm is installed editable
    # from this checkout (the main run); the floor run installs the wheel into site-packages.
    if not install_spec().startswith("-e "):
        pytest.skip("needs spark-storm installed editable from this checkout (scripts/setup), to hide it")
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        f"import sys\nsys.path[:] = [p for p in sys.path if p.rstrip('/') != {str(ROOT)!r}]\n"
    )
    server_python = tmp_path / "server-python"
    server_python.write_text(f'#!/bin/sh\nPYTHONPATH={hide}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    server_python.chmod(0o755)
    wordcount = tmp_path / "wordcount.yaml"
    wordcount.write_text(
        (ROOT / "conf" / "topologies" / "wordcount.yaml")
        .read_text()
        .replace('report.dir: "./wordcount-report"', f'report.dir: "{tmp_path / "report"}"')
    )
    env = {**os.environ, "PYSPARK_PYTHON": str(server_python)}
    run = subprocess.run(
        [sys.executable, "-c", CLIENT_ONLY, str(wordcount)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    lines = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, run.stdout[-3000:] + run.stderr[-5000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert "DATA_SOURCE_NOT_FOUND" in out["write"]  # Spark's own error: nothing of ours ran yet
    assert "cannot import spark_storm" in out["register"]
    assert "spark_storm.spark.ship(spark)" in out["register"]
    assert sys.executable in out["register"]  # the Python the wrapper runs
    assert "storm_sink: Spark does not know format('storm')" in out["sink_before_ship"]  # ours, naming the fix
    assert "spark_storm.spark.ship(spark)" in out["sink_before_ship"]
    assert out["after_ship"] == 100
    assert out["foreach_batch_error"] is None
    assert out["after_foreach_batch"] == 150
    assert out["foreach_error"] is None
    assert out["after_foreach"] == 200


@pytest.mark.timeout(900)  # a kernel, a Spark Connect server of its own and a 4 s stream: minutes on a busy machine
def test_the_notebook_runs_over_spark_connect(tmp_path: Path) -> None:
    wordcount = tmp_path / "wordcount.yaml"
    wordcount.write_text(
        (ROOT / "conf" / "topologies" / "wordcount.yaml")
        .read_text()
        .replace('report.dir: "./wordcount-report"', f'report.dir: "{tmp_path / "report"}"')
    )
    with LocalCluster(str(wordcount), 2) as cluster:
        outputs, sent = run_notebook(  # the %pip cell runs for real and changes nothing
            tmp_path, cluster, wordcount, SPARK_STORM_WHEEL=install_spec(), STORM_CONNECT="local[2]"
        )
        assert "Spark Connect" in outputs
        assert sent > 0
        assert _tuples_in(cluster) == sent
