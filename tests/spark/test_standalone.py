"""The wordcount job on a real Spark standalone cluster (master + worker from pyspark's classes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_storm.worker.cluster import LocalCluster
from tests.spark.conftest import health
from tests.spark.test_demo_and_jobs import ROOT, _wordcount

pytestmark = pytest.mark.spark


def test_wordcount_job_runs_unchanged_on_a_standalone_cluster(spark_standalone: str, tmp_path: Path) -> None:
    wordcount = _wordcount(tmp_path)
    spark_submit = Path(sys.executable).parent / "spark-submit"
    with LocalCluster(str(wordcount), 2) as cluster:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
        out = subprocess.run(
            [
                str(spark_submit),
                "--master",
                spark_standalone,
                "--conf",
                "spark.driver.host=127.0.0.1",
                "--conf",
                "spark.ui.enabled=false",
                "--total-executor-cores",
                "2",
                "--executor-memory",
                "1g",
                str(ROOT / "jobs" / "wordcount_to_storm.py"),
                "--topology",
                str(wordcount),
                "--workers",
                cluster.workers_arg,
                "--seconds",
                "2",
                "--min-batches",
                "2",
                "--rows-per-second",
                "200",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        # the job ran on the cluster's executors, not in the driver
        assert f"Connecting to master {spark_standalone}" in out.stderr
        assert "Granted executor ID" in out.stderr
        sent = int(out.stdout.split("sent ")[-1].split()[0])
        assert sent > 0
        received = sum(health(cluster, s)["counters"]["source_tuples_in"] for s in cluster.slots)
        assert received == sent
