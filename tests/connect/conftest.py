"""Fixtures of the Spark Connect tier (its helpers: tests/support/connect.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import ROOT


@pytest.fixture(scope="module")
def connect() -> Iterator[Any]:
    """A Spark Connect client on pyspark's own local Connect server (``remote("local[2,4]")``), per module.

    No ``register()``: the server finds ``format("storm")`` by itself, as it would where
    spark-storm is installed on a cluster.  The server is given every connector jar, as the
    classic modules are (one JVM serves the whole pytest process: tests/support/spark.py).
    """
    from spark_storm.spark.session import connect_session

    jars = sorted(str(p) for p in (ROOT / "jars" / "spark").glob("*.jar"))
    session = connect_session(
        "spark-storm-connect-tests",
        "local[2,4]",
        jars=jars,
        conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "100"},
    )
    session.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")  # a runtime setting: per session
    yield session
    session.stop()
