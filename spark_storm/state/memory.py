"""The ``memory`` backend: the embedded backend's structures in the worker's memory (tests).

Entries and records are encoded exactly as the durable backends store them, so the
codec and the restore logic are the same; only durability is missing: a worker that
dies loses its tasks' state, and a task that moves to another process starts empty.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from spark_storm.errors import StateCorruptError
from spark_storm.messaging.api import GroupKey
from spark_storm.state.backend import (
    NO_EPOCH,
    InputLog,
    StateBackend,
    TaskStore,
)
from spark_storm.state.format import (
    Entry,
    LogRecord,
    decode_entry,
    decode_record,
    encode_record,
)

__all__ = ["MemoryBackend"]


class _MemoryTaskStore(TaskStore):
    def __init__(self, task: int) -> None:
        super().__init__(task)
        self._entries: dict[int, bytes] = {}
        self._fulls: set[int] = set()
        self._committed = NO_EPOCH
        self._origin: str | None = None
        self._lock = threading.Lock()

    def describe(self) -> str:
        return f"task {self.task} in memory"

    def committed(self) -> int:
        return self._committed

    def epochs(self) -> list[int]:
        with self._lock:
            return sorted(self._entries)

    def fulls(self) -> list[int]:
        with self._lock:
            return sorted(self._fulls)

    def write_encoded(self, epoch: int, full: bool, parts: Sequence[bytes]) -> int:
        data = b"".join(parts)
        with self._lock:
            self._entries[epoch] = data
            if full:
                self._fulls.add(epoch)
            else:
                self._fulls.discard(epoch)
        return len(data)

    def read(self, epoch: int) -> Entry:
        data = self._entries.get(epoch)
        if data is None:
            msg = f"task {self.task}: no entry for epoch {epoch} in memory"
            raise StateCorruptError(msg)
        return decode_entry(data, f"task {self.task} (memory) epoch {epoch}")

    def mark_committed(self, epoch: int) -> None:
        self._committed = epoch

    def delete(self, epochs: list[int]) -> None:
        with self._lock:
            for epoch in epochs:
                self._entries.pop(epoch, None)
                self._fulls.discard(epoch)

    def read_raw(self, epoch: int) -> bytes:
        data = self._entries.get(epoch)
        if data is None:
            msg = f"task {self.task}: no entry for epoch {epoch} in memory"
            raise StateCorruptError(msg)
        return data

    def origin(self) -> str | None:
        return self._origin

    def set_origin(self, origin: str) -> None:
        self._origin = origin


class _MemoryInputLog(InputLog):
    def __init__(self, task: int) -> None:
        super().__init__(task)
        self._segments: list[list[Any]] = []  # [epoch, seq, [encoded records]]
        self._keys: dict[GroupKey, int] = {}
        self._batches: dict[str, int] = {}
        self._seq = 0
        self._barrier = NO_EPOCH
        self._origin: str | None = None

    def describe(self) -> str:
        return f"task {self.task}'s input log in memory"

    def append(self, record: LogRecord, epoch: int) -> None:
        if not self._segments or self._segments[-1][0] != epoch or self._segments[-1][2] is None:
            self._seq += 1
            self._segments.append([epoch, self._seq, []])
        self._segments[-1][2].append(encode_record(record))
        if record.key is not None:
            self._keys[record.key] = epoch

    def last_barrier(self) -> int:
        return self._barrier

    def close(self, epoch: int) -> None:
        self._barrier = max(self._barrier, epoch)
        if self._segments and self._segments[-1][0] <= epoch:
            self._seq += 1
            self._segments.append([epoch + 1, self._seq, []])

    def entries(self, after: int) -> Iterator[LogRecord]:
        where = f"task {self.task}'s input log (memory)"
        for epoch, _seq, records in sorted(self._segments, key=lambda s: (s[0], s[1])):
            if epoch > after:
                for data in records:
                    record, _ = decode_record(data, 0, where)
                    assert record is not None
                    yield record

    def retag(self, after: int, epoch: int) -> None:
        self._barrier = min(self._barrier, after)
        for segment in self._segments:
            if segment[0] > after:
                segment[0] = epoch
        for key, old in list(self._keys.items()):
            if old > after:
                self._keys[key] = epoch

    def truncate(self, epoch: int) -> None:
        self._keep([k for k, e in self._keys.items() if e <= epoch])
        self._segments = [s for s in self._segments if s[0] > epoch]
        self._keys = {k: e for k, e in self._keys.items() if e > epoch}

    def keys(self) -> set[GroupKey]:
        return set(self._keys)

    def has(self, key: GroupKey) -> bool:
        return key in self._keys or key in self._kept

    def _store_kept(self, keys: list[GroupKey]) -> None:
        pass  # in memory already

    def committed_batches(self) -> dict[str, int]:
        return dict(self._batches)

    def set_committed_batches(self, batches: Mapping[str, int]) -> None:
        for query, batch in batches.items():
            self._batches[query] = max(batch, self._batches.get(query, batch))
        self._prune_kept()

    def origin(self) -> str | None:
        return self._origin

    def set_origin(self, origin: str) -> None:
        self._origin = origin

    def _clear(self) -> None:
        self._segments, self._keys, self._batches, self._kept = [], {}, {}, {}
        self._barrier, self._origin = NO_EPOCH, None


class MemoryBackend(StateBackend):
    """Task stores and input logs in this process's memory (not durable: for tests)."""

    name = "memory"
    durable = False

    def __init__(self) -> None:
        self._stores: dict[int, _MemoryTaskStore] = {}
        self._logs: dict[int, _MemoryInputLog] = {}

    def task_store(self, task: int) -> TaskStore:
        store = self._stores.get(task)
        if store is None:
            store = self._stores[task] = _MemoryTaskStore(task)
        return store

    def input_log(self, task: int, writer: str) -> InputLog:
        log = self._logs.get(task)
        if log is None:
            log = self._logs[task] = _MemoryInputLog(task)
        return log
