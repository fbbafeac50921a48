"""The embedded backend (``topology.state.provider: embedded``, the default): files, no server.

Layout, under ``<dir>/<topology>/`` (``dir`` from ``topology.state.provider.config``,
default ``<temp dir>/spark-storm-state``), one directory per task, shared by the workers
of a host so that a task that moves between them keeps its state::

    task-7/COMMITTED                        {"epoch": 41}
    task-7/e000000000041.full               the whole state at epoch 41 (a snapshot)
    task-7/e000000000042.delta              keys changed in epoch 42 (tombstones for deletes)
    task-3/log/BATCHES                      {"<query id>": 17}: batches in committed state
    task-7/ORIGIN, task-3/log/ORIGIN        {"origin": "<restore id>"}: the savepoint restore it came from
    task-3/log/e000000000043-s000000000009-h_6700_4242.log   records a worker accepted

Entries are written to a temporary file, ``fsync``ed and renamed into place, so a reader
sees a whole entry or none.  Input-log records are appended with one ``write`` each (the
OS keeps them through a SIGKILL of the worker) and ``fsync``ed when their segment closes
at a barrier, before the checkpoint is acknowledged (``topology.state.log.fsync: group``
syncs every record, for machines that may lose power).
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from spark_storm.errors import StateCorruptError, StateError
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
    encode_record_parts,
)

__all__ = ["EmbeddedBackend", "FileInputLog", "FileTaskStore", "default_state_dir"]

logger = logging.getLogger(__name__)

_ENTRY: Final = re.compile(r"^e(\d{12,})\.(full|delta)$")
_SEGMENT: Final = re.compile(r"^e(\d{12,})-s(\d{12,})-([A-Za-z0-9_.-]+)\.log$")


def default_state_dir() -> Path:
    """``<temp dir>/spark-storm-state``: shared by every worker of this host."""
    return Path(tempfile.gettempdir()) / "spark-storm-state"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_IOV_MAX: Final = 1024  # buffers per writev (Linux's IOV_MAX)


def _write_parts(fd: int, parts: Sequence[bytes]) -> int:
    """Write the parts in order with ``writev`` (resumed after a short write); return the bytes written.

    Two parts or fewer (a header and a body: no big value by reference) are joined and
    written at once, which costs less than ``writev``'s views for the small records of the
    receive path.
    """
    if len(parts) <= 2:
        data = memoryview(b"".join(parts))
        total = data.nbytes
        while data:
            data = data[os.write(fd, data) :]
        return total
    views = deque(memoryview(p) for p in parts if len(p))
    total = sum(v.nbytes for v in views)
    while views:
        written = os.writev(fd, [views[i] for i in range(min(_IOV_MAX, len(views)))])
        while written:
            head = views[0]
            if written >= head.nbytes:
                written -= head.nbytes
                views.popleft()
            else:
                views[0] = head[written:]
                written = 0
    return total


def _write_atomic(path: Path, data: bytes | Sequence[bytes]) -> int:
    """Write ``data`` (bytes, or parts in order) to ``path`` durably, all or nothing; return its length."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        length = _write_parts(fd, [data] if isinstance(data, bytes) else data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return length


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        msg = f"{what}: {path} is unreadable ({exc}); it is corrupt or truncated"
        raise StateCorruptError(msg) from exc


def _read_origin(path: Path, what: str) -> str | None:
    data = _read_json(path, what)
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("origin"), str):
        msg = f"{what}: {path} holds {data!r}, not a restore id; it is corrupt (delete it to restore again)"
        raise StateCorruptError(msg)
    return str(data["origin"])


