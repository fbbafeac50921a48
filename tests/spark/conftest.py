from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_storm.reports import WorkerMetrics
from spark_storm.topology import Slot
from spark_storm.worker.local_cluster import LocalCluster
from tests.helpers import spark_session

BOLT = "tests.integration.bolts:RecordingBolt"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from spark_storm.spark import register

    session = spark_session("spark-storm-tests", conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "100"})
    register(session)  # auto-registration from an installed wheel is tested in test_demo_and_jobs.py
    yield session
    session.stop()


def write_json_rows(directory: Path, rows: list[dict[str, Any]], files: int = 4, prefix: str = "part") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    per = (len(rows) + files - 1) // files
    for f in range(files):
        chunk = rows[f * per : (f + 1) * per]
        if chunk:
            (directory / f"{prefix}{f}.json").write_text("".join(json.dumps(r) + "\n" for r in chunk))


def two_stage(tmp: Path, name: str = "sparktest", conf: dict[str, Any] | None = None) -> Path:
    topo = {
        "name": name,
        "conf": {"record.dir": str(tmp / "records"), **(conf or {})},
        "components": [
            {
                "id": "in",
                "source": True,
                "fields": ["key", "n"],
                "parallelism": 2,
                "tasks": 4,
                "bolt": BOLT,
                "grouping": "fields",
                "grouping_fields": ["key"],
            },
            {
                "id": "next",
                "bolt": BOLT,
                "parallelism": 2,
                "inputs": [{"from": "in", "grouping": "fields", "fields": ["key"]}],
            },
        ],
    }
    (tmp / "records").mkdir(exist_ok=True)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def health(cluster: LocalCluster, slot: Slot) -> WorkerMetrics:
    return cluster.health(slot)


def records(tmp: Path) -> dict[str, dict[int, dict[str, Any]]]:
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for f in (tmp / "records").glob("*.json"):
        rec = json.loads(f.read_text())
        out.setdefault(rec["component"], {})[rec["task"]] = rec
    return out
