"""Checks every state backend must pass (the unit tier runs them on files and memory, the integration tier on Redis)."""

from __future__ import annotations

from typing import Any

from spark_storm.state import KeyValueState, LogRecord, StateBackend


def check_changelog(backend: StateBackend) -> None:
    """Entries per epoch, restore at any epoch since the last snapshot, commit compacts, rollback discards."""
    store = backend.task_store(4)
    state = KeyValueState()
    history: dict[int, dict[Any, Any]] = {}
    for epoch in range(1, 8):
        state.put(f"k{epoch}", epoch)
        state.put("n", epoch)
        if epoch == 3:
            state.delete("k1")
        if epoch == 5:
            store.write(epoch, True, state.snapshot())
        else:
            store.write(epoch, False, state.take_changes())
        history[epoch] = {k: v for k, v in state.items()}
    for epoch in range(1, 8):
        assert store.restore(epoch) == (epoch, history[epoch])
    assert store.restore()[1] == {}  # nothing committed yet
    store.commit(6)
    assert store.committed() == 6
    assert store.epochs() == [5, 6, 7]  # the snapshot at 5 covers 1..4
    assert store.restore() == (6, history[6])
    store.discard_after(6)
    assert store.epochs() == [5, 6]


def check_input_log(backend: StateBackend) -> None:
    """Segments by epoch, replay after an epoch, retag on rollback, truncate on commit, committed batches."""
    log = backend.input_log(3, "h:6700")
    rec = [LogRecord(("q", 0, p, 0), [b"a%d" % p]) for p in range(4)]
    log.append(rec[0], 1)
    log.append(rec[1], 1)
    log.close(1)
    log.append(rec[2], 2)
    log.close(2)
    log.append(rec[3], 3)
    assert list(log.entries(0)) == rec
    assert list(log.entries(1)) == rec[2:]
    assert log.has(("q", 0, 2, 0))
    log.retag(1, 2)  # a rollback to epoch 1: everything after it is epoch 2 again
    assert list(log.entries(1)) == rec[2:]
    log.truncate(2)
    assert list(log.entries(0)) == []
    assert log.keys() == set()
    log.set_committed_batches({"q": 4})
    log.set_committed_batches({"q": 3, "r": 1})
    assert log.committed_batches() == {"q": 4, "r": 1}
