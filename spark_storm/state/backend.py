"""What a state backend stores: each stateful task's changelog, each source task's input log.

A backend (``topology.state.provider``) hands out, per task:

* a :class:`TaskStore` — the task's state as a changelog of epochs: ``write(E, changes)``
  at barrier ``E`` (durable when it returns), ``commit(E)`` once every task wrote ``E``,
  ``restore(C)`` to rebuild the state at any epoch since the last snapshot, and
  ``discard_after(C)`` on a rollback;
* an :class:`InputLog` — what a worker accepted for a source task, in segments closed by
  barriers: ``append`` before the worker acks, ``close(E)`` at barrier ``E`` (durable),
  ``entries(after=C)`` for a replay, ``truncate(E)`` once ``E`` is committed, and the
  group keys it holds, so a group that comes again is known as a replay.

Entries are encoded here, once for every backend, with the codec's msgpack (never pickle)
behind a CRC-32, so a corrupt or truncated entry is an error naming the task and where,
never silently empty state.
"""

from __future__ import annotations

import abc
import logging
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from spark_storm.codec.serializer import pack_value, unpack_value
from spark_storm.errors import StateCorruptError, WireFormatError
from spark_storm.state.kv import DELETED, freeze, thaw

__all__ = [
    "ENTRY_MAGIC",
    "NO_EPOCH",
    "Entry",
    "GroupKey",
    "InputLog",
    "LogRecord",
    "StateBackend",
    "TaskStore",
    "decode_entry",
    "decode_record",
    "encode_entry",
    "encode_entry_parts",
    "encode_record",
    "encode_record_parts",
]

logger = logging.getLogger(__name__)

#: The epoch before the first one: nothing committed yet.
NO_EPOCH: Final = 0
ENTRY_MAGIC: Final = b"SST1"
_CRC_BYTES: Final = 4

#: A bytes value at least this long is not copied into an entry's or a record's msgpack body:
#: the body is written as parts (the msgpack headers, and the bytes themselves).
_BIG_BYTES: Final = 4096

#: (query id, batch id, partition, sequence) of a delivery group.
GroupKey = tuple[str, int, int, int]


@dataclass(frozen=True)
class Entry:
    """One epoch of a task's changelog: the changed keys (``full``: the whole state)."""

    epoch: int
    full: bool
    puts: dict[Any, Any]
    deletes: list[Any]

    @property
    def size(self) -> int:
        """Number of keys it holds (puts and deletes)."""
        return len(self.puts) + len(self.deletes)


