"""Windows: a one-task harness for the window engines, and Spark's semantics computed by hand.

The harness runs a real windowed bolt class in a real executor (a WorkerState with the
``local`` transport and ``memory`` state, the executor built but not started: the harness is
its thread), so the task's input, ticks, checkpoints and rollbacks take the executor's own
paths; only the task's collector is a :class:`Recorder`.  ``checkpoint`` sends the epoch's
barrier from every upstream task and commits what the executor wrote, ``restart`` builds a
new worker on the same (kept) store, as a restarted worker finds its durable one.
"""

from __future__ import annotations

import random
import weakref
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.tuples import Barrier, Tuple, TupleSource
from spark_storm.config import Config
from spark_storm.reports import WindowMetrics
from spark_storm.state import StateBackend
from spark_storm.state.files import EmbeddedBackend
from spark_storm.state.kv import KeyValueState
from spark_storm.topology.assignment import Plan, plan
from spark_storm.topology.model import Input, TopologyBuilder
from spark_storm.worker.bolt import BatchOutputCollector, OutputCollector
from spark_storm.worker.checkpoint import CheckpointManager, ExecutorCheckpoints
from spark_storm.worker.executor import Executor
from spark_storm.worker.settings import WorkerSettings
from spark_storm.worker.state import WorkerState

FIELDS = ("ts", "user", "v")
OUT = ("start", "end", "key", "count", "id")


class Recorder(OutputCollector, BatchOutputCollector):
    """Keeps what the bolt emitted, acked and failed (the emits as rows, per stream)."""

    def __init__(self) -> None:
        self.emitted: dict[str, list[list[Any]]] = defaultdict(list)
        self.anchors: list[Any] = []
        self.acked = 0
        self.failed = 0
        self.errors: list[str] = []

    def emit(self, values: Sequence[Any], stream: str = "default", anchors: Any = None) -> list[int]:
        self.emitted[stream].append(list(values))
        self.anchors.append(anchors)
        return [1]

    def emit_direct(self, task: int, values: Sequence[Any], stream: str = "default", anchors: Any = None) -> None:
        self.emit(values, stream, anchors)

    def emit_batch(self, data: Any, stream: str = "default", anchors: Any = None, tasks: Any = None) -> None:
        table = data if isinstance(data, (pa.Table, pa.RecordBatch)) else pa.table(data)
        self.emitted[stream].extend(list(r.values()) for r in table.to_pylist())
        self.anchors.append(anchors)

    def ack(self, tup: Any) -> None:
        self.acked += len(tup) if isinstance(tup, ColumnarBatch) else 1

    def fail(self, tup: Any) -> None:
        self.failed += 1

    def report_error(self, error: str) -> None:
        self.errors.append(error)