class FileTaskStore(TaskStore):
    """A task's changelog as one file per epoch."""

    def __init__(self, task: int, directory: Path) -> None:
        super().__init__(task)
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        return f"task {self.task} in {self.dir}"

    def _entries(self) -> dict[int, Path]:
        out = {}
        try:
            names = os.listdir(self.dir)
        except OSError as exc:
            msg = f"task {self.task}: cannot list {self.dir}: {exc}"
            raise StateError(msg) from exc
        for name in names:
            m = _ENTRY.match(name)
            if m:
                out[int(m.group(1))] = self.dir / name
        return out

    def committed(self) -> int:
        marker = _read_json(self.dir / "COMMITTED", f"task {self.task}")
        if marker is None:
            return NO_EPOCH
        try:
            return int(marker["epoch"])
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"task {self.task}: {self.dir / 'COMMITTED'} holds {marker!r}, not an epoch; it is corrupt"
            raise StateCorruptError(msg) from exc

    def epochs(self) -> list[int]:
        return sorted(self._entries())

    def fulls(self) -> list[int]:
        return sorted(e for e, p in self._entries().items() if p.name.endswith(".full"))

    def write_encoded(self, epoch: int, full: bool, parts: Sequence[bytes]) -> int:
        # big values are written from where they lie (writev), not joined
        for stale in [p for e, p in self._entries().items() if e == epoch]:  # a rewrite after a rollback
            stale.unlink(missing_ok=True)
        return _write_atomic(self.dir / f"e{epoch:012d}.{'full' if full else 'delta'}", parts)

    def read(self, epoch: int) -> Entry:
        path = self._entries().get(epoch)
        if path is None:
            msg = f"task {self.task}: no entry for epoch {epoch} in {self.dir}"
            raise StateCorruptError(msg)
        try:
            data = path.read_bytes()
        except OSError as exc:
            msg = f"task {self.task}: cannot read {path}: {exc}"
            raise StateCorruptError(msg) from exc
        entry = decode_entry(data, f"task {self.task}: {path}")
        if entry.epoch != epoch:
            msg = f"task {self.task}: {path} holds epoch {entry.epoch}; it was renamed or is corrupt"
            raise StateCorruptError(msg)
        return entry

    def mark_committed(self, epoch: int) -> None:
        _write_atomic(self.dir / "COMMITTED", json.dumps({"epoch": epoch}).encode())

    def delete(self, epochs: list[int]) -> None:
        entries = self._entries()
        for epoch in epochs:
            path = entries.get(epoch)
            if path is not None:
                path.unlink(missing_ok=True)

    def read_raw(self, epoch: int) -> bytes:
        path = self._entries().get(epoch)
        if path is None:
            msg = f"task {self.task}: no entry for epoch {epoch} in {self.dir}"
            raise StateCorruptError(msg)
        return path.read_bytes()

    def entry_path(self, epoch: int) -> Path | None:
        """Return the file of epoch ``epoch``'s entry (None: there is none)."""
        return self._entries().get(epoch)

    def origin(self) -> str | None:
        return _read_origin(self.dir / "ORIGIN", f"task {self.task}")

    def set_origin(self, origin: str) -> None:
        _write_atomic(self.dir / "ORIGIN", json.dumps({"origin": origin}).encode())


