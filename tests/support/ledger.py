"""The keyed ledger of the exactness tests: a topology, a writer that behaves like Spark's, the answer key.

The writer sends each batch as delivery groups keyed (query, batch, partition, sequence),
waits for PROCESSED and resends what failed or timed out (as Spark retries a task), so a
batch's rows reach the workers' input logs exactly once whatever the workers do.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack
import yaml

from spark_storm.errors import StormError
from spark_storm.messaging import IClient, TaskMessage
from spark_storm.messaging.wire import FAILED, PROCESSED, BatchHeader
from spark_storm.state.files import EmbeddedBackend
from spark_storm.topology import Plan, Slot


def ledger_topology(
    tmp: Path, *, batch: bool = False, name: str = "ledger", conf: dict[str, Any] | None = None
) -> Path:
    """in (source, 2 tasks) -> mid (pass-through, 2) -> ledger (stateful, 4 tasks, fields key)."""
    topo = {
        "name": name,
        "conf": {
            "topology.state.provider.config": {"dir": str(tmp / "state")},
            "topology.state.checkpoint.interval.ms": 0,
            **(conf or {}),
        },
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": 2},
            {
                "id": "mid",
                "bolt": "spark_storm.worker.bolt:PassThroughBolt",
                "fields": ["key", "n"],
                "parallelism": 2,
                "inputs": [{"from": "in", "grouping": "shuffle"}],
            },
            {
                "id": "ledger",
                "bolt": f"tests.integration.bolts:{'LedgerBatchBolt' if batch else 'LedgerBolt'}",
                "parallelism": 2,
                "tasks": 4,
                "inputs": [{"from": "mid", "grouping": "fields", "fields": ["key"]}],
            },
        ],
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def rows_for(batch: int, n: int, keys: int = 40) -> list[list[Any]]:
    """Rows of one batch: (user key, amount), every batch different."""
    return [[f"u{(batch * 7919 + i) % keys}", batch * 1000 + i] for i in range(n)]


def expected(batches: Mapping[int, list[list[Any]]]) -> dict[str, list[int]]:
    """Per key: [count, sum] over every row of every batch, once."""
    out: dict[str, list[int]] = {}
    for rows in batches.values():
        for key, n in rows:
            entry = out.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += n
    return out


def ledger_state(state_dir: Path, topology: str, plan: Plan, component: str = "ledger") -> dict[str, list[int]]:
    """The committed state of every ledger task, merged (read from the embedded backend's files)."""
    backend = EmbeddedBackend(topology, state_dir)
    out: dict[str, list[int]] = {}
    for task in plan.component_tasks[component]:
        _, data = backend.task_store(task).restore()
        for key, value in data.items():
            assert key not in out, f"key {key} is in two tasks' state"
            out[key] = list(value)
    return out


class GroupWriter:
    """Sends batches to the source tasks as delivery groups and retries until every group is PROCESSED."""

    def __init__(self, plan: Plan, conns: Mapping[Slot, IClient], query: str = "q-ledger", partitions: int = 3) -> None:
        self.plan = plan
        self.conns = conns
        self.query = query
        self.partitions = partitions
        self.resent = 0
        self.sent = 0

    def _groups(self, batch: int, rows: list[list[Any]]) -> list[tuple[Slot, BatchHeader, list[TaskMessage]]]:
        sources = list(self.plan.component_tasks["in"])
        out = []
        for part in range(self.partitions):
            mine = rows[part :: self.partitions]
            per_slot: dict[Slot, list[TaskMessage]] = {}
            for i, row in enumerate(mine):
                task = sources[(part + i) % len(sources)]
                per_slot.setdefault(self.plan.task_slot[task], []).append(TaskMessage(task, msgpack.packb(row)))
            for seq, slot in enumerate(sorted(per_slot)):
                msgs = per_slot[slot]
                out.append((slot, BatchHeader(self.query, batch, part, seq, len(msgs), PROCESSED), msgs))
        return out

    def send(self, batch: int, rows: list[list[Any]], *, timeout: float = 120.0, ack_wait: float = 3.0) -> None:
        """Send a batch; resend each group until it is PROCESSED (a worker may die meanwhile)."""
        pending = self._groups(batch, rows)
        deadline = time.monotonic() + timeout
        first = True
        while pending:
            if time.monotonic() > deadline:
                msg = f"batch {batch}: {len(pending)} groups never PROCESSED"
                raise AssertionError(msg)
            for slot, header, msgs in pending:
                try:
                    self.conns[slot].send_group(header, msgs)
                    self.sent += 1
                except StormError:
                    pass  # closed or refused: resent next turn
            if not first:
                self.resent += len(pending)
            first = False
            still = []
            for slot, header, msgs in pending:
                got = self.conns[slot].wait_acks([header.key], PROCESSED, ack_wait)
                status = got.get(header.key)
                if status is None or status == FAILED:
                    still.append((slot, header, msgs))
            pending = still
