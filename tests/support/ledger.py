"""The keyed ledger of the exactness tests: a topology, a writer that behaves like Spark's, the answer key.

The writer sends each batch as delivery groups keyed (query, batch, partition, sequence),
waits for PROCESSED and resends what failed or timed out (as Spark retries a task), so a
batch's rows reach the workers' input logs exactly once whatever the workers do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import msgpack
import yaml

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.errors import StormError
from spark_storm.messaging import IClient, TaskMessage
from spark_storm.messaging.wire import FAILED, PROCESSED, BatchHeader
from spark_storm.state.files import EmbeddedBackend
from spark_storm.state.protocol import Coordinator
from spark_storm.topology import Plan, Slot
from spark_storm.transport import make_context
from tests.support import wait_until


def ledger_topology(
    tmp: Path,
    *,
    batch: bool = False,
    name: str = "ledger",
    conf: dict[str, Any] | None = None,
    sources: int = 2,
    mid: str = "spark_storm.worker.bolt:PassThroughBolt",
) -> Path:
    """in (source, ``sources`` tasks) -> mid (``mid``, pass-through, 2) -> ledger (stateful, 4 tasks, fields key)."""
    topo = {
        "name": name,
        "conf": {
            "topology.state.provider.config": {"dir": str(tmp / "state")},
            "topology.state.checkpoint.interval.ms": 0,
            **(conf or {}),
        },
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": sources},
            {
                "id": "mid",
                "bolt": mid,
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

    def __init__(
        self,
        plan: Plan,
        conns: Mapping[Slot, IClient],
        query: str = "q-ledger",
        partitions: int = 3,
        *,
        coordinated: bool = True,
    ) -> None:
        self.plan = plan
        self.conns = conns
        self.query = query
        self.partitions = partitions
        #: As Spark's writer does: the "driver" (:meth:`ExactRun.commit`) commits each batch itself.
        self.coordinated = coordinated
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
                header = BatchHeader(self.query, batch, part, seq, len(msgs), PROCESSED, self.coordinated)
                out.append((slot, header, msgs))
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


OVERRIDES = {"storm.messaging.tcp.min_wait_ms": 20, "storm.messaging.tcp.max_wait_ms": 200}


class ExactRun:
    """Worker processes of one topology, fed like Spark feeds it: delivery groups to its source ``in``
    (a :class:`GroupWriter`), and the driver's commit (a checkpoint round)."""

    def __init__(self, topology: Path, workers: int = 2, *, coordinated: bool = True) -> None:
        self.topology = topology
        self.coordinated = coordinated
        self.cluster = LocalCluster(
            str(self.topology), workers, overrides=OVERRIDES, work_dir=topology.parent / "workers"
        )
        self.ctx = make_context({"storm.messaging.transport": "tcp", **OVERRIDES})
        self.batches: dict[int, list[list[Any]]] = {}

    def __enter__(self) -> Self:
        self.cluster.start()  # stops what it started if a worker does not come up
        try:
            self.conns = {s: self.ctx.connect(self.cluster.topology.name, s.host, s.port) for s in self.cluster.slots}
            for conn in self.conns.values():
                assert conn.wait_ready(30)
            self.writer = GroupWriter(self.cluster.plan, self.conns, coordinated=self.coordinated)
            self.coordinator = Coordinator("test", lambda: {str(s): c for s, c in self.conns.items()}, 60.0, 3)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.ctx.term()
        self.cluster.stop()

    def send(self, batch: int, rows: list[list[Any]]) -> None:
        self.batches[batch] = rows
        self.writer.send(batch, rows)

    def commit(self, batch: int) -> Any:
        return self.coordinator.checkpoint({self.writer.query: batch})

    def restart(self, index: int) -> None:
        slot = self.cluster.slots[index]
        self.cluster.kill(slot)
        self.cluster.start_worker(slot)

    def health(self, index: int) -> dict[str, Any]:
        """Worker ``index``'s ``/health`` (empty while it has no endpoint or does not answer)."""
        try:
            return dict(self.cluster.health(self.cluster.slots[index], timeout=5))
        except (StormError, OSError):
            return {}

    def executed(self, tasks: Sequence[int]) -> int:
        """Tuples these tasks' bolts have run, from their workers' ``/health``."""
        plan = self.cluster.plan
        wanted = {str(t) for t in tasks}
        return sum(
            stats["executed"]
            for slot in {plan.task_slot[t] for t in tasks}
            for executor in self.cluster.health(slot)["executors"].values()
            for task, stats in executor["tasks"].items()
            if task in wanted
        )

    def accepted(self, index: int) -> int:
        return int(self.health(index).get("counters", {}).get("source_tuples_in", 0))

    def with_source(self, *, other_than: int | None = None) -> int:
        """Index of a worker that runs a source task (the plan decides which do)."""
        plan = self.cluster.plan
        hosting = {plan.task_slot[t] for t in plan.component_tasks["in"]}
        return next(i for i, s in enumerate(self.cluster.slots) if s in hosting and i != other_than)

    def kill_mid_batch(self, victim: int, batch: int, rows: list[list[Any]]) -> threading.Thread:
        """Start sending ``batch`` and SIGKILL+restart ``victim`` once it is accepting that batch's rows."""
        self.batches[batch] = rows
        before = self.accepted(victim)
        sender = threading.Thread(target=self.writer.send, args=(batch, rows))
        sender.start()
        wait_until(lambda: self.accepted(victim) > before, what=f"worker {victim} accepting batch {batch}", timeout=30)
        self.restart(victim)
        return sender


class Ledger(ExactRun):
    """The keyed ledger topology (:func:`ledger_topology`) run by worker processes."""

    def __init__(
        self,
        tmp: Path,
        workers: int = 2,
        *,
        batch: bool = False,
        conf: dict[str, Any] | None = None,
        mid: str = "spark_storm.worker.bolt:PassThroughBolt",
        coordinated: bool = True,
    ) -> None:
        super().__init__(ledger_topology(tmp, batch=batch, conf=conf, mid=mid), workers, coordinated=coordinated)
        self.tmp = tmp

    def feed(self, batch: int, n: int = 600) -> None:
        self.send(batch, rows_for(batch, n))

    def state(self) -> dict[str, list[int]]:
        return ledger_state(self.tmp / "state", self.cluster.topology.name, self.cluster.plan)

    def kill_mid_batch(self, victim: int, batch: int, n: int) -> threading.Thread:  # type: ignore[override]
        return super().kill_mid_batch(victim, batch, rows_for(batch, n))
