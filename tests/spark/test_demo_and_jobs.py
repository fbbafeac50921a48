"""The README's demo command and the spark-submit job, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_storm.worker.cluster import LocalCluster
from tests.spark.conftest import health

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]


def test_demo_streams_and_ends_with_sent_equal_processed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "spark_storm.cli", "demo", "--seconds", "6", "--rows-per-second", "500"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "sent == processed: OK" in out.stdout
    assert "top words:" in out.stdout
    assert "tuples/s" in out.stdout


def test_wordcount_job_runs_under_spark_submit(tmp_path: Path) -> None:
    wordcount = tmp_path / "wordcount.yaml"
    text = (ROOT / "conf" / "topologies" / "wordcount.yaml").read_text()
    wordcount.write_text(text.replace('report.dir: "./wordcount-report"', f'report.dir: "{tmp_path / "report"}"'))
    spark_submit = Path(sys.executable).parent / "spark-submit"
    with LocalCluster(str(wordcount), 2) as cluster:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        out = subprocess.run(
            [
                str(spark_submit),
                "--master",
                "local[2]",
                str(ROOT / "jobs" / "wordcount_to_storm.py"),
                "--topology",
                str(wordcount),
                "--workers",
                cluster.workers_arg,
                "--seconds",
                "4",
                "--rows-per-second",
                "200",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        sent = int(out.stdout.split("sent ")[-1].split()[0])
        assert sent > 0
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
