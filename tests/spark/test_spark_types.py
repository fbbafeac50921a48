"""Every Spark SQL type a DataFrame holds goes from Spark through a bolt to a bolt on another worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.codec.columnar import rows_of
from tests.integration.bolts import read_values
from tests.support.spark import health

pytestmark = pytest.mark.spark

QUERY = """
SELECT concat('k', id % 7) AS key,
       current_timestamp() AS ts,
       to_timestamp_ntz(concat('2024-02-29 12:00:0', id % 10)) AS ntz,
       date_add(DATE'2024-01-01', CAST(id AS INT)) AS d,
       CAST(id AS DECIMAL(12, 3)) / 7 AS dec,
       CAST(concat('b', id) AS BINARY) AS bin,
       array(id, id + 1) AS arr,
       map('a', id, 'b', -id) AS m,
       named_struct('x', id, 'y', concat('y', id), 'when', DATE'2020-02-29') AS st,
       INTERVAL '1 02:03:04.5' DAY TO SECOND AS iv,
       CAST(id % 100 AS TINYINT) AS tiny, CAST(id AS SMALLINT) AS small, CAST(id AS INT) AS i,
       CAST(id AS FLOAT) / 3 AS f, CAST(id AS DOUBLE) / 3 AS dbl, id % 2 = 0 AS flag,
       CAST(NULL AS STRING) AS nothing
FROM range(300)
"""


def _topology(tmp: Path, fields: list[str]) -> Path:
    topo = {
        "name": "types",
        "conf": {"record.dir": str(tmp / "records")},
        "components": [
            {
                "id": "src",
                "source": True,
                "fields": fields,
                "parallelism": 2,
                "tasks": 4,
                "bolt": "tests.integration.bolts:ValuesForwarder",
            },
            {
                "id": "log",
                "bolt": "tests.integration.bolts:ValuesLog",
                "parallelism": 2,
                "tasks": 4,
                "inputs": [{"from": "src", "grouping": "fields", "fields": ["key"]}],
            },
        ],
    }
    (tmp / "records").mkdir()
    path = tmp / "types.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def test_spark_types_cross_workers_unchanged_and_no_worker_dies(spark: Any, tmp_path: Path) -> None:
    df = spark.sql(QUERY).cache()
    expected = sorted((row for batch in df.toArrow().to_batches() for row in rows_of(batch)), key=lambda r: r[12])
    topo = _topology(tmp_path, df.columns)
    with LocalCluster(str(topo), 2) as cluster:
        df.write.format("storm").mode("append").option("topology", str(topo)).option(
            "workers", cluster.workers_arg
        ).option("delivery", "processed").save()
        for slot in cluster.slots:  # every worker still runs, without a bolt error
            h = health(cluster, slot)
            assert h["errors"] == [], h["errors"]
        received = sum(h["counters"]["tuples_in"] for h in (health(cluster, s) for s in cluster.slots))
        assert received > 300  # the source's rows, then those forwarded to the other worker
    got = sorted(read_values(tmp_path / "records"), key=lambda r: r[12])
    assert len(got) == 300
    assert got == expected
    ts = got[0][1]
    assert ts.tzinfo is not None  # TimestampType arrives as an aware datetime in the session's zone
    assert isinstance(got[0][7], dict)  # MapType as a dict, as pyspark gives it


def test_the_sessions_python_workers_import_the_installed_pyspark_not_its_zip(spark: Any) -> None:
    from pyspark.sql.functions import udf

    where = udf(lambda _: __import__("pyspark").__file__, "string")
    found = spark.range(1).select(where("id")).collect()[0][0]
    assert "pyspark.zip" not in found, f"a Python worker imported pyspark from {found}: it compiles it at every start"
