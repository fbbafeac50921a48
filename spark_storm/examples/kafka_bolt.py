"""A bolt that hands tuples back to Kafka: one JSON record per tuple (kafka-python).

Component conf: ``kafka.bootstrap`` (``host:port,...``, required), ``kafka.topic``
(required), ``kafka.key.field`` (a field whose value becomes the record key; optional),
``kafka.acks`` (default ``all``).  A tuple is acked when Kafka acknowledged its record and
failed when the send failed, so under ``delivery=processed`` a group is only PROCESSED
once its results are in Kafka (at-least-once).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from spark_storm.errors import ConfigError
from spark_storm.worker import Tuple
from spark_storm.worker.bolt import Bolt, OutputCollector, TopologyContext

__all__ = ["KafkaResultBolt"]


class KafkaResultBolt(Bolt):
    """Produces each tuple as ``{field: value, ...}`` JSON to ``kafka.topic``."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        from spark_storm.extras import require

        require("kafka", "KafkaResultBolt")
        from kafka import KafkaProducer

        bootstrap, topic = conf.get("kafka.bootstrap"), conf.get("kafka.topic")
        if not bootstrap or not topic:
            msg = f"component {context.component_id!r}: KafkaResultBolt needs conf 'kafka.bootstrap' and 'kafka.topic'"
            raise ConfigError(msg)
        self.topic = str(topic)
        self.key_field = conf.get("kafka.key.field")
        self.producer = KafkaProducer(
            bootstrap_servers=str(bootstrap).split(","),
            acks=conf.get("kafka.acks", "all"),
            value_serializer=lambda v: json.dumps(v).encode("utf-8"),
            key_serializer=lambda k: None if k is None else str(k).encode("utf-8"),
        )

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            self.producer.flush()
            return
        record = dict(zip(tup.fields, tup.values, strict=False)) if tup.fields else {"values": tup.values}
        key = record.get(self.key_field) if self.key_field else None
        future = self.producer.send(self.topic, key=key, value=record)
        future.add_callback(lambda _meta: self.collector.ack(tup))
        future.add_errback(lambda _exc: self.collector.fail(tup))

    def cleanup(self) -> None:
        self.producer.flush()
        self.producer.close()
