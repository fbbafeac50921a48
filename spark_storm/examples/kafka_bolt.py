"""Bolts that hand tuples back to Kafka: one JSON record per tuple (kafka-python).

Component conf: ``kafka.bootstrap`` (``host:port,...``, required), ``kafka.topic``
(required), ``kafka.key.field`` (a field whose value becomes the record key; optional),
``kafka.acks`` (default ``all``).

* :class:`KafkaResultBolt` — at-least-once: a tuple is acked when Kafka acknowledged its
  record and failed when the send failed, so under ``delivery=processed`` a group is only
  PROCESSED once its results are in Kafka.
* :class:`KafkaExactResultBolt` — exactly-once with an idempotent reader: a stateful bolt
  (docs/design/state.md) that keeps each epoch's records in its checkpointed state and writes
  them only once the epoch is committed, each with an id ``"<epoch>-<task>-<n>"`` in the
  record's ``_id`` field.  A record is never written from an epoch a rollback undid; after
  a crash between the write and the next checkpoint, the same records are written again
  with the same ids and values, which the Delta results job (``--merge-key _id``) keeps once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from spark_storm.bolts import Bolt, KeyValueState, OutputCollector, StatefulBolt, TopologyContext, Tuple
from spark_storm.errors import ConfigError

__all__ = ["KafkaExactResultBolt", "KafkaResultBolt"]


def _producer(conf: Mapping[str, Any], context: TopologyContext) -> tuple[Any, str, Any]:
    from spark_storm.extras import require

    require("kafka", "a Kafka result bolt")
    from kafka import KafkaProducer

    bootstrap, topic = conf.get("kafka.bootstrap"), conf.get("kafka.topic")
    if not bootstrap or not topic:
        msg = f"component {context.component_id!r}: a Kafka result bolt needs conf 'kafka.bootstrap' and 'kafka.topic'"
        raise ConfigError(msg)
    producer = KafkaProducer(
        bootstrap_servers=str(bootstrap).split(","),
        acks=conf.get("kafka.acks", "all"),
        value_serializer=lambda v: json.dumps(v).encode("utf-8"),
        key_serializer=lambda k: None if k is None else str(k).encode("utf-8"),
    )
    return producer, str(topic), conf.get("kafka.key.field")


class KafkaResultBolt(Bolt):
    """Produces each tuple as ``{field: value, ...}`` JSON to ``kafka.topic``."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.producer, self.topic, self.key_field = _producer(conf, context)

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


class KafkaExactResultBolt(StatefulBolt):
    """Writes each tuple as JSON to Kafka once its epoch is committed, with a stable ``_id`` (see the module doc)."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.producer, self.topic, self.key_field = _producer(conf, context)
        self.pending: list[dict[str, Any]] = []

    def init_state(self, state: KeyValueState) -> None:
        self.state = state  # ("out", epoch) -> that epoch's records, until they are written

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        record = dict(zip(tup.fields, tup.values, strict=False)) if tup.fields else {"values": tup.values}
        self.pending.append(record)
        self.collector.ack(tup)  # its record is in the state at the next barrier; a rollback replays it

    def pre_prepare(self, txid: int) -> None:
        if self.pending:
            task = self.context.task_id
            for n, record in enumerate(self.pending):
                record["_id"] = f"{txid}-{task}-{n}"
            self.state.put(["out", txid], self.pending)
            self.pending = []

    def pre_commit(self, txid: int) -> None:
        done = sorted(k[1] for k in self.state if isinstance(k, list) and k[:1] == ["out"] and k[1] <= txid)
        for epoch in done:
            for record in self.state.get(["out", epoch]):
                key = record.get(self.key_field) if self.key_field else None
                self.producer.send(self.topic, key=key, value=record)
        if done:
            self.producer.flush()  # written: the next checkpoint forgets them (a crash before it writes them again)
            for epoch in done:
                self.state.delete(["out", epoch])

    def pre_rollback(self) -> None:
        self.pending = []

    def cleanup(self) -> None:
        self.producer.flush()
        self.producer.close()
