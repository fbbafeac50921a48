"""Windows against Spark itself: a windowed topology fed by format("storm") ends with Spark's answer.

The oracle is Spark's own ``groupBy(window(ts, "6 seconds", "2 seconds"), "user").count()`` (and
``session_window``) over the same files, row for row.  Event time comes from a Spark
``TimestampType`` column, and from epoch milliseconds.  Every query runs at
``delivery=processed`` with the default ``ackTimeoutMs``: a windowed tuple is acked when it
joins its window, so no micro-batch waits for a later one to close its windows.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest

from spark_storm.cluster.local_cluster import LocalCluster
from tests.support.spark import write_json_rows
from tests.support.windows import flush_rows, rows_of, window_results, window_topology

pytestmark = pytest.mark.spark

FILES = 4
DEFAULT_ACK_TIMEOUT_MS = 60_000


def _write(src: Path, *, millis: bool) -> None:
    """One file per micro-batch, then the file whose events pass every watermark.

    Spark's file source takes new files oldest first: the files get increasing modification
    times, so the micro-batches come in event-time order (as a stream's would).
    """

    def row(r: list[Any]) -> dict[str, Any]:
        ts = r[0] if millis else dt.datetime.fromtimestamp(r[0] / 1000, tz=dt.UTC).isoformat()
        return {"ts": ts, "user": r[1], "v": r[2]}

    for f in range(FILES):
        write_json_rows(src, [row(r) for r in rows_of(f, 300)], files=1, prefix=f"part{f}-")
    write_json_rows(src, [row(r) for r in flush_rows(FILES)], files=1, prefix="part9-")
    for i, path in enumerate(sorted(src.iterdir())):
        os.utime(path, (1_700_000_000 + i * 10, 1_700_000_000 + i * 10))


def _schema(millis: bool) -> str:
    return f"ts {'long' if millis else 'timestamp'}, user string, v long"


def _spark_answer(spark: Any, src: Path, millis: bool, session: bool) -> dict[tuple[int, int, Any], int]:
    from pyspark.sql import functions as F

    df = spark.read.schema(_schema(millis)).json(str(src)).where("v >= 0")
    ts = F.timestamp_millis("ts") if millis else F.col("ts")
    window = F.session_window(ts, "700 milliseconds") if session else F.window(ts, "6 seconds", "2 seconds")
    counted = df.groupBy(window.alias("w"), "user").count()
    rows = counted.select(
        F.unix_millis("w.start").alias("s"), F.unix_millis("w.end").alias("e"), "user", "count"
    ).collect()
    return {(r["s"], r["e"], r["user"]): r["count"] for r in rows}


@pytest.mark.parametrize(
    ("millis", "session"),
    [(False, False), (True, False), (False, True)],
    ids=["timestamp-sliding", "epoch-millis-sliding", "timestamp-session"],
)
def test_windowed_topology_equals_sparks_window_row_for_row(
    spark: Any, tmp_path: Path, millis: bool, session: bool
) -> None:
    src = tmp_path / "in"
    _write(src, millis=millis)
    window: dict[str, Any] = (
        {"session_gap": "700ms", "timestamp_field": "ts", "lag": "3s", "key": "user"}
        if session
        else {"length": "6s", "sliding": "2s", "timestamp_field": "ts", "lag": "3s", "key": "user"}
    )
    topo = window_topology(tmp_path, window)
    with LocalCluster(str(topo), 2) as cluster:
        stream = spark.readStream.schema(_schema(millis)).option("maxFilesPerTrigger", 1).json(str(src))
        q = (
            stream.writeStream.format("storm")
            .option("topology", str(topo))
            .option("workers", cluster.workers_arg)
            .option("delivery", "processed")  # with the default ackTimeoutMs
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
        took = [p["durationMs"].get("triggerExecution", 0) for p in q.recentProgress if p["numInputRows"]]
        assert len(took) == FILES + 1
        assert max(took) < DEFAULT_ACK_TIMEOUT_MS / 2, f"a micro-batch waited on its windows: {took} ms"
        got, conflicts = window_results(tmp_path / "state", cluster.topology.name, cluster.plan)
    assert got == _spark_answer(spark, src, millis, session)
    assert conflicts == 0
