"""Vectorised routing of Arrow record batches to task ids (Spark writers and batch bolts).

Row -> task is computed per column with numpy, never per Python row, and agrees exactly
with the per-tuple groupers (``spark_storm.topology.grouping``) for the same topology:

* shuffle (and none): a batch is cut into one contiguous slice per target (sizes differ
  by at most one row; slices cost no copy), the first slice to the target after the one
  that got the previous batch's first slice — the Spark writer starts at its partition
  id over the sorted tasks (deterministic, so a retried task sends the same groups), a
  batch bolt's router from a random start over a shuffled order;
* fields: Spark's ``hash(cols)`` (Murmur3 x86_32, seed 42, integers as longs) in numpy,
  then ``pmod(hash, n)`` — the same value ``topology.hashing.fields_hash`` gives (the
  two are twins: they share the constants, and a property test checks them row by row);
* all: every row to every task; global: the lowest task; direct: explicit task ids (a
  column on the Spark side, ``emit_batch(..., tasks=...)`` in a batch bolt);
* local_or_shuffle: round-robin over the targets in this worker, if any;
  load_aware: the batch is cut into as many slices as targets and each slice goes to
  the less loaded of two random targets (power of two choices, per slice).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from spark_storm.errors import ConfigError
from spark_storm.topology.hashing import (
    MURMUR3_C1,
    MURMUR3_C2,
    MURMUR3_FMIX1,
    MURMUR3_FMIX2,
    MURMUR3_H1_ADD,
    SPARK_HASH_SEED,
)
from spark_storm.topology.model import Component, Input

__all__ = ["Router", "make_batch_router", "spark_hash", "split_by_task"]

_C1 = np.uint32(MURMUR3_C1)
_C2 = np.uint32(MURMUR3_C2)


def _rotl(x: Any, r: int) -> Any:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: Any) -> Any:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: Any, k1: Any) -> Any:
    h1 = h1 ^ k1
    return _rotl(h1, 13) * np.uint32(5) + np.uint32(MURMUR3_H1_ADD)


def _fmix(h1: Any, length: Any) -> Any:
    h1 = h1 ^ length.astype(np.uint32)
    h1 = h1 ^ (h1 >> np.uint32(16))
    h1 = h1 * np.uint32(MURMUR3_FMIX1)
    h1 = h1 ^ (h1 >> np.uint32(13))
    h1 = h1 * np.uint32(MURMUR3_FMIX2)
    return h1 ^ (h1 >> np.uint32(16))


def _hash_long(values: Any, seed: Any) -> Any:
    v = values.astype(np.int64).view(np.uint64)
    h1 = _mix_h1(seed, _mix_k1((v & np.uint64(0xFFFFFFFF)).astype(np.uint32)))
    h1 = _mix_h1(h1, _mix_k1((v >> np.uint64(32)).astype(np.uint32)))
    return _fmix(h1, np.full(len(v), 8, dtype=np.uint32))


def _hash_int(values: Any, seed: Any) -> Any:
    h1 = _mix_h1(seed, _mix_k1(values.astype(np.int64).astype(np.uint32)))
    return _fmix(h1, np.full(len(values), 4, dtype=np.uint32))


def _hash_binary(arr: pa.Array, seed: Any) -> Any:
    """Spark's hashUnsafeBytes over a (large_)string/binary array, one round per 4-byte word."""
    arr = arr.cast(pa.large_binary())
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data_buf = arr.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    lengths = (offsets[1:] - starts).astype(np.int64)
    words = lengths // 4
    h1 = seed.copy()
    padded = np.concatenate([data, np.zeros(4, np.uint8)])
    for k in range(int(words.max()) if len(words) else 0):
        active = words > k
        pos = starts[active] + 4 * k
        word = (
            padded[pos].astype(np.uint32)
            | (padded[pos + 1].astype(np.uint32) << np.uint32(8))
            | (padded[pos + 2].astype(np.uint32) << np.uint32(16))
            | (padded[pos + 3].astype(np.uint32) << np.uint32(24))
        )
        h1[active] = _mix_h1(h1[active], _mix_k1(word))
    tails = lengths - words * 4
    for t in range(3):
        active = tails > t
        if not active.any():
            break
        byte = padded[starts[active] + words[active] * 4 + t].astype(np.int8).astype(np.int32)
        h1[active] = _mix_h1(h1[active], _mix_k1(byte.astype(np.uint32)))
    return _fmix(h1, lengths.astype(np.uint32))


