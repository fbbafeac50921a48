"""The wordcount job on a real Spark standalone cluster (master + worker from pyspark's classes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_storm.cluster.local_cluster import LocalCluster
from tests.support import wordcount
from tests.support.spark import health, run_wordcount_job

pytestmark = pytest.mark.spark


def test_wordcount_job_runs_unchanged_on_a_standalone_cluster(spark_standalone: str, tmp_path: Path) -> None:
    topology = wordcount(tmp_path)
    with LocalCluster(str(topology), 2) as cluster:
        master = ["--master", spark_standalone, "--conf", "spark.driver.host=127.0.0.1", "--conf"]
        master += ["spark.ui.enabled=false", "--total-executor-cores", "2", "--executor-memory", "1g"]
        out, sent = run_wordcount_job(master, topology, cluster, env={"SPARK_LOCAL_IP": "127.0.0.1"})
        # the job ran on the cluster's executors, not in the driver
        assert f"Connecting to master {spark_standalone}" in out.stderr
        assert "Granted executor ID" in out.stderr
        received = sum(health(cluster, s)["counters"]["source_tuples_in"] for s in cluster.slots)
        assert received == sent
