"""A user's own job, run from its own directory after the README's set-up, finds format("storm")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

JOB = """
import os, pkgutil, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
print("FOUND", [m.name for m in pkgutil.iter_modules() if m.name.startswith("pyspark_")])
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
try:  # no register(): Spark's own scan must find pyspark_storm
    spark.range(3).write.format("storm").mode("append").option("topology", "/no/such.yaml").save()
except Exception as exc:
    print("ERROR", " ".join(str(exc).split()))
spark.stop()
"""


def test_format_storm_is_found_from_any_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", JOB], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env, check=False
    )
    assert "FOUND ['pyspark_storm', 'pyspark_storm_state']" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    # Our data source answered (it could not read the topology), not Spark's DATA_SOURCE_NOT_FOUND.
    assert "cannot read topology file '/no/such.yaml'" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]
