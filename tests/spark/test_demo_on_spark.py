"""``spark-storm demo --on-spark`` (what ``scripts/demo --on-spark`` runs): the demo's own local Spark hosts the
workers as its tasks, and the demo ends with the same lines as with a local cluster."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(900)]


def test_the_demo_on_spark_ends_with_sent_equal_processed_and_exact_counts() -> None:
    args = ["demo", "--on-spark", "--seconds", "8", "--rows-per-second", "100", "--kill-worker"]
    out = subprocess.run([sys.executable, "-m", "spark_storm.cli", *args], capture_output=True, text=True, timeout=800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "hosted by Spark: ZooKeeper 127.0.0.1:" in out.stdout
    assert "supervisor tasks of Spark job group spark-storm-wordcount" in out.stdout
    assert "SIGKILLed the supervisor task of worker 127.0.0.1:" in out.stdout  # Spark ran it again
    assert "UI: http://127.0.0.1:" in out.stdout
    assert "counts exact: OK" in out.stdout
    # the killed task's input was replayed: sent == processed is not checked then, the counts still are
    assert "sent == processed: not checked" in out.stdout


def test_the_demo_on_spark_without_a_kill_checks_sent_equals_processed() -> None:
    args = ["demo", "--on-spark", "--seconds", "6", "--rows-per-second", "100", "--workers", "1"]
    out = subprocess.run([sys.executable, "-m", "spark_storm.cli", *args], capture_output=True, text=True, timeout=800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "sent == processed: OK" in out.stdout
    assert "counts exact: OK" in out.stdout
