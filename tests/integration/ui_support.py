"""A real local cluster, a raw client feeding its source (tests/integration/runs.py), and the UI over it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from spark_storm.config import load_config
from spark_storm.ui import UIServer, local_ui
from tests.helpers import wait_until
from tests.integration.runs import Run

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


class UICluster(Run):
    """A :class:`Run` with the UI over it; start with :meth:`start`, always :meth:`stop` (the fixture does)."""

    def __init__(self, tmp: Path, topo: dict[str, Any], workers: int = 2, **ui_conf: Any) -> None:
        super().__init__(tmp, topo, workers)
        conf = load_config(None, {"ui.sample.interval.ms": 250, "ui.rate.window.secs": 2, **ui_conf})
        self.ui: UIServer = local_ui(self.cluster.heartbeat_dir, conf, "127.0.0.1", 0)
        self.sent = 0

    @property
    def name(self) -> str:
        return self.cluster.topology.name

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.ui.port}"

    def start(self) -> UICluster:
        super().start()
        self.ui.start()
        return self

    def send(self, n: int, keys: int = 13) -> None:
        """Send ``n`` more rows to the source tasks; return once every worker accepted them."""
        self.send_to_sources([[f"k{i % keys}", i] for i in range(self.sent, self.sent + n)])
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
            for ex in self.cluster.health(slot)["executors"].values():
                acc = out.setdefault(ex["component"], {"executed": 0, "emitted": 0, "acked": 0, "failed": 0})
                for t in ex["tasks"].values():
                    acc["executed"] += t["executed"]
                    acc["emitted"] += t["emitted"]
                    acc["acked"] += t["acked"]
                    acc["failed"] += t["failed"]
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

    def stop(self) -> dict[str, dict[int, dict[str, Any]]]:
        """Close the UI, stop the workers (ordered); return what the recording bolts counted."""
        self.ui.close()
        return super().stop()
