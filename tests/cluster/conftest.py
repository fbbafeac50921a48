"""Fixtures of the cluster tier: the real ZooKeeper with a chroot per test, daemons as real processes.

Its helpers are in tests/support/cluster.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

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
