"""What the kafka transport adds to the conformance suite: durability across a worker kill,
addressing by topic, and its configuration errors.  Real broker (session fixture)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.errors import ConfigError, TransportError, TransportInitError
from spark_storm.messaging import ConnectionStatus, TaskMessage
from spark_storm.messaging.wire import PROCESSED, BatchHeader
from spark_storm.netutil import free_ports
from spark_storm.transport import make_context
from spark_storm.transport.kafka import topic_for
from tests.support import wait_until

pytestmark = pytest.mark.kafka


def _conf(broker: str, prefix: str, **extra: Any) -> dict[str, Any]:
    return {
        "storm.messaging.transport": "kafka",
        "storm.messaging.kafka.bootstrap.servers": broker,
        "storm.messaging.kafka.topic.prefix": prefix,
        "storm.messaging.kafka.heartbeat.ms": 200,
        **extra,
    }


def _committed_all(broker: str, topic: str) -> bool:
    """True when the server's consumer group (named after the topic) committed every record."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=broker, group_id=topic, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        end = consumer.end_offsets([tp])[tp]
        return bool(end) and consumer.committed(tp) == end
    finally:
        consumer.close(autocommit=False)


def test_a_killed_worker_gets_what_was_sent_while_it_was_down(kafka_broker: str, tmp_path: Path) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}-"
    topo = {
        "name": "durable",
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": 2},
            {
                "id": "rec",
                "bolt": "tests.integration.bolts:RecordingBolt",
                "parallelism": 2,
                "conf": {"record.dir": str(tmp_path)},
                "inputs": [{"from": "in", "grouping": "local_or_shuffle"}],
            },
        ],
    }
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    client_ctx = make_context(_conf(kafka_broker, prefix))
    with LocalCluster(str(path), 2, overrides=_conf(kafka_broker, prefix)) as cluster:
        sources = cluster.plan.component_tasks["in"]
        by_slot = {s: [t for t in sources if cluster.plan.task_slot[t] == s] for s in cluster.slots}
        assert all(by_slot.values()), "one source task per worker"
        conns = {s: client_ctx.connect("durable", s.host, s.port) for s in cluster.slots}

        def group(slot: Any, seq: int, n: int) -> BatchHeader:
            msgs = [TaskMessage(by_slot[slot][0], msgpack.packb([f"k{i % 5}", i])) for i in range(n)]
            header = BatchHeader("q-durable", 0, 0, seq, n, PROCESSED)
            conns[slot].send_group(header, msgs)
            return header

        first = [(s, group(s, i, 100)) for i, s in enumerate(cluster.slots)]
        for slot, header in first:
            assert conns[slot].wait_acks([header.key], PROCESSED, 60) == {header.key: PROCESSED}
        victim = cluster.slots[1]
        topic = topic_for(prefix, "durable", victim.port)
        wait_until(lambda: _committed_all(kafka_broker, topic), what="the victim to commit its offsets", timeout=30)
        cluster.kill(victim)
        wait_until(lambda: conns[victim].status is ConnectionStatus.CONNECTING, what="the client to see it gone")
        late = group(victim, 10, 150)  # goes into the topic while no worker reads it
        cluster.start_worker(victim)
        cluster.wait_running(slots=[victim])
        assert conns[victim].wait_acks([late.key], PROCESSED, 60) == {late.key: PROCESSED}
        assert conns[victim].metrics()["reconnects"] >= 1
        client_ctx.term()
    counts: dict[int, int] = {}
    for f in tmp_path.glob("rec-*.json"):
        data = json.loads(f.read_text())
        counts[data["task"]] = data["count"]
    rec_tasks = cluster.plan.component_tasks["rec"]
    on_victim = sum(counts.get(t, 0) for t in rec_tasks if cluster.plan.task_slot[t] == victim)
    # The survivor kept its 100; the restarted victim got exactly the 150 sent while it was
    # down (its first 100 were committed, so not redelivered; killed, it wrote no record of them).
    assert on_victim == 150
    assert sum(counts.values()) == 250


def test_a_client_for_another_topology_reaches_no_server(kafka_broker: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}-"
    sctx = make_context(_conf(kafka_broker, prefix))
    cctx = make_context(_conf(kafka_broker, prefix))
    got: list[TaskMessage] = []
    try:
        server = sctx.bind("mine", 0, got.extend)
        other = cctx.connect("other", "127.0.0.1", server.port)
        mine = cctx.connect("mine", "127.0.0.1", server.port)
        other.send(TaskMessage(1, b"lost?"))
        mine.send(TaskMessage(1, b"mine"))
        assert mine.flush(20)
        assert got == [TaskMessage(1, b"mine")]
        assert other.status is ConnectionStatus.CONNECTING  # nobody announces on its topic
        assert other.topic != mine.topic  # type: ignore[attr-defined]
    finally:
        cctx.term()
        sctx.term()


def test_config_errors_name_the_key_and_the_fix(kafka_broker: str) -> None:
    # The factory wraps constructor errors in TransportInitError, with the ConfigError as cause.
    with pytest.raises(TransportInitError, match=r"storm.messaging.kafka.client.config.*bogus_setting.*kafka-python"):
        make_context(_conf(kafka_broker, "x-", **{"storm.messaging.kafka.client.config": {"bogus_setting": 1}}))
    with pytest.raises(TransportInitError, match="must be a mapping") as info:
        make_context(_conf(kafka_broker, "x-", **{"storm.messaging.kafka.client.config": "ssl"}))
    assert isinstance(info.value.__cause__, ConfigError)
    port = free_ports(1, "127.0.0.1")[0]
    ctx = make_context(_conf(f"127.0.0.1:{port}", "x-"))
    with pytest.raises(
        TransportInitError, match=rf"cannot reach the Kafka brokers '127.0.0.1:{port}'.*refused.*bootstrap"
    ):
        ctx.bind("t", 0)
    ctx.term()


def test_a_port_served_by_a_live_server_cannot_be_bound_twice(kafka_broker: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}-"
    first_ctx, second_ctx = make_context(_conf(kafka_broker, prefix)), make_context(_conf(kafka_broker, prefix))
    try:
        first = first_ctx.bind("exclusive", 0)
        with pytest.raises(TransportError, match=rf"kafka port {first.port} .* is served by a live server"):
            second_ctx.bind("exclusive", first.port)
        first.close()  # its CLOSE announcement frees the port at once
        second = second_ctx.bind("exclusive", first.port)
        assert second.port == first.port
    finally:
        first_ctx.term()
        second_ctx.term()
