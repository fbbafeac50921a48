"""Kafka -> Spark (real-time mode and micro-batches) -> ``foreach(storm_foreach(...))`` -> workers.

Real broker, real Spark Kafka source, real worker processes.  Rows arrive while the query
runs; every one must reach the source task that fields grouping picks, exactly once.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.errors import ConfigError
from spark_storm.spark import storm_foreach
from spark_storm.topology.hashing import fields_hash
from tests.support import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

BOLT = "tests.integration.bolts:RecordingBolt"
WORDS = 7


def _topology(directory: Path, name: str) -> Path:
    topo = {
        "name": name,
        "conf": {"record.dir": str(directory / "records")},
        "components": [
            {
                "id": "in",
                "source": True,
                "fields": ["word", "n"],
                "grouping": "fields",
                "grouping_fields": ["word"],
                "parallelism": 2,
                "tasks": 4,
                "bolt": BOLT,
            }
        ],
    }
    (directory / "records").mkdir()
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def _produce(broker: str, topic: str, numbers: range) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker, acks="all")
    for i in numbers:
        producer.send(topic, json.dumps({"word": f"w{i % WORDS}", "n": i}).encode())
    producer.flush()
    producer.close()


def _arrived(cluster: LocalCluster) -> int:
    total = 0
    for slot in cluster.slots:
        total += cluster.health(slot)["counters"]["source_tuples_in"]
    return total


@pytest.mark.parametrize("trigger", [{"realTime": "5 seconds"}, {"processingTime": "1 second"}])
def test_foreach_delivers_every_row_to_its_fields_task(
    spark: Any, kafka_broker: str, tmp_path: Path, trigger: dict[str, str]
) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    tag = uuid.uuid4().hex[:8]
    topic = f"foreach-{tag}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker)
    admin.create_topics([NewTopic(topic, 2, 1)])  # real-time mode runs one long task per partition
    admin.close()
    path = _topology(tmp_path, f"foreach{tag}")
    _produce(kafka_broker, topic, range(150))
    with LocalCluster(str(path), 2) as cluster:
        stream = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka_broker)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("from_json(cast(value as string), 'word STRING, n BIGINT') as r")
            .selectExpr("r.word as word", "r.n as n")
        )
        writer = storm_foreach(topology=str(path), workers=cluster.workers_arg, delivery="accepted")
        query = (
            stream.writeStream.outputMode("update")  # real-time mode accepts only update
            .foreach(writer)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(**trigger)
            .start()
        )
        try:
            wait_until(lambda: _arrived(cluster) >= 150 or query.exception(), what="the first 150 rows", timeout=120)
            assert query.exception() is None, query.exception()
            _produce(kafka_broker, topic, range(150, 300))  # rows that arrive while the epoch runs
            wait_until(lambda: _arrived(cluster) >= 300 or query.exception(), what="all 300 rows", timeout=120)
            assert query.exception() is None, query.exception()
        finally:
            query.stop()
        tasks = sorted(cluster.plan.component_tasks["in"])
    records = [json.loads(f.read_text()) for f in (tmp_path / "records").glob("in-*.json")]
    assert sum(r["count"] for r in records) == 300
    per_word = Counter[str]()
    for rec in records:
        for word, n in rec["keys"].items():
            per_word[word] += n
            assert rec["task"] == tasks[fields_hash([word]) % len(tasks)], (word, rec["task"])
    assert per_word == Counter({f"w{k}": len(range(k, 300, WORDS)) for k in range(WORDS)})


def test_storm_foreach_options_fail_on_the_driver(tmp_path: Path) -> None:
    path = str(_topology(tmp_path, "foreachopts"))
    slots = "127.0.0.1:1"
    with pytest.raises(ConfigError, match="'delivery'='none' is not offered"):
        storm_foreach(topology=path, workers=slots, delivery="none")
    with pytest.raises(ConfigError, match="'batchId' does not apply"):
        storm_foreach(topology=path, workers=slots, batchId=3)
    with pytest.raises(ConfigError, match="unknown storm option 'delivry'"):
        storm_foreach(topology=path, workers=slots, delivry="processed")
    with pytest.raises(ConfigError, match=r"storm\.spark\.foreach\.linger\.ms"):
        storm_foreach(topology=path, workers=slots, **{"storm.spark.foreach.linger.ms": -1})
