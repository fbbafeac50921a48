from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def connect() -> Iterator[Any]:
    """A Spark Connect client on pyspark's own local Connect server (``remote("local[2,4]")``), per module.

    No ``register()``: the server finds ``format("storm")`` by itself, as it would where
    spark-storm is installed on a cluster.  The server is given every connector jar, as the
    classic modules are (one JVM serves the whole pytest process: tests/helpers.py).
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


def install_spec() -> str:
    """What ``pip install`` gets spark-storm from here: ``-e ROOT`` (editable) or the floor run's wheel."""
    # Not importlib.metadata: the checkout's own spark_storm.egg-info shadows the installed metadata.
    if not (Path(sysconfig.get_paths()["purelib"]) / "spark_storm" / "__init__.py").exists():
        return f"-e {ROOT}"
    wheels = sorted(Path(os.environ.get("SPARK_STORM_DIST", ROOT / ".venv-floor" / "dist")).glob("*.whl"))
    if not wheels:
        pytest.fail("spark-storm is installed from a wheel, but SPARK_STORM_DIST holds none (scripts/test-floor)")
    return str(wheels[-1])
