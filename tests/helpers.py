"""Test helpers: wait on conditions with deadlines, never fixed sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml


def wait_until(pred: Callable[[], object], *, what: str, timeout: float = 10.0, interval: float = 0.005) -> None:
    """Poll ``pred`` every ``interval`` s until it is truthy; fail the test naming ``what`` after ``timeout`` s.

    The default polls often (in-process state is cheap to look at); a ``pred`` that asks
    another process (ZooKeeper, a log file, an HTTP endpoint) each time passes a longer
    ``interval`` so the polling does not take the CPU the processes under test need.
    """
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout}s waiting for {what}")
        time.sleep(interval)


def kafka_result_topology(directory: Path, name: str, broker: str, topic: str) -> Path:
    """Write a topology whose source ``in`` (word, n) hands every tuple to Kafka ``topic``."""
    topo = {
        "name": name,
        "components": [
            {
                "id": "in",
                "source": True,
                "fields": ["word", "n"],
                "parallelism": 2,
                "bolt": "spark_storm.examples.kafka_bolt:KafkaResultBolt",
                "conf": {"kafka.bootstrap": broker, "kafka.topic": topic, "kafka.key.field": "word"},
            }
        ],
    }
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def spark_session(app: str, conf: dict[str, str] | None = None) -> Any:
    """A local SparkSession for a test module, with every connector jar scripts/fetch-jars got.

    Spark puts ``spark.jars`` on the driver's classpath only when its JVM starts, and one
    JVM serves every session of the pytest process: so every module asks for the same jars,
    and whichever starts the JVM first makes Kafka and Delta available to the others.
    """
    from spark_storm.spark.session import local_session

    jars = sorted(str(p) for p in (Path(__file__).resolve().parents[1] / "jars" / "spark").glob("*.jar"))
    return local_session(app, jars=jars, conf=conf)
