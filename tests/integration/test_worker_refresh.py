"""In-process workers following a new plan: connections first, executors move, nothing lost."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import msgpack
import pytest

from spark_storm.config import load_config
from spark_storm.errors import ConfigError
from spark_storm.messaging import TaskMessage
from spark_storm.netutil import free_ports
from spark_storm.topology import Plan, Slot, plan, topology_from_dict
from spark_storm.transport import make_context
from spark_storm.worker.worker import Worker
from tests.support import wait_until

pytestmark = pytest.mark.integration


def _topology(record_dir: Path, sources: int = 1) -> Any:
    return topology_from_dict(
        {
            "name": "refresh",
            "conf": {"record.dir": str(record_dir), "record.per.instance": True},
            "components": [
                {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": sources},
                {
                    "id": "out",
                    "bolt": "tests.integration.bolts:RecordingBolt",
                    "parallelism": 2,
                    "inputs": [{"from": "in"}],
                },
            ],
        }
    )


def _conf(tmp_path: Path) -> Any:
    return load_config(
        None,
        {
            "topology.worker.metrics.port": -1,
            "worker.heartbeat.dir": str(tmp_path),
            "storm.messaging.tcp.min_wait_ms": 20,
        },
    )


def _stop_together(*workers: Worker) -> bool:
    """Stop the workers at once, as a cluster's SIGTERM does: each drains while the others still run."""
    results: list[bool] = []
    threads = [threading.Thread(target=lambda w=w: results.append(w.stop(30))) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return len(results) == len(workers) and all(results)


def test_refresh_makes_new_connections_before_closing_old_ones(tmp_path: Path) -> None:
    topo = _topology(tmp_path)
    a, b, c = (Slot("127.0.0.1", p) for p in sorted(free_ports(3)))
    first = plan(topo, [a, b])
    second = plan(topo, [a, c])  # B's executor moves to C; A keeps its own
    conf = _conf(tmp_path)
    wa, wb, wc = Worker(first, a, conf), Worker(first, b, conf), Worker(second, c, conf)
    for w in (wa, wb, wc):
        w.start()
    try:
        wait_until(lambda: wa.active, what="A to activate once B is reachable")
        old = wa.connections[b]
        wa.refresh(second)
        assert set(wa.connections) == {c}
        assert wa.connections[c].status.value == "ready"
        assert old.status.value == "closed"
        other = topology_from_dict({"name": "refresh", "components": [{"id": "in", "source": True, "fields": ["x"]}]})
        with pytest.raises(ConfigError, match="keeps the tasks"):
            wa.refresh(plan(other, [a, c]))
        with pytest.raises(ConfigError, match="does not include this worker's slot"):
            wa.refresh(plan(topo, [b, c]))
    finally:
        assert _stop_together(wa, wb, wc)


def test_refresh_moves_executors_while_tuples_flow_and_loses_nothing(tmp_path: Path) -> None:
    # plan over [a, b]: in[1]->a, in[2]->b, out[3]->a, out[4]->b
    # plan over [a, b, c]: in[1]->a, in[2]->b, out[3]->c, out[4]->a
    # A loses out[3] (drained, cleaned up) and gains out[4]; B loses out[4]; C gains out[3].
    topo = _topology(tmp_path, sources=2)
    a, b, c = (Slot("127.0.0.1", p) for p in sorted(free_ports(3)))
    first, second = plan(topo, [a, b]), plan(topo, [a, b, c])
    assert [str(e) for e in first.executors_of(a)] == ["in[1-1]", "out[3-3]"]
    assert [str(e) for e in second.executors_of(a)] == ["in[1-1]", "out[4-4]"]
    conf = _conf(tmp_path)
    wa, wb, wc = Worker(first, a, conf), Worker(first, b, conf), Worker(second, c, conf)
    for w in (wa, wb, wc):
        w.start()
    ctx = make_context({"storm.messaging.transport": "tcp"})
    conns = {s: ctx.connect("refresh", s.host, s.port) for s in (a, b)}
    sent = 0
    stop_sending = threading.Event()

    def send_rows(p: Plan) -> None:
        nonlocal sent
        while not stop_sending.is_set() and sent < 20_000:
            for task in p.component_tasks["in"]:
                rows = [TaskMessage(task, msgpack.packb([f"k{i % 13}", i])) for i in range(sent, sent + 100)]
                conns[p.task_slot[task]].send(rows)
                sent += 100

    try:
        wait_until(lambda: wa.active and wb.active and wc.active, what="every worker to activate")
        sender = threading.Thread(target=send_rows, args=(first,))
        sender.start()
        wait_until(lambda: sent >= 2000, what="tuples to flow before the refresh")
        wa.refresh(second)
        wb.refresh(second)
        assert sorted(map(str, wa.executors)) == ["in[1-1]", "out[4-4]"]
        assert sorted(map(str, wb.executors)) == ["in[2-2]"]
        wait_until(lambda: sent >= 6000, what="tuples to flow after the refresh")
        stop_sending.set()
        sender.join(30)
        for conn in conns.values():
            assert conn.flush(30)
    finally:
        stop_sending.set()
        ctx.term()
        assert _stop_together(wa, wb, wc)
    records = [json.loads(f.read_text()) for f in tmp_path.glob("out-*.json")]
    assert sum(r["count"] for r in records) == sent
    by_task: dict[int, int] = {}
    for r in records:
        by_task[r["task"]] = by_task.get(r["task"], 0) + 1
    assert by_task == {3: 2, 4: 2}  # each moved task ran (and cleaned up) in two workers
