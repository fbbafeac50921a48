"""Windows: a one-task harness for the window engines, and Spark's semantics computed by hand.

The harness runs a real windowed bolt class with a real plan, context and KeyValueState;
what it stands in for is the executor (it calls ``execute`` / ``execute_batch``) and the
checkpoint machinery (``checkpoint`` snapshots the state as a committed epoch would be,
``restart`` builds a fresh bolt from such a snapshot, as a restarted worker does).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.tuples import TICK_SOURCE, Tuple, TupleSource
from spark_storm.state.files import EmbeddedBackend
from spark_storm.state.kv import KeyValueState
from spark_storm.topology.assignment import Plan, plan
from spark_storm.topology.model import Input, TopologyBuilder
from spark_storm.worker.bolt import BatchOutputCollector, OutputCollector, TopologyContext

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
        self.conf = {"topology.bolts.watermark.at.epochs": False, **self.topology.conf, **self.component.conf}
        self.sources = {
            name: TupleSource(name, self.plan.component_tasks[name][0], "default", fields) for name in sources
        }
        self.source = self.sources[sources[0]]
        self.task = self.plan.component_tasks["w"][0]
        self.checkpoints: dict[int, dict[Any, Any]] = {}
        self.start(KeyValueState())

    def start(self, state: KeyValueState) -> None:
        from spark_storm.topology.model import resolve_class

        cls = resolve_class(self.component.bolt, "bolt")
        self.bolt = cls()
        self.out = Recorder()
        ctx = TopologyContext(
            "windows", "w", self.task, (self.task,), dict(self.component.outputs), "127.0.0.1:6700", self.plan
        )
        self.bolt.prepare(self.conf, ctx, self.out)
        self.state = state
        self.bolt.init_state(state)
        self.bolt._state_restored(state)

    def send(self, rows: Iterable[Sequence[Any]], source: str | None = None, task: int = 0) -> None:
        """Feed ``rows`` from ``source``'s ``task``-th task (its first by default)."""
        origin = self.sources[source] if source else self.source
        if task:
            name = origin.component
            origin = TupleSource(name, self.plan.component_tasks[name][task], "default", origin.fields)
        for row in rows:
            self.bolt.execute(Tuple(list(row), origin))

    def send_batch(self, rows: Sequence[Sequence[Any]], schema: pa.Schema | None = None) -> None:
        columns: list[Sequence[Any]] = list(zip(*rows, strict=True)) if rows else [() for _ in self.source.fields]
        data = pa.record_batch(
            [pa.array(list(c), type=schema.field(i).type if schema else None) for i, c in enumerate(columns)],
            names=list(self.source.fields),
        )
        self.bolt.execute_batch(ColumnarBatch(data, self.source))

    def tick(self) -> None:
        if hasattr(self.bolt, "execute_batch"):
            self.bolt.execute_batch(ColumnarBatch(pa.record_batch({"ts": [0.0]}), TICK_SOURCE))
        else:
            self.bolt.execute(Tuple([0.0], TICK_SOURCE))

    def checkpoint(self, txid: int) -> dict[Any, Any]:
        """Write epoch ``txid`` as the checkpoint machinery does; return the state as committed."""
        self.bolt._state_saving(txid)
        self.bolt.pre_prepare(txid)
        self.state.take_changes()
        snapshot = dict(self.state.snapshot())
        self.checkpoints[txid] = snapshot
        return snapshot

    def restart(self, txid: int) -> None:
        """A new bolt from the state committed at ``txid`` (a SIGKILLed worker restarted)."""
        self.start(KeyValueState(self.checkpoints[txid]))

    def rollback(self, txid: int) -> None:
        """The same bolt rolled back in place to ``txid`` (a rollback of a live worker)."""
        self.bolt.pre_rollback()
        self.state.restore(self.checkpoints[txid])
        self.bolt._state_restored(self.state)

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
