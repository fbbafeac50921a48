"""State TTL at restore: a task's state with every key's write time and per-key TTL (docs/design/state.md).

:meth:`~spark_storm.state.backend.TaskStore.restore` rebuilds the values (expired keys are
among an entry's deletes, so it drops them); :func:`restore_with_ttl` reads the same
entries, from the last full snapshot to the target, once, and also merges what they carry
for TTL, so that a restore, and a rollback, put back the exact bookkeeping the barriers
wrote.  Entries without TTL (written before TTL was on, or before it existed) give their
keys no write time: the next barrier's clock becomes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from spark_storm.state.backend import TaskStore

__all__ = ["TtlRestore", "restore_with_ttl"]


class TtlRestore(NamedTuple):
    """What the entries of a restored epoch say for TTL (all empty for state written without it)."""

    written: dict[Any, int]
    ttls: dict[Any, int]
    clock: int | None

    @property
    def any(self) -> bool:
        """Whether any entry carried TTL bookkeeping."""
        return bool(self.written or self.ttls) or self.clock is not None


def restore_with_ttl(store: TaskStore, target: int | None = None) -> tuple[int, dict[Any, Any], TtlRestore]:
    """Return (epoch, state, TTL bookkeeping) at ``target`` (default: the committed epoch).

    The values are what ``store.restore(target)`` returns, from the same entries
    (``store.chain``); missing or unreadable ones fail as it fails.
    """
    if target is None:
        target = store.committed()
    entries = store.chain(target)  # StateCorruptError naming what is missing, as restore() says it
    data: dict[Any, Any] = {}
    written: dict[Any, int] = {}
    ttls: dict[Any, int] = {}
    clock: int | None = None
    for entry in entries:
        if entry.full:
            data = dict(entry.puts)
            written = dict(entry.written)
            ttls = dict(entry.ttls)
        else:
            data.update(entry.puts)
            if entry.ttl:
                written.update(entry.written)
                if len(entry.written) < len(entry.puts):  # keys put while there was no clock
                    for key in entry.puts:
                        if key not in entry.written:
                            written.pop(key, None)
            elif written:
                for key in entry.puts:
                    written.pop(key, None)
            if ttls:
                for key in entry.puts:
                    ttls.pop(key, None)
            ttls.update(entry.ttls)
        for key in entry.deletes:  # the expired ones too
            data.pop(key, None)
            written.pop(key, None)
            ttls.pop(key, None)
        if entry.clock is not None:
            clock = entry.clock
    return target, data, TtlRestore(written, ttls, clock)
