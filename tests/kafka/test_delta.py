"""Delta source -> format("storm") -> workers -> Kafka -> Delta results: exact, resumable, idempotent.

Real Delta tables in a temp dir, the real broker, real worker processes; the jobs'
``run(spark, args)`` functions on this module's session (spark-submit is covered in
test_spark_kafka.py).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from jobs import delta_to_storm, results_to_delta
from spark_storm.cluster.local_cluster import LocalCluster
from tests.support.kafka import kafka_result_topology

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _rows(start: int, stop: int) -> list[tuple[str, int]]:
    return [(f"w{i % 7}", i) for i in range(start, stop)]


def _counts(spark: Any, table: str) -> dict[str, int]:
    rows = spark.read.format("delta").load(table).groupBy("word").count().collect()
    return {r["word"]: r["count"] for r in rows}


def _expected(stop: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for word, _ in _rows(0, stop):
        out[word] = out.get(word, 0) + 1
    return out


def test_delta_to_storm_to_delta_results(spark: Any, kafka_broker: str, tmp_path: Path) -> None:
    from delta.tables import DeltaTable

    tag = uuid.uuid4().hex[:8]
    source, results = str(tmp_path / "source"), str(tmp_path / "results")
    result_topic = f"delta-results-{tag}"
    topology = kafka_result_topology(tmp_path, "delta-roundtrip", kafka_broker, result_topic)
    spark.createDataFrame(_rows(0, 240), "word STRING, n BIGINT").write.format("delta").save(source)

    with LocalCluster(str(topology), 2) as cluster:
        to_storm = delta_to_storm.parse_args(
            [
                "--table",
                source,
                "--topology",
                str(topology),
                "--workers",
                cluster.workers_arg,
                "--available-now",
                "--checkpoint",
                str(tmp_path / "ck-to-storm"),
            ]
        )
        to_delta = results_to_delta.parse_args(
            [
                "--bootstrap-servers",
                kafka_broker,
                "--topic",
                result_topic,
                "--schema",
                "word STRING, n BIGINT",
                "--table",
                results,
                "--checkpoint",
                str(tmp_path / "ck-to-delta"),
                "--available-now",
            ]
        )
        assert delta_to_storm.run(spark, to_storm) == 240
        assert results_to_delta.run(spark, to_delta) == 240
        table = spark.read.format("delta").load(results)
        assert table.count() == 240
        assert sorted(r["n"] for r in table.select("n").collect()) == list(range(240))
        assert _counts(spark, results) == _expected(240)

        # A crash after Delta committed the last batch but before Spark marked it done:
        # the rerun writes that batch again with the same txnVersion, and Delta skips it.
        commits = sorted((tmp_path / "ck-to-delta" / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
        commits[-1].unlink()
        (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)  # Hadoop's checksum file
        version = DeltaTable.forPath(spark, results).history(1).collect()[0]["version"]
        results_to_delta.run(spark, to_delta)
        assert commits[-1].exists(), "Spark ran the uncommitted batch again (and marked it done)"
        assert DeltaTable.forPath(spark, results).history(1).collect()[0]["version"] == version
        assert spark.read.format("delta").load(results).count() == 240

        # New rows in the source table: only they travel, end to end.
        spark.createDataFrame(_rows(240, 300), "word STRING, n BIGINT").write.format("delta").mode("append").save(
            source
        )
        assert delta_to_storm.run(spark, to_storm) == 60
        assert results_to_delta.run(spark, to_delta) == 60
        assert spark.read.format("delta").load(results).count() == 300
        assert _counts(spark, results) == _expected(300)
