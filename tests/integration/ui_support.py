"""A real local cluster, a raw client feeding its source, and the UI over it (tests of the UI)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import yaml

from spark_storm.config import load_config
from spark_storm.messaging import IConnection, IContext, TaskMessage
from spark_storm.topology import Slot
from spark_storm.transport import make_context
from spark_storm.ui import UIServer, local_ui
from spark_storm.worker.cluster import LocalCluster
from tests.helpers import wait_until

BOLT = "tests.integration.bolts:RecordingBolt"


def pipeline(record_dir: Path) -> dict[str, Any]:
    """``in`` (source, 2 tasks) -> ``stage1`` (4 tasks on 2 executors) -> ``stage2`` (fields on key)."""
    return {
        "name": "pipeline",
        "conf": {"record.dir": str(record_dir)},
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": 2},
            {
                "id": "stage1",
                "bolt": BOLT,
                "parallelism": 2,
                "tasks": 4,
                "fields": ["key", "n"],
                "inputs": [{"from": "in", "grouping": "shuffle"}],
            },
            {
                "id": "stage2",
                "bolt": BOLT,
                "parallelism": 2,
                "inputs": [{"from": "stage1", "grouping": "fields", "fields": ["key"]}],
            },
        ],
    }


class UICluster:
    """Start with :meth:`start`; always :meth:`stop` (the fixture does)."""

    def __init__(self, tmp: Path, topo: dict[str, Any], workers: int = 2, **ui_conf: Any) -> None:
        (tmp / "records").mkdir(exist_ok=True)
        path = tmp / "topology.yaml"
        path.write_text(yaml.safe_dump(topo))
        self.cluster = LocalCluster(str(path), workers, overrides={"storm.messaging.tcp.min_wait_ms": 20})
        self.ctx: IContext = make_context({"storm.messaging.transport": "tcp"})
        self.conns: dict[Slot, IConnection] = {}
        conf = load_config(None, {"ui.sample.interval.ms": 250, "ui.rate.window.secs": 2, **ui_conf})
        self.ui: UIServer = local_ui(self.cluster.heartbeat_dir, conf, "127.0.0.1", 0)
        self.sent = 0
        self._running = False

    @property
    def name(self) -> str:
        return self.cluster.topology.name

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.ui.port}"

    def start(self) -> UICluster:
        self._running = True
        self.cluster.start()
        self.conns = {s: self.ctx.connect(self.name, s.host, s.port) for s in self.cluster.slots}
        self.ui.start()
        return self

    def send(self, n: int, keys: int = 13) -> None:
        """Send ``n`` rows to the source tasks; return once every worker accepted them."""
        plan = self.cluster.plan
        sources = list(plan.component_tasks["in"])
        batches: dict[Slot, list[TaskMessage]] = {}
        for i in range(self.sent, self.sent + n):
            task = sources[i % len(sources)]
            batches.setdefault(plan.task_slot[task], []).append(TaskMessage(task, msgpack.packb([f"k{i % keys}", i])))
        for slot, msgs in batches.items():
            self.conns[slot].send(msgs)
        for conn in self.conns.values():
            assert conn.flush(30), conn.metrics()
        self.sent += n

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.base}/api/v1/{path}", timeout=10) as r:
            assert r.headers["Content-Type"] == "application/json"
            return json.loads(r.read())

    def post(self, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(f"{self.base}/api/v1/{path}", data=body, method="POST", headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def components(self) -> dict[str, dict[str, Any]]:
        topo = self.get(f"topology/{self.name}")
        return {c["componentId"]: c for c in topo["spouts"] + topo["bolts"]}

    def health_totals(self) -> dict[str, dict[str, int]]:
        """Per component executed/emitted/acked/failed, summed straight from every worker's /health."""
        out: dict[str, dict[str, int]] = {}
        for slot in self.cluster.slots:
            hb = self.cluster.heartbeat(slot)
            assert hb is not None
            with urllib.request.urlopen(f"http://127.0.0.1:{hb['metrics_port']}/health", timeout=10) as r:
                health = json.loads(r.read())
            for ex in health["executors"].values():
                acc = out.setdefault(ex["component"], {"executed": 0, "emitted": 0, "acked": 0, "failed": 0})
                for t in ex["tasks"].values():
                    for k in acc:
                        acc[k] += t[k]
        return out

    def wait_new_samples(self, n: int) -> None:
        """Wait until the UI has read the cluster ``n`` more times."""
        target = len(self.ui.sampler.history(self.name)) + n
        wait_until(lambda: len(self.ui.sampler.history(self.name)) >= target, what=f"{n} new samples")

    def wait_executed(self, component: str, count: int, timeout: float = 30.0) -> None:
        wait_until(
            lambda: self.components().get(component, {}).get("executed") == count,
            what=f"{component} to have executed {count} tuples per the REST API",
            timeout=timeout,
        )

    def stop(self) -> dict[Slot, int]:
        if not self._running:
            return {}
        self._running = False
        self.ui.close()
        self.ctx.term()
        return self.cluster.stop()
