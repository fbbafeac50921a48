"""What the docs' examples run against (tests/docs/test_examples.py): the real parts, started on demand.

Every Python block of README.md and docs/ runs as a test (Sybil, in the order of its page, one
namespace per page).  A block that needs Spark or a running topology gets it from a hidden
set-up block on its page, ``<!-- invisible-code-block: python ... -->``, which calls this
module through the ``docs`` name every page's namespace holds:

    spark = docs.spark()                                  # the docs tier's one local SparkSession
    workers = docs.cluster("conf/topologies/wordcount.yaml").workers_arg   # a real local cluster
    chk = docs.path("chk")                                # a fresh directory of this page

so the code a reader sees runs unchanged against a real local cluster and a real Spark, and a
broken example fails the suite.  Whatever a page started (queries, clusters) is stopped after it.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from spark_storm.cluster.local_cluster import LocalCluster
from tests.support import ROOT

#: The pages whose examples run: the README and every page of the site.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_SPARK_CALL = re.compile(r"\bdocs\.spark\(")

_session: Any = None


def needs_spark(page: Path) -> bool:
    """Whether a page's examples start Spark (its set-up calls ``docs.spark()``)."""
    return bool(_SPARK_CALL.search(page.read_text()))


def stop_spark() -> None:
    """Stop the docs tier's SparkSession, if one was started."""
    global _session
    if _session is not None:
        _session.stop()
        _session = None


class DocsEnv:
    """One page's real parts: created before its first block, stopped after its last."""

    def __init__(self, page: Path) -> None:
        self.page = page
        self.tmp = Path(tempfile.mkdtemp(prefix=f"docs-{page.stem}-"))
        self._clusters: list[LocalCluster] = []

    def spark(self) -> Any:
        """The docs tier's local SparkSession (``local[2]``, one for every page), with format("storm") registered."""
        global _session
        if _session is None:
            from spark_storm.spark import register
            from tests.support.spark import spark_session

            _session = spark_session("spark-storm-docs", conf={"spark.sql.shuffle.partitions": "2"})
            register(_session)
        return _session

    def cluster(self, topology: str, workers: int = 2) -> LocalCluster:
        """A running local cluster of ``topology`` (a path from the repository's root), stopped after the page."""
        path = ROOT / topology
        cluster = LocalCluster(str(path), workers, work_dir=self.tmp / f"cluster-{len(self._clusters)}").start()
        self._clusters.append(cluster)
        return cluster

    def path(self, name: str) -> str:
        """A fresh directory (or file path) of this page: ``name`` under its temporary folder."""
        return str(self.tmp / name)

    def wait_progress(self, query: Any, rows: int = 1, timeout: float = 90.0) -> dict[str, Any]:
        """Wait until ``query`` has sent at least ``rows`` rows through its batches; its progress then.

        Fails with the query's own exception when it died, and on the deadline.
        """
        deadline = time.monotonic() + timeout
        sent = 0
        while time.monotonic() < deadline:
            if query.exception() is not None:
                msg = f"the page's query failed: {query.exception()}"
                raise AssertionError(msg)
            sent = sum(p["numInputRows"] for p in query.recentProgress)
            if sent >= rows:
                return dict(query.lastProgress)
            query.awaitTermination(0.2)
        msg = f"the page's query sent {sent} rows in {timeout:.0f} s, wanted {rows}"
        raise AssertionError(msg)

    def close(self) -> None:
        """Stop every streaming query the page left running and every cluster it started."""
        if _session is not None:
            for query in _session.streams.active:
                query.stop()
        for cluster in self._clusters:
            cluster.stop(10.0)
        shutil.rmtree(self.tmp, ignore_errors=True)