class Harness:
    """One task of component ``w`` (``bolt``) subscribed to source ``in`` (fields ``ts, user, v``)."""

    def __init__(
        self,
        bolt: str,
        window: Mapping[str, Any],
        *,
        fields: Sequence[str] = FIELDS,
        conf: Mapping[str, Any] | None = None,
        late: bool = False,
        sources: Sequence[str] = ("in",),
        source_tasks: int = 1,
    ) -> None:
        builder = TopologyBuilder("windows")
        for name in sources:
            builder.source(name, list(fields), parallelism=source_tasks)
        outputs = {"late": list(fields)} if late else None
        inputs = [Input(name) for name in sources]
        builder.bolt("w", bolt, inputs, fields=list(OUT), outputs=outputs, conf=dict(conf or {}), window=dict(window))
        self.topology = builder.build()
        self.plan = plan(self.topology, "127.0.0.1:6700")
        self.component = self.topology.components["w"]
        # the watermark at every tuple (Storm's) unless a test asks for it at checkpoint epochs
        self.conf = Config.of(
            {
                "storm.messaging.transport": "local",
                "topology.state.provider": "memory",
                "record.dir": ".",
                "topology.bolts.watermark.at.epochs": False,
            }
        )
        self.sources = {
            name: TupleSource(name, self.plan.component_tasks[name][0], "default", fields) for name in sources
        }
        self.source = self.sources[sources[0]]
        self.task = self.plan.component_tasks["w"][0]
        self.start(None)

    def start(self, backend: StateBackend | None) -> None:
        """Build the worker and the task's executor, and prepare it (the bolt, its window engine, its state)."""
        slot = self.plan.task_slot[self.task]
        worker = WorkerState(self.plan, slot, self.conf, WorkerSettings.from_conf(self.conf), lambda *a, **k: None)
        manager = worker.checkpoints
        assert isinstance(manager, CheckpointManager), "a windowed topology is stateful"
        if backend is not None:
            manager.backend = backend  # the store a restarted worker finds (memory stands for durable here)
        weakref.finalize(self, manager.writer.close, 5.0)
        [spec] = [s for s in self.plan.executors_of(slot) if s.component == "w"]
        executor = worker.build_executor(spec)
        self.out = Recorder()
        executor._make_collector = lambda task: self.out  # type: ignore[method-assign]
        executor._prepare()
        self.worker, self.manager, self.executor = worker, manager, executor

    @property
    def bolt(self) -> Any:
        return self.executor.bolts[self.task]

    @property
    def state(self) -> KeyValueState:
        assert isinstance(self.executor.checkpoints, ExecutorCheckpoints)
        return self.executor.checkpoints.states[self.task]

    def _process(self, payload: Any) -> None:
        """Give the executor one queue item for the task, as its loop does; a bolt error fails the test."""
        executor: Executor = self.executor
        assert isinstance(executor.checkpoints, ExecutorCheckpoints)
        errors = executor.stats[self.task].errors
        executor.checkpoints.process([(self.task, payload)])
        executor.emitter.flush()
        if executor.stats[self.task].errors != errors:
            raise AssertionError(self.worker.errors[-1]["error"])

    def send(self, rows: Iterable[Sequence[Any]], source: str | None = None, task: int = 0) -> None:
        """Feed ``rows`` from ``source``'s ``task``-th task (its first by default)."""
        origin = self.sources[source] if source else self.source
        if task:
            name = origin.component
            origin = TupleSource(name, self.plan.component_tasks[name][task], "default", origin.fields)
        self._process([Tuple(list(row), origin) for row in rows])

    def send_batch(self, rows: Sequence[Sequence[Any]], schema: pa.Schema | None = None) -> None:
        columns: list[Sequence[Any]] = list(zip(*rows, strict=True)) if rows else [() for _ in self.source.fields]
        data = pa.record_batch(
            [pa.array(list(c), type=schema.field(i).type if schema else None) for i, c in enumerate(columns)],
            names=list(self.source.fields),
        )
        self._process(ColumnarBatch(data, self.source))

    def tick(self) -> None:
        self.executor._tick()
        self.executor.emitter.flush()

    def checkpoint(self, txid: int) -> dict[Any, Any]:
        """Epoch ``txid``: its barrier from every upstream task, the entry written, then committed; the state."""
        checkpoints = self.executor.checkpoints
        assert isinstance(checkpoints, ExecutorCheckpoints)
        upstream = sorted(checkpoints.expected[self.task])
        checkpoints.process([(self.task, Barrier(txid, self.manager.generation, t)) for t in upstream])
        self.executor.emitter.flush()
        assert self.manager.drain_writes(10.0), "the state writer is stuck"
        store = self.manager.task_store(self.task)
        assert txid in store.epochs(), f"epoch {txid} was not written (see the log)"
        store.commit(txid)  # the coordinator's COMMIT
        return dict(self.state.snapshot())

    def restart(self, txid: int) -> None:
        """A new worker on the state committed at ``txid``, the last (a SIGKILLed worker restarted)."""
        backend = self.manager.backend
        store = backend.task_store(self.task)
        assert store.committed() == txid, f"a restart finds the last committed epoch, {store.committed()}"
        store.discard_after(txid)  # what the killed worker wrote since is not committed
        self.start(backend)

    def rollback(self, txid: int) -> None:
        """The same worker rolled back in place to ``txid`` (the executor's checkpoints' own rollback)."""
        checkpoints = self.executor.checkpoints
        assert isinstance(checkpoints, ExecutorCheckpoints)
        checkpoints.reset()
        checkpoints.rollback(txid)

    def window_metrics(self) -> WindowMetrics:
        """The task's window counters, as the executor reports them in /health."""
        metrics = self.executor.metrics()["windows"]
        assert metrics is not None
        return metrics

    @property
    def windows(self) -> dict[tuple[int, int, Any], int]:
        """(start, end, key) -> count, from the default stream."""
        return {(r[0], r[1], r[2]): r[3] for r in self.out.emitted["default"]}


