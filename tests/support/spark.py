"""The Spark tier's helpers: a local session with the connector jars, JSON input files, a two-stage recording topology, what its bolts recorded,
and the wordcount job run by ``spark-submit`` (local and standalone masters)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.reports import WorkerMetrics
from spark_storm.topology import Slot
from tests.support import ROOT

RECORDING_BOLT = "tests.integration.bolts:RecordingBolt"


def spark_session(app: str, conf: dict[str, str] | None = None) -> Any:
    """A local SparkSession for a test module, with every connector jar scripts/fetch-jars got.

    Spark puts ``spark.jars`` on the driver's classpath only when its JVM starts, and one
    JVM serves every session of the pytest process: so every module asks for the same jars,
    and whichever starts the JVM first makes Kafka and Delta available to the others.
    """
    from spark_storm.spark.session import local_session

    jars = sorted(str(p) for p in (ROOT / "jars" / "spark").glob("*.jar"))
    return local_session(app, jars=jars, conf=conf)


def write_json_rows(directory: Path, rows: list[dict[str, Any]], files: int = 4, prefix: str = "part") -> None:
    """``rows`` as JSON lines spread over ``files`` files ``<prefix><i>.json`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    per = (len(rows) + files - 1) // files
    for f in range(files):
        chunk = rows[f * per : (f + 1) * per]
        if chunk:
            (directory / f"{prefix}{f}.json").write_text("".join(json.dumps(r) + "\n" for r in chunk))


def two_stage(tmp: Path, name: str = "sparktest", conf: dict[str, Any] | None = None) -> Path:
    """in (source, fields key) -> next (fields key), both recording what they got under ``tmp/records``."""
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
                "bolt": RECORDING_BOLT,
                "grouping": "fields",
                "grouping_fields": ["key"],
            },
            {
                "id": "next",
                "bolt": RECORDING_BOLT,
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
    """What each task of :func:`two_stage`'s topology recorded: component -> task -> record."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for f in (tmp / "records").glob("*.json"):
        rec = json.loads(f.read_text())
        out.setdefault(rec["component"], {})[rec["task"]] = rec
    return out


def run_wordcount_job(
    master: list[str], wordcount: Path, cluster: LocalCluster, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], int]:
    """``spark-submit <master args> jobs/wordcount_to_storm.py`` into ``cluster``; the run and rows it sent."""
    spark_submit = Path(sys.executable).parent / "spark-submit"
    job = [str(ROOT / "jobs" / "wordcount_to_storm.py"), "--topology", str(wordcount), "--workers", cluster.workers_arg]
    job += ["--seconds", "2", "--min-batches", "2", "--rows-per-second", "200"]
    out = subprocess.run(
        [str(spark_submit), *master, *job],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    sent = int(out.stdout.split("sent ")[-1].split()[0])
    assert sent > 0
    return out, sent


def run_notebook(tmp: Path, cluster: LocalCluster, topology: Path, **env: str) -> tuple[str, int]:
    """Execute jobs/notebooks/storm_stream.ipynb with nbconvert against ``cluster`` for a 4 s stream.

    ``env`` adds to the notebook's environment (``SPARK_STORM_WHEEL``, ``STORM_CONNECT``).
    Returns the text of every cell's output and the rows its last cell says it sent.
    """
    out = tmp / "executed.ipynb"
    run = subprocess.run(
        [
            *(sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute"),
            *("--ExecutePreprocessor.timeout=600", "--output", str(out)),
            str(ROOT / "jobs" / "notebooks" / "storm_stream.ipynb"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "STORM_TOPOLOGY": str(topology),
            "STORM_WORKERS": cluster.workers_arg,
            "STORM_SECONDS": "4",
            **env,
        },
        cwd=tmp,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    outputs = "".join(
        "".join(o.get("text", "")) for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", [])
    )
    return outputs, int(outputs.split("SENT ")[-1].split()[0])
