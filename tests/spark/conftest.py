"""Fixtures of the Spark tier (its helpers: tests/support/spark.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.spark import spark_session


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from spark_storm.spark import register

    session = spark_session("spark-storm-tests", conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "100"})
    register(session)  # auto-registration from an installed wheel is tested in test_demo_and_jobs.py
    yield session
    session.stop()
