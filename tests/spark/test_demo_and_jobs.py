"""The README's demo command and the spark-submit job, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from spark_storm.cluster.local_cluster import LocalCluster
from tests.support import ROOT, wait_until, wordcount
from tests.support.spark import health, run_notebook, run_wordcount_job

pytestmark = pytest.mark.spark


def test_demo_streams_and_ends_with_sent_equal_processed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "spark_storm.cli", "demo", "--seconds", "6", "--rows-per-second", "500"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "sent == processed: OK" in out.stdout
    sent = int(out.stdout.split("sentences sent by Spark: ")[1].split(";")[0].replace(",", ""))
    assert sent > 0
    assert "top words (committed state):" in out.stdout
    assert "counts exact: OK" in out.stdout
    assert "tuples/s" in out.stdout
    assert "UI: http://127.0.0.1:" in out.stdout


def test_the_windows_demo_prints_windows_as_they_close_and_each_equals_sparks() -> None:
    args = ["demo", "--windows", "--window", "3", "--seconds", "12", "--rows-per-second", "300", "--kill-worker"]
    out = subprocess.run([sys.executable, "-m", "spark_storm.cli", *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "SIGKILLed worker" in out.stdout
    closed = [line for line in out.stdout.splitlines() if line.startswith("window ")]
    assert closed, out.stdout[-3000:]
    assert all(" words  top: " in line for line in closed)
    committed = int(out.stdout.split("windows closed and committed: ")[1].split()[0])
    assert committed >= 2
    assert f"windows exact: OK ({committed} windows" in out.stdout


def test_a_stop_that_cuts_a_micro_batch_runs_the_query_again_to_finish_it(spark: Any, tmp_path: Path) -> None:
    """A sink slower than the trigger leaves no moment between two micro-batches (a loaded machine).

    The demos' stop then cuts one; it must start the query again with an availableNow
    trigger, which runs the cut batch to its end, so that every row Spark reports sent is
    of a finished batch (test_demo_on_spark.py failed on "stopped mid-batch" under load).
    """
    from spark_storm.demos.scaffold import stop_between_batches
    from spark_storm.spark.progress import Sent

    listener = Sent(1.0)
    finished: dict[int, int] = {}  # batch id -> rows, for every batch the sink ran to its end

    def slow(df: Any, batch_id: int) -> None:
        rows = df.count()
        time.sleep(1.5)
        finished[batch_id] = rows

    def start(finish: bool = False) -> Any:
        writer = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 50)
            .load()
            .writeStream.foreachBatch(slow)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
        )
        if finish:
            return writer.trigger(availableNow=True).start()
        spark.streams.addListener(listener)
        query = writer.trigger(processingTime="1 second").start()
        listener.query_id = str(query.id)
        return query

    query = start()
    try:
        wait_until(lambda: listener.batches >= 2, what="two micro-batches with rows", timeout=120)
        assert stop_between_batches(query, listener, timeout=0.5, finish=lambda: start(finish=True))
    finally:
        spark.streams.removeListener(listener)
        for running in spark.streams.active:
            running.stop()
    assert listener.rows == sum(finished.values()) > 0
    assert listener.last_batch_id == max(finished)


def test_the_demo_failure_line_names_worker_logs_that_exist(tmp_path: Path) -> None:
    from spark_storm.demos.scaffold import logs_line

    # The demo keeps its workers' logs in its own folder, and a MISMATCH line names them.
    cluster = LocalCluster(str(wordcount(tmp_path)), 1, work_dir=tmp_path / "demo" / "workers")
    with cluster:
        (slot,) = cluster.slots
        log = tmp_path / "demo" / "workers" / f"worker-{slot.port}.log"
        line = logs_line(cluster, {slot: 0})
        assert line == f"the worker logs: {log}"
        assert "listening" in log.read_text()
        assert logs_line(cluster, {slot: 1}) == f"the worker logs: {log} (exit code 1)"


def test_wordcount_job_runs_under_spark_submit(tmp_path: Path) -> None:
    topology = wordcount(tmp_path)
    with LocalCluster(str(topology), 2) as cluster:
        _, sent = run_wordcount_job(["--master", "local[2]"], topology, cluster)
        received = sum(health(cluster, s)["counters"]["source_tuples_in"] for s in cluster.slots)
        assert received == sent
    finals = [
        json.loads(line)["final"]
        for p in (tmp_path / "report").glob("*.jsonl")
        for line in p.read_text().splitlines()
        if "final" in line
    ]
    assert finals
    assert sum(finals[0].values()) > 0


def test_notebook_runs_with_nbconvert_against_local_spark(tmp_path: Path) -> None:
    topology = wordcount(tmp_path)
    with LocalCluster(str(topology), 2) as cluster:
        # An editable install of this checkout: the %pip cell runs for real, and leaves the
        # development install as it was (Databricks users give a wheel path here).
        _, sent = run_notebook(tmp_path, cluster, topology, SPARK_STORM_WHEEL=f"-e {ROOT}")
        assert sent > 0
        received = sum(health(cluster, s)["counters"]["source_tuples_in"] for s in cluster.slots)
        assert received == sent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once for the tests below."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return next(out.glob("spark_storm-*.whl"))


def test_the_wheel_ships_the_runtime_files(wheel: Path) -> None:
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    for needed in (
        "pyspark_storm.py",
        "spark_storm/defaults.yaml",
        "spark_storm/examples/corpus.txt",
        "spark_storm/examples/wordcount.yaml",
        "spark_storm/py.typed",
    ):
        assert needed in names


def test_an_installed_wheel_registers_format_storm_by_itself(wheel: Path, tmp_path: Path) -> None:
    # Installed from the wheel (not this checkout), format("storm") resolves with no register():
    # Spark finds the pyspark_storm module on its own.  The bad topology path proves our data
    # source answered (rather than DATA_SOURCE_NOT_FOUND).
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target), str(wheel)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    script = (
        "import os, sys\n"
        "os.environ['PYSPARK_PYTHON'] = sys.executable\n"
        "import spark_storm\n"
        f"assert spark_storm.__file__.startswith({str(target)!r}), spark_storm.__file__\n"
        "from pyspark.sql import SparkSession\n"
        "spark = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
        "try:\n"
        "    spark.range(3).write.format('storm').mode('append').option('topology', '/no/such.yaml').save()\n"
        "except Exception as exc:\n"
        "    print('ERROR', exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path
    )
    assert "cannot read topology file '/no/such.yaml'" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
