"""A cluster of worker processes of one test topology, fed by a raw IClient."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import yaml

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.messaging import IClient, IContext, TaskMessage
from spark_storm.reports import WorkerMetrics
from spark_storm.topology import Plan, Slot
from spark_storm.transport import make_context

__all__ = ["RUNS", "Run", "arrow_payload", "rows"]

RUNS: list[Run] = []


class Run:
    """A cluster of one test topology plus a client connected to every worker."""

    def __init__(self, tmp: Path, topo: dict[str, Any], workers: int, **overrides: Any) -> None:
        self.records = tmp / "records"
        self.records.mkdir(exist_ok=True)
        path = tmp / "topology.yaml"
        path.write_text(yaml.safe_dump(topo))
        self.cluster = LocalCluster(str(path), workers, overrides={"storm.messaging.tcp.min_wait_ms": 20, **overrides})
        self.ctx: IContext = make_context({"storm.messaging.transport": "tcp"})
        self.conns: dict[Slot, IClient] = {}
        self.stopped = False
        RUNS.append(self)

    def start(self) -> Run:
        self.cluster.start()
        self.conns = {s: self.ctx.connect(self.cluster.topology.name, s.host, s.port) for s in self.cluster.slots}
        return self

    @property
    def plan(self) -> Plan:
        return self.cluster.plan

    def send_to_sources(self, rows: list[list[Any]]) -> None:
        sources = list(self.plan.component_tasks["in"])
        batches: dict[Slot, list[TaskMessage]] = {}
        for i, row in enumerate(rows):
            task = sources[i % len(sources)]
            batches.setdefault(self.plan.task_slot[task], []).append(TaskMessage(task, msgpack.packb(row)))
        for slot, msgs in batches.items():
            self.conns[slot].send(msgs)
        for conn in self.conns.values():
            assert conn.flush(30), conn.metrics()

    def health(self, slot: Slot) -> WorkerMetrics:
        return self.cluster.health(slot)

    def stop(self) -> dict[str, dict[int, dict[str, Any]]]:
        self.stopped = True
        self.ctx.term()
        codes = self.cluster.stop()
        assert all(c == 0 for c in codes.values()), {str(s): self.cluster.log_tail(s) for s in codes}
        out: dict[str, dict[int, dict[str, Any]]] = {}
        for f in self.records.glob("*.json"):
            rec = json.loads(f.read_text())
            out.setdefault(rec["component"], {})[rec["task"]] = rec
        return out


def rows(n: int, keys: int = 17) -> list[list[Any]]:
    return [[f"k{i % keys}", i] for i in range(n)]


def arrow_payload(data: list[list[Any]], names: list[str]) -> bytes:
    import pyarrow as pa

    table = pa.table({n: [r[i] for r in data] for i, n in enumerate(names)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())