class FileInputLog(InputLog):
    """A source task's input log as segment files (see the module doc)."""

    def __init__(self, task: int, directory: Path, writer: str, fsync_each: bool = False) -> None:
        super().__init__(task)
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._writer = re.sub(r"[^A-Za-z0-9_.-]", "_", writer)
        self._fsync_each = fsync_each
        self._fd: int | None = None
        self._open: tuple[int, int] | None = None  # (epoch, seq) of the segment being appended to
        self._unsynced: list[Path] = []
        self._keys: dict[GroupKey, int] = {}  # group key -> epoch of its segment
        kept = _read_json(self.dir / "KEPT", f"task {self.task}") or []
        self._kept = {(str(k[0]), int(k[1]), int(k[2]), int(k[3])): None for k in kept}
        for epoch, _seq, path in self._segments():
            for record in self._read(path):
                if record.key is not None:
                    self._keys[record.key] = epoch

    def describe(self) -> str:
        return f"task {self.task}'s input log in {self.dir}"

    def _segments(self) -> list[tuple[int, int, Path]]:
        out = []
        for name in os.listdir(self.dir):
            m = _SEGMENT.match(name)
            if m:
                out.append((int(m.group(1)), int(m.group(2)), self.dir / name))
        out.sort(key=lambda s: (s[0], s[1]))
        return out

    def _read(self, path: Path) -> Iterator[LogRecord]:
        where = f"task {self.task}: {path}"
        try:
            data = path.read_bytes()
        except OSError as exc:
            msg = f"{where}: cannot read: {exc}"
            raise StateCorruptError(msg) from exc
        pos = 0
        while pos < len(data):
            record, pos_next = decode_record(data, pos, where)
            if record is None:  # written up to a crash: never acknowledged, so nobody waits for it
                logger.warning("%s: ignoring a truncated last record (%d bytes)", where, len(data) - pos)
                return
            yield record
            pos = pos_next

    def append(self, record: LogRecord, epoch: int) -> None:
        if self._open is None or self._open[0] != epoch:
            self._rotate(epoch)
        assert self._fd is not None
        _write_parts(self._fd, encode_record_parts(record))  # big payloads are written from where they are
        if self._fsync_each:
            os.fsync(self._fd)
        if record.key is not None:
            self._keys[record.key] = epoch

    def _rotate(self, epoch: int) -> None:
        self._close_fd()
        seq = max((s for _, s, _ in self._segments()), default=0) + 1
        path = self.dir / f"e{epoch:012d}-s{seq:012d}-{self._writer}.log"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._open = (epoch, seq)
        self._unsynced.append(path)

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            self._open = None

    def close(self, epoch: int) -> None:
        self.seal(epoch)()

    def seal(self, epoch: int) -> Callable[[], None]:
        fd = None
        if self._open is not None and self._open[0] <= epoch:  # the next append opens a new segment
            fd, self._fd, self._open = self._fd, None, None
        unsynced, self._unsynced = self._unsynced, []

        def make_durable() -> None:  # outside the gate: appends go on into the next segment meanwhile
            if fd is not None:
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            if unsynced:
                _fsync_dir(self.dir)
            if epoch > self.last_barrier():
                _write_atomic(self.dir / "BARRIER", json.dumps({"epoch": epoch}).encode())

        return make_durable

    def last_barrier(self) -> int:
        data = _read_json(self.dir / "BARRIER", f"task {self.task}")
        if data is None:
            return NO_EPOCH
        try:
            return int(data["epoch"])
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"task {self.task}: {self.dir / 'BARRIER'} holds {data!r}; it is corrupt"
            raise StateCorruptError(msg) from exc

    def entries(self, after: int) -> Iterator[LogRecord]:
        for epoch, _seq, path in self._segments():
            if epoch > after:
                yield from self._read(path)

    def retag(self, after: int, epoch: int) -> None:
        if self.last_barrier() > after:  # a rollback to ``after``: barriers past it never happened
            _write_atomic(self.dir / "BARRIER", json.dumps({"epoch": after}).encode())
        for old_epoch, seq, path in self._segments():
            if old_epoch > after and old_epoch != epoch:
                path.rename(
                    self.dir / _SEGMENT.sub(lambda m: f"e{epoch:012d}-s{m.group(2)}-{m.group(3)}.log", path.name)
                )
                if self._open == (old_epoch, seq):
                    self._open = (epoch, seq)
        for key, old_epoch in list(self._keys.items()):
            if old_epoch > after:
                self._keys[key] = epoch
        _fsync_dir(self.dir)

    def truncate(self, epoch: int) -> None:
        if self._open is not None and self._open[0] <= epoch:
            self._close_fd()
        self._keep([k for k, e in self._keys.items() if e <= epoch])
        for seg_epoch, _seq, path in self._segments():
            if seg_epoch <= epoch:
                path.unlink(missing_ok=True)
        self._keys = {k: e for k, e in self._keys.items() if e > epoch}

    def _store_kept(self, keys: list[GroupKey]) -> None:
        _write_atomic(self.dir / "KEPT", json.dumps([list(k) for k in keys]).encode())

    def keys(self) -> set[GroupKey]:
        return set(self._keys)

    def has(self, key: GroupKey) -> bool:
        return key in self._keys or key in self._kept

    def committed_batches(self) -> dict[str, int]:
        data = _read_json(self.dir / "BATCHES", f"task {self.task}")
        if data is None:
            return {}
        if not isinstance(data, dict):
            msg = f"task {self.task}: {self.dir / 'BATCHES'} holds {data!r}; it is corrupt"
            raise StateCorruptError(msg)
        return {str(k): int(v) for k, v in data.items()}

    def set_committed_batches(self, batches: Mapping[str, int]) -> None:
        merged = self.committed_batches()
        for query, batch in batches.items():
            merged[query] = max(batch, merged.get(query, batch))
        if len(merged) > 256:  # bounded: the oldest queries first (ids only grow within a query)
            merged = dict(list(merged.items())[-256:])
        _write_atomic(self.dir / "BATCHES", json.dumps(merged).encode())
        self._prune_kept()

    def origin(self) -> str | None:
        return _read_origin(self.dir / "ORIGIN", f"task {self.task}'s input log")

    def set_origin(self, origin: str) -> None:
        _write_atomic(self.dir / "ORIGIN", json.dumps({"origin": origin}).encode())

    def _clear(self) -> None:
        self._close_fd()
        for _epoch, _seq, path in self._segments():
            path.unlink(missing_ok=True)
        for name in ("BARRIER", "BATCHES", "KEPT", "ORIGIN"):
            (self.dir / name).unlink(missing_ok=True)
        _fsync_dir(self.dir)
        self._keys = {}
        self._kept = {}
        self._unsynced = []

    def shutdown(self) -> None:
        """Close the open segment (durably)."""
        self._close_fd()


class EmbeddedBackend(StateBackend):
    """Files under ``dir/<topology>``: see the module doc."""

    name = "embedded"
    durable = True

    def __init__(self, topology: str, directory: str | Path | None = None, fsync_each: bool = False) -> None:
        root = Path(directory) if directory else default_state_dir()
        self.root = root / re.sub(r"[^A-Za-z0-9_.-]", "_", topology)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            msg = f"state dir {self.root}: cannot create it ({exc}); set topology.state.provider.config.dir"
            raise StateError(msg) from exc
        self._fsync_each = fsync_each
        self._logs: list[FileInputLog] = []

    def describe(self) -> str:
        return f"embedded state in {self.root}"

    def task_store(self, task: int) -> FileTaskStore:
        return FileTaskStore(task, self.root / f"task-{task}")

    def input_log(self, task: int, writer: str) -> FileInputLog:
        log = FileInputLog(task, self.root / f"task-{task}" / "log", writer, self._fsync_each)
        self._logs.append(log)
        return log

    def close(self) -> None:
        for log in self._logs:
            log.shutdown()