def spark_hash(columns: Sequence[pa.Array]) -> Any:
    """``pyspark.sql.functions.hash(*columns)`` for every row, as a numpy int32 array."""
    n = len(columns[0]) if columns else 0
    seed = np.full(n, SPARK_HASH_SEED, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for col in columns:
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks()
            valid = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
            t = col.type
            if pa.types.is_integer(t):
                new = _hash_long(np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False)), seed)
            elif pa.types.is_boolean(t):
                new = _hash_int(np.asarray(col.fill_null(False).to_numpy(zero_copy_only=False)), seed)
            elif pa.types.is_floating(t):
                f = np.asarray(col.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False))
                f = np.where(f == 0.0, 0.0, f)  # -0.0 hashes like 0.0
                new = _hash_long(f.view(np.int64), seed)
            elif (
                pa.types.is_string(t)
                or pa.types.is_large_string(t)
                or pa.types.is_binary(t)
                or pa.types.is_large_binary(t)
            ):
                new = _hash_binary(col, seed)
            else:
                msg = (
                    f"fields grouping cannot hash column type {t}; "
                    "group on string, integer, float, boolean or binary columns"
                )
                raise ConfigError(msg)
            seed = np.where(valid, new, seed)
    return seed.view(np.int32)


class Router:
    """Routes the rows of record batches to task ids, for one sender and one subscription.

    Parameters
    ----------
    tasks : sequence of int
        The consumer component's tasks.
    grouping : str
        ``shuffle``/``none``, ``fields``, ``all``, ``global``, ``direct``,
        ``local_or_shuffle`` or ``load_aware``.
    key_columns : sequence of str
        Columns hashed by fields grouping.
    task_column : str, optional
        Column holding explicit task ids (direct, Spark side).
    start : int
        Round-robin start (the Spark partition id; any offset for batch bolts).
    order : sequence of int, optional
        Round-robin order (default: the sorted tasks); a subset for local_or_shuffle.
    load : callable, optional
        ``load(tasks) -> {task: 0..1}`` for load_aware.
    rng : random.Random, optional
        For load_aware's choices.
    """

    def __init__(
        self,
        tasks: Sequence[int],
        grouping: str,
        key_columns: Sequence[str] = (),
        task_column: str | None = None,
        start: int = 0,
        order: Sequence[int] | None = None,
        load: Any = None,
        rng: random.Random | None = None,
    ) -> None:
        self.tasks = np.asarray(sorted(tasks), dtype=np.int64)
        if grouping in ("none", "local_or_shuffle") or (grouping == "load_aware" and load is None):
            grouping = "shuffle"  # a sender with no local tasks or loads to weigh: plain shuffle
        self.grouping = "direct" if task_column else grouping
        self.key_columns = list(key_columns)
        self.task_column = task_column
        self._order = np.asarray(order if order else sorted(tasks), dtype=np.int64)
        self._next = start % len(self._order) if len(self._order) else 0
        self._load = load
        self._rng = rng or random.Random()

    def route(self, batch: pa.RecordBatch, tasks: Any = None) -> Any | None:
        """Task id per row (numpy int64), or None for "all" (every row to every task).

        ``tasks`` gives explicit ids for direct grouping (an int for every row, or one
        per row) when there is no task column.

        Raises
        ------
        ValueError
            Direct routing found task ids outside the component's tasks (names them), or
            direct routing got no task ids.
        """
        n = batch.num_rows
        g = self.grouping
        if g == "all":
            return None
        if g == "global":
            return np.full(n, self.tasks[0], dtype=np.int64)
        if g == "fields" and len(self.tasks) == 1:
            return np.full(n, self.tasks[0], dtype=np.int64)
        if g == "fields":
            h = spark_hash([batch.column(c) for c in self.key_columns]).astype(np.int64)
            return self.tasks[np.mod(h, len(self.tasks))]
        if g == "direct":
            return self._direct(batch, tasks)
        if g == "load_aware" and len(self.tasks) > 1:
            return self._load_aware(n)
        order = self._order
        idx = (self._next + np.arange(n, dtype=np.int64)) % len(order)
        self._next = (self._next + n) % len(order)
        return order[idx]

    def split(self, batch: pa.RecordBatch, tasks: Any = None) -> list[tuple[int, pa.RecordBatch]]:
        """Cut ``batch`` into (task, rows) pieces (stable order within each task).

        Shuffle cuts contiguous slices (zero copy); other groupings route every row and
        gather each task's rows.

        Raises
        ------
        ValueError
            As :meth:`route`.
        """
        if self.grouping == "shuffle":
            order = self._order
            k = len(order)
            n = batch.num_rows
            bounds = np.linspace(0, n, min(k, n) + 1).astype(np.int64) if n else np.zeros(1, np.int64)
            first = self._next
            self._next = (self._next + 1) % k
            return [
                (int(order[(first + i) % k]), batch.slice(int(lo), int(hi - lo)))
                for i, (lo, hi) in enumerate(itertools.pairwise(bounds))
            ]
        if self.grouping in ("fields", "global") and len(self.tasks) == 1 and batch.num_rows:
            return [(int(self.tasks[0]), batch)]  # one target: the batch as it is, nothing hashed or copied
        return split_by_task(batch, self.route(batch, tasks), self.tasks.tolist())

    def _direct(self, batch: pa.RecordBatch, tasks: Any) -> Any:
        if self.task_column is not None:
            col = batch.column(self.task_column)
            if col.null_count:
                msg = f"taskColumn {self.task_column!r} has {col.null_count} null task ids; every row needs one"
                raise ValueError(msg)
            ids = np.asarray(col.cast(pa.int64()).to_numpy(zero_copy_only=False))
            what = f"taskColumn {self.task_column!r}"
        elif tasks is None:
            msg = "this stream uses direct grouping: pass the task ids, emit_batch(data, tasks=...)"
            raise ValueError(msg)
        elif isinstance(tasks, int):
            ids = np.full(batch.num_rows, tasks, dtype=np.int64)
            what = "tasks"
        else:
            ids = np.asarray(tasks, dtype=np.int64)
            what = "tasks"
            if len(ids) != batch.num_rows:
                msg = f"direct grouping got {len(ids)} task ids for {batch.num_rows} rows; give one per row"
                raise ValueError(msg)
        bad = ~np.isin(ids, self.tasks)
        if bad.any():
            shown = sorted(set(ids[bad].tolist()))[:10]
            msg = (
                f"{what} holds task ids {shown} outside the component's tasks "
                f"{self.tasks[0]}..{self.tasks[-1]} ({int(bad.sum())} rows); fix the ids or the topology"
            )
            raise ValueError(msg)
        return ids

    def _load_aware(self, n: int) -> Any:
        targets = self.tasks.tolist()
        out = np.empty(n, dtype=np.int64)
        slices = min(len(targets), n) or 1
        bounds = np.linspace(0, n, slices + 1).astype(np.int64)
        for lo, hi in itertools.pairwise(bounds):
            a, b = self._rng.sample(targets, 2)
            loads = self._load((a, b))
            out[lo:hi] = a if loads.get(a, 0.0) <= loads.get(b, 0.0) else b
        return out


