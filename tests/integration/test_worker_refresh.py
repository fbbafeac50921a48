"""In-process workers: connection refresh swaps connections without a gap."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_storm.config import load_config
from spark_storm.errors import ConfigError
from spark_storm.netutil import free_ports
from spark_storm.topology import Slot, plan, topology_from_dict
from spark_storm.worker import Worker
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def test_refresh_makes_new_connections_before_closing_old_ones(tmp_path: Path) -> None:
    topo = topology_from_dict(
        {
            "name": "refresh",
            "conf": {"record.dir": str(tmp_path)},
            "components": [
                {"id": "in", "source": True, "fields": ["key", "n"]},
                {"id": "out", "bolt": "tests.integration.bolts:RecordingBolt", "inputs": [{"from": "in"}]},
            ],
        }
    )
    a_port, b_port, c_port = sorted(free_ports(3))
    a, b, c = (Slot("127.0.0.1", p) for p in (a_port, b_port, c_port))
    conf = load_config(None, {"topology.worker.metrics.port": -1, "worker.heartbeat.dir": str(tmp_path)})
    first = plan(topo, [a, b])
    second = plan(topo, [a, c])  # B's executor moves to C; A keeps its own
    wa, wb, wc = Worker(first, a, conf), Worker(first, b, conf), Worker(second, c, conf)
    for w in (wa, wb, wc):
        w.start()
    try:
        wait_until(lambda: wa.active, what="A to activate once B is reachable")
        old = wa.connections[b]
        wa.refresh_connections(second)
        assert set(wa.connections) == {c}
        assert wa.connections[c].status.value == "ready"
        assert old.status.value == "closed"
        with pytest.raises(ConfigError, match="not change the executors"):
            wa.refresh_connections(plan(topology_from_dict({**_dict(topo), "name": "refresh"}), [a, b, c]))
    finally:
        for w in (wa, wb, wc):
            assert w.stop(30)


def _dict(topo: object) -> dict[str, object]:
    return {
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": 2},
            {"id": "out", "bolt": "tests.integration.bolts:RecordingBolt", "inputs": [{"from": "in"}]},
        ],
        "conf": {"record.dir": "."},
    }
