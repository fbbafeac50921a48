"""The attacks against real ``spark-storm worker`` processes: the good client's tuples all reach the bolt."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml
import zmq

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.messaging import TaskMessage
from spark_storm.messaging.wire import Seq, encode_control, encode_messages
from spark_storm.transport import make_context
from tests.hostile.attack import MiB, RssPeak, frame_header

pytestmark = pytest.mark.hostile

SECRET = "hostile-worker-secret-0123456789abcdef"


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    overrides: dict[str, Any] = request.param
    records = tmp_path / "records"
    records.mkdir()
    topo = {
        "name": "hostile",
        "conf": {"record.dir": str(records)},
        "components": [
            {
                "id": "in",
                "source": True,
                "fields": ["key", "n"],
                "parallelism": 1,
                "bolt": "tests.integration.bolts:RecordingBolt",
            }
        ],
    }
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    lc = LocalCluster(str(path), 1, overrides={"storm.messaging.auth.secret": SECRET, **overrides})
    lc.start()
    try:
        yield lc
    finally:
        lc.stop()


def _send_rows(cluster: LocalCluster, conf: dict[str, Any], n: int) -> None:
    (slot,) = cluster.slots
    (task,) = cluster.plan.component_tasks["in"]
    ctx = make_context({**conf, "storm.messaging.auth.secret": SECRET})
    try:
        client = ctx.connect(cluster.topology.name, slot.host, slot.port)
        for k in range(0, n, 1000):
            client.send([TaskMessage(task, msgpack.packb([f"good{i % 7}", i])) for i in range(k, min(n, k + 1000))])
        assert client.flush(30), client.metrics()
    finally:
        ctx.term()


def _bolt_count(cluster: LocalCluster, tmp_path: Path) -> int:
    codes = cluster.stop()
    assert all(c == 0 for c in codes.values()), codes
    return sum(json.loads(f.read_text())["count"] for f in (tmp_path / "records").glob("*.json"))


@pytest.mark.parametrize("cluster", [{"storm.messaging.transport": "tcp"}], indirect=True)
def test_unauthenticated_frames_do_not_grow_a_worker(cluster: LocalCluster, tmp_path: Path) -> None:
    (slot,) = cluster.slots
    pid = cluster.procs[slot].pid
    before = RssPeak(pid).peak

    def junk() -> None:
        try:
            with socket.create_connection((slot.host, slot.port), timeout=10) as sock:
                sock.sendall(frame_header(1, 16 * MiB))
                for _ in range(32):
                    sock.sendall(b"\xab" * (256 * 1024))
        except OSError:
            pass  # refused and closed

    with RssPeak(pid) as rss:
        attackers = [threading.Thread(target=junk) for _ in range(24)]
        for t in attackers:
            t.start()
        _send_rows(cluster, {"storm.messaging.transport": "tcp"}, 20_000)
        for t in attackers:
            t.join(30)
    print(f"worker, tcp pre-auth: RSS before {before} KiB, peak {rss.peak} KiB")
    assert rss.peak - before < 64 * 1024, (before, rss.peak)
    assert _bolt_count(cluster, tmp_path) == 20_000


@pytest.mark.parametrize("cluster", [{"storm.messaging.transport": "zmq"}], indirect=True)
def test_a_claimed_identity_injects_nothing_into_a_worker(cluster: LocalCluster, tmp_path: Path) -> None:
    (slot,) = cluster.slots
    (task,) = cluster.plan.component_tasks["in"]
    row = msgpack.packb(["evil", 1])  # a tuple the bolt would count, were it delivered
    evil = encode_control(Seq(1_000_000, 5)) + encode_messages([TaskMessage(task, row)] * 5)
    ctx = make_context({"storm.messaging.transport": "zmq", "storm.messaging.auth.secret": SECRET})
    raw: zmq.Context[Any] = zmq.Context()
    socks: list[zmq.Socket[Any]] = []

    def claim(ident: bytes) -> None:
        sock: zmq.Socket[Any] = raw.socket(zmq.DEALER)
        socks.append(sock)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, ident)
        sock.connect(f"tcp://{slot.host}:{slot.port}")
        sock.send(evil)

    try:
        victim = ctx.connect(cluster.topology.name, slot.host, slot.port)
        victim.send([TaskMessage(task, msgpack.packb([f"good{i}", i])) for i in range(500)])
        assert victim.flush(30)
        claim(b"S" + victim._session.session_id)  # type: ignore[attr-defined]  # its id as it once was
        victim.send([TaskMessage(task, msgpack.packb([f"good{i}", i])) for i in range(500, 1000)])
        assert victim.flush(30)
        victim.close()
        claim(b"S" + victim._session.session_id)  # type: ignore[attr-defined]  # and after it left
        _send_rows(cluster, {"storm.messaging.transport": "zmq"}, 1_000)
    finally:
        for sock in socks:
            sock.close(0)
        raw.term()
        ctx.term()
    assert _bolt_count(cluster, tmp_path) == 2_000
