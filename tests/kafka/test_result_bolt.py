"""A topology hands its results back to Kafka: exact counts read back from the topic."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest
import yaml

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.messaging import TaskMessage
from spark_storm.messaging.wire import PROCESSED, BatchHeader
from spark_storm.transport import make_context

pytestmark = pytest.mark.kafka


def test_results_reach_kafka_and_processed_waits_for_them(kafka_broker: str, tmp_path: Path) -> None:
    from kafka import KafkaConsumer

    topic = "wordcount-results"
    topo = {
        "name": "tokafka",
        "components": [
            {"id": "in", "source": True, "fields": ["word", "n"], "parallelism": 2},
            {
                "id": "out",
                "bolt": "spark_storm.examples.kafka_bolt:KafkaResultBolt",
                "parallelism": 2,
                "conf": {"kafka.bootstrap": kafka_broker, "kafka.topic": topic, "kafka.key.field": "word"},
                "inputs": [{"from": "in", "grouping": "fields", "fields": ["word"]}],
            },
        ],
    }
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    ctx = make_context({"storm.messaging.transport": "tcp"})
    with LocalCluster(str(path), 2) as cluster:
        keys = []
        sources = list(cluster.plan.component_tasks["in"])
        for seq, slot in enumerate(cluster.slots):
            mine = [t for t in sources if cluster.plan.task_slot[t] == slot]
            if not mine:
                continue
            msgs = [TaskMessage(mine[i % len(mine)], msgpack.packb([f"w{i % 7}", i])) for i in range(150)]
            header = BatchHeader("q-kafka", 0, 0, seq, len(msgs), PROCESSED)
            conn = ctx.connect("tokafka", slot.host, slot.port)
            conn.send_group(header, msgs)
            keys.append((conn, header.key))
        for conn, key in keys:  # PROCESSED: every record acknowledged by Kafka
            assert conn.wait_acks([key], PROCESSED, 60) == {key: PROCESSED}
        ctx.term()
    expected = 150 * len(keys)
    consumer = KafkaConsumer(
        topic, bootstrap_servers=kafka_broker, auto_offset_reset="earliest", consumer_timeout_ms=10000
    )
    records = [(m.key.decode(), json.loads(m.value)) for m in consumer]
    consumer.close()
    assert len(records) == expected
    assert all(key == value["word"] for key, value in records)
    assert sorted(v["n"] for _, v in records) == sorted(list(range(150)) * len(keys))