def spark_windows(
    rows: Iterable[Sequence[Any]], length: int, slide: int, *, ts: int = 0, key: int | None = 1
) -> dict[tuple[int, int, Any], int]:
    """Spark's ``groupBy(window(ts, length, slide), key).count()``: windows [s, s+length) with s a multiple of slide."""
    out: dict[tuple[int, int, Any], int] = defaultdict(int)
    for row in rows:
        t = row[ts]
        start = t - t % slide
        while start + length > t:
            out[(start, start + length, row[key] if key is not None else None)] += 1
            start -= slide
    return dict(out)


def spark_sessions(
    rows: Iterable[Sequence[Any]], gap: int, *, ts: int = 0, key: int | None = 1
) -> dict[tuple[int, int, Any], int]:
    """Spark's ``groupBy(session_window(ts, gap), key).count()``: [first, last + gap) per key."""
    per: dict[Any, list[int]] = defaultdict(list)
    for row in rows:
        per[row[key] if key is not None else None].append(row[ts])
    out: dict[tuple[int, int, Any], int] = {}
    for k, times in per.items():
        times.sort()
        start = last = times[0]
        n = 0
        for t in times:
            if t < last + gap:
                last, n = max(last, t), n + 1
                continue
            out[(start, last + gap, k)] = n
            start = last = t
            n = 1
        out[(start, last + gap, k)] = n
    return out


def closed(windows: Mapping[tuple[int, int, Any], int], watermark: int) -> dict[tuple[int, int, Any], int]:
    """The windows that end at or before ``watermark`` (the ones a task has fired)."""
    return {w: n for w, n in windows.items() if w[1] <= watermark}


# ------------------------------------------------------------- a windowed topology run by workers
T0 = 1_780_000_000_000
SPAN = 2000  # event time one batch covers (ms); the lag covers it, so nothing is late


def window_topology(tmp: Path, window: dict[str, Any], *, bolt: str = "WindowCount", name: str = "windows") -> Path:
    topo = {
        "name": name,
        "conf": {
            "topology.state.provider.config": {"dir": str(tmp / "state")},
            "topology.state.checkpoint.interval.ms": 0,
        },
        "components": [
            {"id": "in", "source": True, "fields": ["ts", "user", "v"], "parallelism": 2},
            {
                "id": "mid",
                "bolt": "spark_storm.worker.bolt:PassThroughBolt",
                "fields": ["ts", "user", "v"],
                "parallelism": 2,
                "inputs": [{"from": "in", "grouping": "shuffle"}],
            },
            {
                "id": "per-user",
                "bolt": f"spark_storm.examples.windows:{bolt}",
                "fields": ["start", "end", "key", "count", "id"],
                "parallelism": 2,
                "tasks": 4,
                "window": window,
                "inputs": [{"from": "mid", "grouping": "fields", "fields": ["user"]}],
            },
            {
                "id": "results",
                "bolt": "spark_storm.examples.windows:WindowResults",
                "parallelism": 2,
                "inputs": [{"from": "per-user", "grouping": "fields", "fields": ["id"]}],
            },
        ],
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def rows_of(batch: int, n: int = 500, users: int = 12) -> list[list[Any]]:
    """Batch ``batch``'s events: event times within its SPAN, shuffled (out of order within the lag)."""
    rng = random.Random(batch)
    rows = [[T0 + batch * SPAN + rng.randrange(SPAN), f"u{rng.randrange(users)}", batch * 10_000 + i] for i in range(n)]
    rng.shuffle(rows)
    return rows


def flush_rows(batch: int, users: int = 12) -> list[list[Any]]:
    """One event per user an hour later: every task's watermark passes every window of the data."""
    return [[T0 + batch * SPAN + 3_600_000, f"u{u}", -1] for u in range(users)]


def window_results(state_dir: Path, topology: str, plan: Plan) -> tuple[dict[tuple[int, int, Any], int], int]:
    """The committed windows (start, end, key) -> count of every ``results`` task, and the conflicts seen."""
    backend = EmbeddedBackend(topology, state_dir)
    out: dict[tuple[int, int, Any], int] = {}
    conflicts = 0
    for task in plan.component_tasks["results"]:
        _, data = backend.task_store(task).restore()
        for key, value in data.items():
            if key == "conflicts":
                conflicts += value
            elif isinstance(key, (list, tuple)) and key[0] == "window":
                start, end, user, count, _wid = value
                assert (start, end, user) not in out, f"window {(start, end, user)} in two results"
                out[(start, end, user)] = count
    return out, conflicts