class CustomRouter(Router):
    """A custom grouping over batches: its ``choose_tasks`` per row (a row may go to several tasks)."""

    def __init__(self, targets: Sequence[int], grouper: Any) -> None:
        super().__init__(targets, "custom")
        self._grouper = grouper

    def split(self, batch: pa.RecordBatch, tasks: Any = None) -> list[tuple[int, pa.RecordBatch]]:
        rows: dict[int, list[int]] = {}
        for i, values in enumerate(zip(*(c.to_pylist() for c in batch.columns), strict=True)):
            for task in self._grouper.choose(list(values)):
                rows.setdefault(task, []).append(i)
        return [(task, batch.take(pa.array(idx, type=pa.int64()))) for task, idx in sorted(rows.items())]


def make_batch_router(
    inp: Input,
    source: Component,
    targets: Sequence[int],
    *,
    local_tasks: Iterable[int] = (),
    load: Any = None,
    rng: random.Random | None = None,
) -> Router:
    """Build the router of one (sender, subscription): the vectorised twin of ``grouping.make_grouper``."""
    rng = rng or random.Random()
    g = inp.grouping
    if g == "custom":
        from spark_storm.topology.grouping import make_custom_grouping

        return CustomRouter(targets, make_custom_grouping(inp, source, targets))
    if g == "fields":
        declared = source.fields_of(inp.stream)
        missing = [f for f in inp.fields if f not in declared]
        if missing:  # pragma: no cover - Topology validation rejects it
            msg = f"fields grouping on {missing}, which {source.id!r} does not declare"
            raise ConfigError(msg)
        return Router(targets, "fields", inp.fields)
    order = list(targets)
    if g in ("shuffle", "none", "local_or_shuffle"):
        if g == "local_or_shuffle":
            local = set(local_tasks)
            order = [t for t in targets if t in local] or order
        rng.shuffle(order)
        return Router(targets, "shuffle", order=order, start=rng.randrange(len(order)))
    return Router(targets, g, load=load, rng=rng)


def split_by_task(
    batch: pa.RecordBatch, tasks: Any | None, all_tasks: Sequence[int]
) -> list[tuple[int, pa.RecordBatch]]:
    """Group a batch's rows by task id (stable order within each task)."""
    if tasks is None:
        return [(int(t), batch) for t in all_tasks]
    if len(tasks) == 0:
        return []
    first = tasks[0]
    if (tasks == first).all():  # one destination: no copy
        return [(int(first), batch)]
    cuts = np.flatnonzero(np.diff(tasks)) + 1
    if len(np.unique(tasks)) == len(cuts) + 1:  # each task's rows already contiguous: slices, no copy
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [len(tasks)]])
        return [(int(tasks[lo]), batch.slice(int(lo), int(hi - lo))) for lo, hi in zip(starts, ends, strict=True)]
    order = np.argsort(tasks, kind="stable")
    sorted_tasks = tasks[order]
    bounds = np.flatnonzero(np.diff(sorted_tasks)) + 1
    out = []
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(order)]]), strict=True):
        out.append((int(sorted_tasks[lo]), batch.take(pa.array(order[lo:hi]))))
    return out
