"""The delivery ledger: which (query, batch, partition, sequence) groups a server accepted.

A retried Spark task, or a batch replayed after a query restart from its checkpoint,
sends the same groups again.  The ledger lets the server drop those replays (and still
answer them), so no row reaches an executor queue twice:

* unknown group -> deliver it; remember it as in progress;
* replay of a group accepted (sender wants ACCEPTED) or processed -> drop, ack again;
* replay of a group in progress, or ACCEPTED and still being processed -> drop, ack when
  it finishes (exactly once into the executor queues);
* replay of a FAILED group, or of one ACCEPTED longer than ``redeliver_after_s`` ago
  without being PROCESSED (Storm's message timeout) -> deliver again (at-least-once
  through the bolts).

``forget(query, batch)`` (the driver's commit) drops the entries of that batch and older
ones of the query; a size bound evicts the oldest entries beyond it, with a warning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from spark_storm.messaging.wire import ACCEPTED, FAILED, PROCESSED, BatchAck, BatchHeader

__all__ = ["DeliveryLedger", "Reply"]

logger = logging.getLogger(__name__)

Reply = Callable[[BatchAck], None]
_IN_PROGRESS = 0


@dataclass
class _Entry:
    header: BatchHeader
    status: int = _IN_PROGRESS
    waiters: list[Reply] = field(default_factory=list)
    since: float = field(default_factory=time.monotonic)


class DeliveryLedger:
    """Thread-safe record of delivered groups, bounded by ``max_entries``."""

    def __init__(self, max_entries: int, redeliver_after_s: float = 30.0) -> None:
        self._max = max_entries
        self._redeliver_after = redeliver_after_s
        self._entries: OrderedDict[tuple[str, int, int, int], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.replayed_groups = 0
        self.replayed_messages = 0

    def __len__(self) -> int:
        return len(self._entries)

    def begin(self, header: BatchHeader, reply: Reply) -> bool:
        """Register a group's arrival; True means deliver it, False means it was a replay."""
        ack_now: int | None = None
        with self._lock:
            entry = self._entries.get(header.key)
            if entry is None:
                self._entries[header.key] = _Entry(header, _IN_PROGRESS, [reply])
                self._bound()
                return True
            stale = time.monotonic() - entry.since > self._redeliver_after
            redeliver = entry.status == FAILED or (entry.status == ACCEPTED and header.required == PROCESSED and stale)
            if redeliver:
                self._entries[header.key] = _Entry(header, _IN_PROGRESS, [reply])
                return True
            self.replayed_groups += 1
            self.replayed_messages += header.count
            if entry.status == _IN_PROGRESS or (entry.status == ACCEPTED and header.required == PROCESSED):
                entry.waiters.append(reply)
            else:
                ack_now = entry.status
        if ack_now is not None:
            reply(_ack(header, ack_now))
        return False

    def finish(self, header: BatchHeader, status: int) -> None:
        """Record progress of a delivered group and tell everyone waiting for it."""
        with self._lock:
            entry = self._entries.get(header.key)
            if entry is None or entry.header is not header:
                return  # forgotten (committed) or superseded by a redelivery
            if status == ACCEPTED and entry.status == _IN_PROGRESS:
                entry.since = time.monotonic()
            entry.status = max(entry.status, status) if status != FAILED else FAILED
            waiters = list(entry.waiters)
            final = status == FAILED or status >= entry.header.required
            if final:
                entry.waiters.clear()
        ack = _ack(header, status)
        for reply in waiters:
            try:
                reply(ack)
            except Exception:  # a closed connection must not stop the others hearing
                logger.debug("ack for %s to a closed peer dropped", header.key, exc_info=True)

    def forget(self, query_id: str, batch_id: int) -> int:
        """Drop entries of ``query_id`` with batch id <= ``batch_id``; return how many."""
        with self._lock:
            doomed = [k for k in self._entries if k[0] == query_id and k[1] <= batch_id]
            for k in doomed:
                del self._entries[k]
            return len(doomed)

    def _bound(self) -> None:
        # Caller holds the lock.
        while len(self._entries) > self._max:
            key, _ = self._entries.popitem(last=False)
            logger.warning(
                "delivery ledger over %d entries: forgetting %s before its commit; a replay of it "
                "would be delivered again (raise storm.messaging.server.ledger.max.size)",
                self._max,
                key,
            )


def _ack(header: BatchHeader, status: int) -> BatchAck:
    return BatchAck(header.query_id, header.batch_id, header.partition, header.sequence, status)
