"""Fixtures of the cluster tier: the real ZooKeeper with a chroot per test, daemons as real processes.

Its helpers are in tests/support/cluster.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_storm.cluster.state import ClusterState
from tests.support.cluster import FAST, Daemons


@pytest.fixture
def zk(zookeeper: str) -> str:
    """The session's ZooKeeper with a chroot of this test's own."""
    return f"{zookeeper}/test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def state(zk: str) -> Iterator[ClusterState]:
    with ClusterState(zk, FAST) as st:
        yield st


@pytest.fixture
def daemons(tmp_path: Path, zk: str) -> Iterator[Daemons]:
    ds = Daemons(tmp_path, zk)
    yield ds
    ds.close()


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A classic SparkSession per module with format("storm") registered (small Arrow batches)."""
    from spark_storm.spark import register
    from tests.support.spark import spark_session

    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    session = spark_session(f"spark-storm-{name}", conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "100"})
    register(session)
    yield session
    session.stop()


@pytest.fixture
def driver_sessions() -> Iterator[None]:
    """Close the ZooKeeper sessions the Spark driver opened to read assignments, after the test."""
    from spark_storm.spark.assignments import close_sessions

    yield
    close_sessions()
