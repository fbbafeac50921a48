"""The project's own Kafka broker: started by the fixture, used for real with kafka-python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.kafka


def test_broker_round_trips_messages(kafka_broker: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka_broker, acks="all")
    for i in range(200):
        producer.send("spark-storm-smoke", key=str(i % 4).encode(), value=f"m{i}".encode())
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(
        "spark-storm-smoke", bootstrap_servers=kafka_broker, auto_offset_reset="earliest", consumer_timeout_ms=15000
    )
    values = sorted(int(m.value[1:]) for m in consumer)
    consumer.close()
    assert values == list(range(200))


def test_kafka_cli_start_status_stop(kafka_jars: Path, tmp_path: Path) -> None:
    state = str(tmp_path)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "spark_storm.cli", "kafka", *args, "--dir", state],
            capture_output=True,
            text=True,
            timeout=300,
        )

    started = cli("start")
    assert started.returncode == 0, started.stderr[-2000:]
    assert "kafka broker ready on 127.0.0.1:" in started.stdout
    assert cli("status").returncode == 0
    stopped = cli("stop")
    assert "kafka broker stopped" in stopped.stdout
    assert cli("status").returncode == 1


def test_cluster_ids_never_start_with_a_dash() -> None:
    # The storage tool reads "-t -abc..." as a missing value: one random id in 64 failed the start.
    import base64
    import uuid

    from spark_storm.tools.kafka_broker import new_cluster_id

    ids = [new_cluster_id() for _ in range(5000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(uuid.UUID(bytes=base64.urlsafe_b64decode(i + "==")) for i in ids)
    assert len(set(ids)) == len(ids)
