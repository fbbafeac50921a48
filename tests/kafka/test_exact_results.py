"""Exact results all the way out: a stateful count through a SIGKILL, into Kafka, into Delta.

The counts go to Kafka through ``KafkaExactResultBolt`` (records of committed epochs only,
each with an ``_id``) and from there into Delta with ``jobs/results_to_delta.py
--merge-key _id``: the table holds every record once, and the highest count per key is the
exact count of that key's input rows.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.state.protocol import Coordinator
from spark_storm.transport import make_context
from tests.support import wait_until
from tests.support.ledger import GroupWriter, expected, rows_for

pytestmark = pytest.mark.kafka


def _topology(tmp: Path, broker: str, topic: str) -> Path:
    topo = {
        "name": "exact-results",
        "conf": {
            "topology.state.provider.config": {"dir": str(tmp / "state")},
            "topology.state.checkpoint.interval.ms": 0,
        },
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": 2},
            {
                "id": "count",
                "bolt": "tests.integration.bolts:RunningCountBolt",
                "fields": ["key", "count"],
                "parallelism": 2,
                "inputs": [{"from": "in", "grouping": "fields", "fields": ["key"]}],
            },
            {
                "id": "out",
                "bolt": "spark_storm.examples.kafka_bolt:KafkaExactResultBolt",
                "parallelism": 2,
                "conf": {"kafka.bootstrap": broker, "kafka.topic": topic, "kafka.key.field": "key"},
                "inputs": [{"from": "count", "grouping": "shuffle"}],
            },
        ],
    }
    path = tmp / "exact-results.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def test_counts_are_exact_in_kafka_and_delta_through_a_sigkill(spark: Any, kafka_broker: str, tmp_path: Path) -> None:
    from kafka import KafkaConsumer

    from jobs import results_to_delta

    topic = "exact-results"
    path = _topology(tmp_path, kafka_broker, topic)
    overrides = {"storm.messaging.tcp.min_wait_ms": 20, "storm.messaging.tcp.max_wait_ms": 200}
    ctx = make_context({"storm.messaging.transport": "tcp", **overrides})
    batches: dict[int, list[list[Any]]] = {}
    with LocalCluster(str(path), 2, overrides=overrides) as cluster:
        conns = {s: ctx.connect(cluster.topology.name, s.host, s.port) for s in cluster.slots}
        writer = GroupWriter(cluster.plan, conns)
        coordinator = Coordinator("test", lambda: {str(s): c for s, c in conns.items()}, 120.0, 3)
        for batch in range(2):
            batches[batch] = rows_for(batch, 300, keys=12)
            writer.send(batch, batches[batch])
            coordinator.checkpoint({writer.query: batch})
        batches[2] = rows_for(2, 600, keys=12)
        victim = next(
            s for s in cluster.slots if s in {cluster.plan.task_slot[t] for t in cluster.plan.component_tasks["in"]}
        )
        before = cluster.health(victim)["counters"]["source_tuples_in"]  # read before the send starts: it may be quick
        sender = threading.Thread(target=writer.send, args=(2, batches[2]))
        sender.start()
        wait_until(lambda: cluster.health(victim)["counters"]["source_tuples_in"] > before, what="batch 2 under way")
        cluster.kill(victim)
        cluster.start_worker(victim)
        sender.join(120)
        result = coordinator.checkpoint({writer.query: 2})
        print(f"rolled back to {result.rolled_back_to}")
        coordinator.checkpoint({writer.query: 2})  # one more: the last epoch's records are written at its commit
        ctx.term()
    answer = {key: count for key, (count, _total) in expected(batches).items()}
    consumer = KafkaConsumer(
        topic, bootstrap_servers=kafka_broker, auto_offset_reset="earliest", consumer_timeout_ms=10000
    )
    records = [json.loads(m.value) for m in consumer]
    consumer.close()
    by_id: dict[str, dict[str, Any]] = {}
    for record in records:
        assert by_id.setdefault(record["_id"], record) == record  # a record written twice is the same record
    best: dict[str, int] = {}
    for record in by_id.values():
        best[record["key"]] = max(record["count"], best.get(record["key"], 0))
    assert best == answer
    assert len(by_id) == sum(len(rows) for rows in batches.values())  # one record per input row, once
    print(f"{len(records)} records in Kafka, {len(by_id)} distinct ids")

    table, checkpoint = tmp_path / "table", tmp_path / "delta-ck"
    args_list = [
        "--bootstrap-servers", kafka_broker, "--topic", topic, "--schema", "key STRING, count BIGINT, _id STRING",
        "--table", str(table), "--merge-key", "_id", "--available-now", "--checkpoint",
    ]  # fmt: skip
    args = results_to_delta.parse_args([*args_list, str(checkpoint)])
    spark.conf.set("spark.databricks.delta.snapshotPartitions", "2")  # small data: Delta's log in 2 tasks, not 50
    results_to_delta.run(spark, args)
    fresh = results_to_delta.parse_args([*args_list, str(tmp_path / "delta-ck2")])
    results_to_delta.run(spark, fresh)  # the whole topic again, from another checkpoint: nothing new gets in
    rows = spark.read.format("delta").load(str(table)).collect()
    assert len(rows) == len(by_id)
    table_best: dict[str, int] = {}
    for row in rows:
        table_best[row["key"]] = max(row["count"], table_best.get(row["key"], 0))
    assert table_best == answer
