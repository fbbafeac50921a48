"""The Kafka tier's helpers."""

from __future__ import annotations

from pathlib import Path

import yaml


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