def _array_header(n: int) -> bytes:
    """Return the msgpack header of an array of ``n`` items (the shortest form, as ``packb`` writes it)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _bin_header(n: int) -> bytes:
    """Return the msgpack header of ``n`` bytes (bin 8/16/32, as ``packb`` writes bytes with ``use_bin_type``)."""
    if n < 1 << 8:
        return b"\xc4" + bytes((n,))
    if n < 1 << 16:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def _is_blobs(value: Any) -> bool:
    """Whether ``value`` is a non-empty list of bytes, the first one big (a window pane's Arrow streams, say)."""
    return (
        type(value) is list
        and bool(value)
        and type(value[0]) is bytes
        and len(value[0]) >= _BIG_BYTES
        and all(type(v) is bytes for v in value)
    )


def _pack_items(values: list[Any], parts: list[bytes]) -> None:
    """Append the msgpack of each value to ``parts`` (no array header): lists of big bytes by reference."""
    run: list[Any] = []
    for value in values:
        if not _is_blobs(value):
            run.append(value)
            continue
        if run:
            parts.append(pack_value(run)[len(_array_header(len(run))) :])
            run = []
        parts.append(_array_header(len(value)))
        for blob in value:
            parts.append(_bin_header(len(blob)))
            parts.append(blob)
    if run:
        parts.append(pack_value(run)[len(_array_header(len(run))) :])


def encode_entry_parts(epoch: int, full: bool, changes: Mapping[Any, Any]) -> list[bytes]:
    """Encode one changelog entry as parts to write in order (see :func:`encode_entry`).

    The bytes are :func:`encode_entry`'s, but a value that is a list of big bytes (a pane's
    Arrow streams) is not copied into the body: its bytes are parts of their own, and the
    CRC-32 runs over the parts.
    """
    keys, values, deletes = [], [], []
    big = False
    for key, value in changes.items():
        if value is DELETED:
            deletes.append(thaw(key))
        else:
            keys.append(thaw(key))
            values.append(value)
            if not big and type(value) is list and value and type(value[0]) is bytes:
                big = len(value[0]) >= _BIG_BYTES
    if big:
        body = [b"\x95" + pack_value(epoch) + pack_value(full) + pack_value(keys) + _array_header(len(values))]
        _pack_items(values, body)
        body.append(pack_value(deletes))
    else:  # small values (a keyed count's): one packb
        body = [pack_value([epoch, full, keys, values, deletes])]
    crc = 0
    for part in body:
        crc = zlib.crc32(part, crc)
    return [ENTRY_MAGIC + crc.to_bytes(_CRC_BYTES, "big"), *body]


def encode_entry(epoch: int, full: bool, changes: Mapping[Any, Any]) -> bytes:
    """Encode one changelog entry: magic, CRC-32 of the body, body (msgpack)."""
    return b"".join(encode_entry_parts(epoch, full, changes))


def decode_entry(data: bytes, where: str) -> Entry:
    """Decode what :func:`encode_entry` made; StateCorruptError naming ``where`` otherwise."""
    head = len(ENTRY_MAGIC) + _CRC_BYTES
    if len(data) < head or data[: len(ENTRY_MAGIC)] != ENTRY_MAGIC:
        msg = f"{where}: not a state entry ({len(data)} bytes, bad magic); it is corrupt or truncated"
        raise StateCorruptError(msg)
    body = data[head:]
    if zlib.crc32(body) != int.from_bytes(data[len(ENTRY_MAGIC) : head], "big"):
        msg = f"{where}: checksum mismatch over {len(body)} bytes; the entry is corrupt or truncated"
        raise StateCorruptError(msg)
    try:
        epoch, full, keys, values, deletes = unpack_value(body)
        puts = dict(zip((freeze(k) for k in keys), values, strict=True))
        return Entry(int(epoch), bool(full), puts, [freeze(k) for k in deletes])
    except (WireFormatError, ValueError, TypeError) as exc:
        msg = f"{where}: unreadable state entry: {exc}"
        raise StateCorruptError(msg) from exc


@dataclass(frozen=True)
class LogRecord:
    """What a worker accepted for a source task: a delivery group (its key) or plain messages."""

    key: GroupKey | None
    payloads: list[bytes] = field(default_factory=list)


def encode_record_parts(record: LogRecord) -> list[bytes]:
    """Encode one input-log record as parts to write in order (see :func:`encode_record`).

    The bytes are :func:`encode_record`'s; big payloads are parts of their own, not copied.
    """
    payloads = record.payloads
    if not _is_blobs(payloads):
        body = pack_value([list(record.key) if record.key is not None else None, payloads])
        return [len(body).to_bytes(4, "big") + zlib.crc32(body).to_bytes(4, "big"), body]
    parts = [b"\x92" + pack_value(list(record.key) if record.key is not None else None)]
    _pack_items([payloads], parts)
    crc = length = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
        length += len(part)
    return [length.to_bytes(4, "big") + crc.to_bytes(4, "big"), *parts]


def encode_record(record: LogRecord) -> bytes:
    """Encode one input-log record: u32 length, u32 CRC-32, body (msgpack)."""
    return b"".join(encode_record_parts(record))


def decode_record(data: bytes, pos: int, where: str) -> tuple[LogRecord | None, int]:
    """Decode the record at ``pos``; (None, pos) at a truncated tail; StateCorruptError on a bad record."""
    if pos + 8 > len(data):
        return None, pos
    length = int.from_bytes(data[pos : pos + 4], "big")
    if pos + 8 + length > len(data):
        return None, pos
    body = data[pos + 8 : pos + 8 + length]
    if zlib.crc32(body) != int.from_bytes(data[pos + 4 : pos + 8], "big"):
        msg = f"{where}: input-log record at byte {pos} fails its checksum; the log is corrupt"
        raise StateCorruptError(msg)
    try:
        key, payloads = unpack_value(body)
        group = (str(key[0]), int(key[1]), int(key[2]), int(key[3])) if key is not None else None
        return LogRecord(group, [bytes(p) for p in payloads]), pos + 8 + length
    except (WireFormatError, ValueError, TypeError, IndexError) as exc:
        msg = f"{where}: unreadable input-log record at byte {pos}: {exc}"
        raise StateCorruptError(msg) from exc


class TaskStore(abc.ABC):
    """One stateful task's changelog (written by one executor thread at a time)."""

    def __init__(self, task: int) -> None:
        self.task = task

    @abc.abstractmethod
    def committed(self) -> int:
        """Return the last epoch marked committed for this task (:data:`NO_EPOCH` when none)."""

    @abc.abstractmethod
    def epochs(self) -> list[int]:
        """Epochs with an entry, ascending (committed or only written)."""

    @abc.abstractmethod
    def fulls(self) -> list[int]:
        """Epochs whose entry is a full snapshot, ascending."""

    def encode(self, epoch: int, full: bool, changes: Mapping[Any, Any]) -> list[bytes]:
        """Encode epoch ``epoch``'s entry as parts for :meth:`write_encoded` (the executor does it at the barrier).

        The parts hold no reference to a mutable value: a put after the barrier cannot change them.
        """
        return encode_entry_parts(epoch, full, changes)

    @abc.abstractmethod
    def write_encoded(self, epoch: int, full: bool, parts: Sequence[bytes]) -> int:
        """Store an entry :meth:`encode` made durably; return its size in bytes (any thread, one at a time)."""

    def write(self, epoch: int, full: bool, changes: Mapping[Any, Any]) -> int:
        """Encode and store epoch ``epoch``'s entry durably; return its size in bytes."""
        return self.write_encoded(epoch, full, self.encode(epoch, full, changes))

    @abc.abstractmethod
    def read(self, epoch: int) -> Entry:
        """Read one entry (StateCorruptError naming the task and where, if it is bad)."""

    @abc.abstractmethod
    def mark_committed(self, epoch: int) -> None:
        """Durably record ``epoch`` as committed."""

    @abc.abstractmethod
    def delete(self, epochs: list[int]) -> None:
        """Remove these entries."""

    # --- shared logic ------------------------------------------------------------------------
    def restore(self, target: int | None = None) -> tuple[int, dict[Any, Any]]:
        """Return (epoch, state) at ``target`` (default: the committed epoch), from the last snapshot on.

        Every barrier writes an entry for every stateful task, so the entries from the last
        full snapshot (or epoch 1) up to ``target`` must all be there.

        Raises
        ------
        StateCorruptError
            An entry is unreadable, or entries the target needs are missing.
        """
        if target is None:
            target = self.committed()
        epochs = [e for e in self.epochs() if e <= target]
        entries: list[Entry] = []
        for epoch in reversed(epochs):  # newest first, back to the last full snapshot
            entry = self.read(epoch)
            entries.append(entry)
            if entry.full:
                break
        entries.reverse()
        first = entries[0].epoch if entries and entries[0].full else 1
        missing = sorted(set(range(first, target + 1)) - {e.epoch for e in entries})
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
            msg = (
                f"task {self.task}: cannot restore epoch {target}: the entries of epoch(s) {shown} are missing "
                f"({self.describe()}); the state was moved, deleted or lives elsewhere (a task that moves between "
                "hosts needs topology.state.provider: redis)"
            )
            raise StateCorruptError(msg)
        data: dict[Any, Any] = {}
        for entry in entries:
            if entry.full:
                data = dict(entry.puts)
                continue
            data.update(entry.puts)
            for key in entry.deletes:
                data.pop(key, None)
        return target, data

    def discard_after(self, epoch: int) -> None:
        """Drop entries after ``epoch`` (a rollback to it)."""
        self.delete([e for e in self.epochs() if e > epoch])

    def commit(self, epoch: int) -> None:
        """Mark ``epoch`` committed and drop what the last snapshot at or before it covers."""
        self.mark_committed(epoch)
        fulls = [e for e in self.fulls() if e <= epoch]
        if fulls:
            self.delete([e for e in self.epochs() if e < fulls[-1]])

    def describe(self) -> str:
        """Where this task's entries live, for messages."""
        return f"task {self.task}"


#: Keys of truncated groups kept at most (the oldest go first, with a warning).
MAX_KEPT_KEYS: Final = 200_000


def _done() -> None:
    """Nothing left to do."""


class InputLog(abc.ABC):
    """One source task's input log: records in segments, each segment tagged with its epoch.

    The open segment belongs to the epoch after the last barrier.  Written by the
    receive path (one writer at a time per task), closed by the checkpoint thread.

    A committed epoch truncates the segments it covers, but the keys of their delivery
    groups are *kept* until the group's own query commits its batch: an interval
    checkpoint may land in the middle of a Spark batch, and a task retry of that batch
    must still be recognised as a replay.
    """

    def __init__(self, task: int) -> None:
        self.task = task
        self._kept: dict[GroupKey, None] = {}

    def _keep(self, keys: list[GroupKey]) -> None:
        """Remember truncated groups whose batch their query has not committed yet."""
        committed = self.committed_batches()
        added = [k for k in keys if committed.get(k[0], -1) < k[1] and k not in self._kept]
        if not added:
            return
        for key in added:
            self._kept[key] = None
        if len(self._kept) > MAX_KEPT_KEYS:
            drop = len(self._kept) - MAX_KEPT_KEYS
            for key in list(self._kept)[:drop]:
                del self._kept[key]
            logger.warning("task %d: forgot the %d oldest kept group keys (at most %d)", self.task, drop, MAX_KEPT_KEYS)
        self._store_kept(list(self._kept))

    def _prune_kept(self) -> None:
        committed = self.committed_batches()
        before = len(self._kept)
        self._kept = {k: None for k in self._kept if committed.get(k[0], -1) < k[1]}
        if len(self._kept) != before:
            self._store_kept(list(self._kept))

    @abc.abstractmethod
    def _store_kept(self, keys: list[GroupKey]) -> None:
        """Durably store the kept keys."""

    @abc.abstractmethod
    def append(self, record: LogRecord, epoch: int) -> None:
        """Append a record to the open segment of ``epoch`` (written before the worker acks)."""

    @abc.abstractmethod
    def close(self, epoch: int) -> None:
        """Barrier ``epoch``: make its segments durable; later appends go to ``epoch + 1``."""

    def seal(self, epoch: int) -> Callable[[], None]:
        """Barrier ``epoch`` in two steps: end its segment now, and return the call that makes it durable.

        The worker seals under its receive gate and makes durable after releasing it, so
        appends (to the next segment) do not wait for an fsync.  This default does it all now.
        """
        self.close(epoch)
        return _done

    @abc.abstractmethod
    def entries(self, after: int) -> Iterator[LogRecord]:
        """Yield the records of epochs after ``after``, in the order they were appended."""

    def replayable(self, after: int) -> Iterator[LogRecord]:
        """Yield what a replay after ``after`` publishes: :meth:`entries`, each delivery group once.

        A task that moved between workers has had two writers: the old one may log a group
        after the new one opened the log (so the new one's :meth:`has` does not know it), and a
        sender's retry then logs it again.  Its first record counts; plain messages (no key)
        all do.
        """
        seen: set[GroupKey] = set()
        for record in self.entries(after):
            if record.key is not None:
                if record.key in seen:
                    continue
                seen.add(record.key)
            yield record

    @abc.abstractmethod
    def retag(self, after: int, epoch: int) -> None:
        """Move every segment of an epoch after ``after`` to ``epoch`` (a rollback folds them into one)."""

    @abc.abstractmethod
    def truncate(self, epoch: int) -> None:
        """Drop the segments of epochs up to ``epoch`` (committed)."""

    @abc.abstractmethod
    def keys(self) -> set[GroupKey]:
        """Group keys of every record still in the log."""

    @abc.abstractmethod
    def has(self, key: GroupKey) -> bool:
        """Whether a group of that key is in the log (or was, and its batch is not committed yet)."""

    @abc.abstractmethod
    def last_barrier(self) -> int:
        """Return the last epoch whose barrier closed a segment here (durable; NO_EPOCH: none)."""

    @abc.abstractmethod
    def committed_batches(self) -> dict[str, int]:
        """Per query id, the last batch id whose rows are in committed state."""

    @abc.abstractmethod
    def set_committed_batches(self, batches: Mapping[str, int]) -> None:
        """Durably record the committed batch of each query (merged: ids only grow)."""


class StateBackend(abc.ABC):
    """A provider of task stores and input logs for one topology in one worker process."""

    #: ``topology.state.provider`` alias.
    name: str = ""
    #: Whether a task's state survives its process (and can be read by another process).
    durable: bool = True

    @abc.abstractmethod
    def task_store(self, task: int) -> TaskStore:
        """Return the changelog of stateful task ``task`` (made on first use)."""

    @abc.abstractmethod
    def input_log(self, task: int, writer: str) -> InputLog:
        """Return the input log of source task ``task``, appended to by ``writer`` (this worker)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files or connections."""

    def describe(self) -> str:
        """Where the state lives, for messages."""
        return self.name
