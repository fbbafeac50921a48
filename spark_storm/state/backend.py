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

Both can be *reset* to what a savepoint holds (:mod:`spark_storm.state.savepoint`): the
task's entries replaced, the log emptied with the savepoint's batches, and an *origin*
marker written last, which names the restore so that a worker restarted later does not
reset the task again.

Entries and records are encoded once for every backend (:mod:`spark_storm.state.format`).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from spark_storm.errors import SavepointError, StateCorruptError
from spark_storm.messaging.api import GroupKey
from spark_storm.state.format import Entry, LogRecord, encode_entry, encode_entry_parts
from spark_storm.state.kv import DELETED

__all__ = ["NO_EPOCH", "InputLog", "StateBackend", "TaskStore"]

logger = logging.getLogger(__name__)

#: The epoch before the first one: nothing committed yet.
NO_EPOCH: Final = 0


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

        Raises
        ------
        StateCorruptError
            An entry is unreadable, or entries the target needs are missing.
        """
        if target is None:
            target = self.committed()
        data: dict[Any, Any] = {}
        for entry in self.chain(target):
            if entry.full:
                data = dict(entry.puts)
                continue
            data.update(entry.puts)
            for key in entry.deletes:
                data.pop(key, None)
        return target, data

    def chain(self, target: int) -> list[Entry]:
        """Return the entries a restore of ``target`` reads, oldest first: its last full snapshot (or epoch 1) on.

        Every barrier writes an entry for every stateful task, so they must all be there.

        Raises
        ------
        StateCorruptError
            An entry is unreadable, or entries the target needs are missing.
        """
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
        return entries

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

    # --- savepoints ------------------------------------------------------------------------------
    def read_raw(self, epoch: int) -> bytes:
        """Return epoch ``epoch``'s entry as stored (what a savepoint copies); this default re-encodes it."""
        entry = self.read(epoch)
        return encode_entry(entry.epoch, entry.full, {**entry.puts, **dict.fromkeys(entry.deletes, DELETED)})

    def origin(self) -> str | None:
        """Return the restore this task's entries came from (None: none recorded)."""
        raise SavepointError(_no_origin(self))

    def set_origin(self, origin: str) -> None:
        """Durably record the restore this task's entries came from."""
        raise SavepointError(_no_origin(self))

    def reset(self, epoch: int, entries: Sequence[tuple[int, bool, bytes]], origin: str) -> None:
        """Replace every entry by ``entries`` ((epoch, full, raw bytes), oldest first), committed at ``epoch``.

        The origin is written last: a reset cut short by a crash is done again by the next start.
        """
        self.delete(self.epochs())
        for entry_epoch, full, data in entries:
            self.write_encoded(entry_epoch, full, [data])
        self.mark_committed(epoch)
        self.set_origin(origin)


def _no_origin(where: TaskStore | InputLog) -> str:
    return (
        f"{where.describe()}: the {type(where).__name__} keeps no origin marker, so a topology cannot start "
        "from a savepoint on this state provider; implement origin(), set_origin() and reset() (see "
        "spark_storm.state.backend) or use the embedded or redis provider"
    )


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

    def describe(self) -> str:
        """Where this log lives, for messages."""
        return f"task {self.task}'s input log"

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

    # --- savepoints ------------------------------------------------------------------------------
    def kept(self) -> list[GroupKey]:
        """Keys of truncated groups whose batch their query has not committed (a savepoint keeps them)."""
        return list(self._kept)

    def origin(self) -> str | None:
        """Return the restore this log was reset by (None: none recorded)."""
        raise SavepointError(_no_origin(self))

    def set_origin(self, origin: str) -> None:
        """Durably record the restore this log was reset by."""
        raise SavepointError(_no_origin(self))

    def _clear(self) -> None:
        """Drop every segment, barrier marker, group key, kept key and committed batch."""
        raise SavepointError(_no_origin(self))

    def reset(self, batches: Mapping[str, int], kept: Sequence[GroupKey], origin: str) -> None:
        """Empty the log, as a savepoint leaves it: its committed ``batches`` and the ``kept`` keys of open ones.

        The origin is written last: a reset cut short by a crash is done again by the next start.
        """
        self._clear()
        self.set_committed_batches(batches)
        self._kept = dict.fromkeys(kept)
        self._store_kept(list(self._kept))
        self.set_origin(origin)


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
