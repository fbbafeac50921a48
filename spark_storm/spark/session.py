"""A local SparkSession for the demo, jobs and tests (spark-submit users bring their own)."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

__all__ = ["local_session"]


def local_session(app: str, master: str = "local[2,4]", **conf: str) -> SparkSession:
    """Build (or get) a small local session.

    ``local[2,4]`` runs 2 cores and lets a failed task be retried up to 4 times, as a
    cluster would (plain ``local[2]`` never retries).  Spark's Python workers run this
    interpreter, so they see the same installed packages.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
