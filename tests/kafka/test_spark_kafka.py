"""Kafka -> Spark (Kafka source) -> format("storm") -> workers -> result topic, exact counts.

The job runs under spark-submit with ``--jars``, as the README documents.  Real broker,
real worker processes; a second run on the same checkpoint adds only the new records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from spark_storm.cluster.local_cluster import LocalCluster
from tests.support.kafka import kafka_result_topology

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]


def _produce(broker: str, topic: str, rows: list[dict[str, Any]]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker, acks="all")
    for row in rows:
        producer.send(topic, json.dumps(row).encode())
    producer.flush()
    producer.close()


def _read_all(broker: str, topic: str) -> list[tuple[str, dict[str, Any]]]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=broker, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    out = [(m.key.decode(), json.loads(m.value)) for m in consumer]
    consumer.close()
    return out


def test_spark_kafka_connector_jars_work_together(spark: Any, kafka_broker: str) -> None:
    """spark-sql-kafka 4.2.0 with the token provider Maven Central serves (see maven/spark/pom.xml)."""
    topic = f"conn-{uuid.uuid4().hex[:8]}"
    df = spark.range(100).selectExpr("cast(id as string) as key", "cast(id * 2 as string) as value")
    df.write.format("kafka").option("kafka.bootstrap.servers", kafka_broker).option("topic", topic).save()
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka_broker)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("cast(cast(value as string) as int) as v")
    )
    query = stream.writeStream.format("memory").queryName("kafka_conn").trigger(availableNow=True).start()
    query.awaitTermination(120)
    row = spark.sql("select count(*) as n, sum(v) as total from kafka_conn").collect()[0]
    assert (row.n, row.total) == (100, 9900)


def _run_job(args: list[str], jars: list[str]) -> subprocess.CompletedProcess[str]:
    spark_submit = Path(sys.executable).parent / "spark-submit"
    kafka_jars = ",".join(j for j in jars if "delta" not in j)
    return subprocess.run(
        [
            str(spark_submit),
            "--master",
            "local[2]",
            "--jars",
            kafka_jars,
            str(ROOT / "jobs" / "kafka_to_storm.py"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )


def test_kafka_to_storm_to_result_topic_exactly_once(kafka_broker: str, spark_jars: list[str], tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    source_topic, result_topic = f"words-{tag}", f"results-{tag}"
    path = kafka_result_topology(tmp_path, "kafka-roundtrip", kafka_broker, result_topic)
    _produce(kafka_broker, source_topic, [{"word": f"w{i % 7}", "n": i} for i in range(300)])
    checkpoint = tmp_path / "checkpoint"
    with LocalCluster(str(path), 2) as cluster:
        common = [
            "--bootstrap-servers",
            kafka_broker,
            "--topic",
            source_topic,
            "--topology",
            str(path),
            "--workers",
            cluster.workers_arg,
            "--format",
            "json",
            "--schema",
            "word STRING, n BIGINT",
            "--delivery",
            "processed",
            "--available-now",
            "--max-offsets-per-trigger",
            "120",
            "--checkpoint",
            str(checkpoint),
        ]
        first = _run_job(common, spark_jars)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        assert "sent 300 records" in first.stdout
        results = _read_all(kafka_broker, result_topic)
        assert len(results) == 300
        assert sorted(v["n"] for _, v in results) == list(range(300))
        assert all(key == v["word"] for key, v in results)
        # Same checkpoint, 50 more records: only those travel.
        _produce(kafka_broker, source_topic, [{"word": f"w{i % 7}", "n": i} for i in range(300, 350)])
        second = _run_job(common, spark_jars)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert "sent 50 records" in second.stdout
        results = _read_all(kafka_broker, result_topic)
        assert sorted(v["n"] for _, v in results) == list(range(350))
