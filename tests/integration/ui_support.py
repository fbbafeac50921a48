"""A real local cluster, a raw client feeding its source (tests/integration/runs.py), and the UI over it.

Also the keyed ledger of the exactness tests, fed and committed as Spark does, with the UI over it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.config import load_config
from spark_storm.messaging import IClient
from spark_storm.state.protocol import Coordinator, RoundResult
from spark_storm.topology import Slot
from spark_storm.transport import make_context
from spark_storm.ui import UIServer, local_ui
from tests.integration.runs import Run
from tests.support import wait_until
from tests.support.ledger import GroupWriter, ledger_topology, rows_for

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


class LedgerUI:
    """The keyed ledger of the exactness tests (stateful ``ledger``, 4 tasks on 2 executors) with the UI over it.

    Batches go in as Spark's writer sends them (delivery groups, resent until PROCESSED:
    :class:`~tests.support.ledger.GroupWriter`) and are committed as Spark's driver commits
    them (a checkpoint round of :class:`~spark_storm.state.protocol.Coordinator`).  Use as a
    context manager: the UI, the client and the workers stop on the way out.
    """

    def __init__(self, tmp: Path, workers: int = 2) -> None:
        self.tmp = tmp
        overrides = {"storm.messaging.tcp.min_wait_ms": 20, "storm.messaging.tcp.max_wait_ms": 200}
        self.cluster = LocalCluster(str(ledger_topology(tmp)), workers, overrides=overrides)
        self.ctx = make_context({"storm.messaging.transport": "tcp", **overrides})
        conf = load_config(None, {"ui.sample.interval.ms": 250})
        self.ui: UIServer = local_ui(self.cluster.heartbeat_dir, conf, "127.0.0.1", 0)
        self.batches: dict[int, list[list[Any]]] = {}
        self.conns: dict[Slot, IClient] = {}

    def __enter__(self) -> LedgerUI:
        try:
            self.cluster.start()
            self.conns = {s: self.ctx.connect(self.cluster.topology.name, s.host, s.port) for s in self.cluster.slots}
            for conn in self.conns.values():
                assert conn.wait_ready(30)
            self.writer = GroupWriter(self.cluster.plan, self.conns)
            self.coordinator = Coordinator("ui-test", lambda: {str(s): c for s, c in self.conns.items()}, 60.0, 3)
            self.ui.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.ui.close()
        self.ctx.term()
        self.cluster.stop()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.ui.port}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.base}/api/v1/{path}", timeout=10) as r:
            return json.loads(r.read())

    def feed_and_commit(self, batch: int, n: int = 400) -> RoundResult:
        """Send one batch's rows and commit it (one checkpoint round); return the round's result."""
        rows = rows_for(batch, n)
        self.batches[batch] = rows
        self.writer.send(batch, rows)
        return self.coordinator.checkpoint({self.writer.query: batch})

    def ledger(self) -> dict[str, Any]:
        """The ``ledger`` component as ``/api/v1/topology/ledger/component/ledger`` returns it."""
        data: dict[str, Any] = self.get("topology/ledger/component/ledger")
        return data

    def wait_state(self, pred: Callable[[dict[str, Any]], bool], what: str, timeout: float = 20.0) -> dict[str, Any]:
        """Wait until the component's ``state`` (per the REST API) satisfies ``pred``; return it."""
        seen: list[dict[str, Any]] = []

        def check() -> bool:
            st = self.ledger().get("state")
            seen[:] = [st] if st else []
            return bool(seen) and pred(seen[0])

        wait_until(check, what=what, timeout=timeout)
        return seen[0]
