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
  through the bolts);
* a client asking after a reconnect what became of a group (:meth:`DeliveryLedger.query`:
  the ack it awaited was lost with the old connection) -> ack now, or when it finishes;
  FAILED if the ledger does not know the group, so the sender retries it.

``forget(query, batch)`` (the driver's commit) drops the entries of that batch and older
ones of the query; bounds on entries and on bytes (estimated per entry as the query id's
length plus :data:`ENTRY_OVERHEAD_BYTES`) evict the oldest entries beyond them, with a warning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from spark_storm.messaging.wire import ACCEPTED, FAILED, PROCESSED, BatchAck, BatchHeader, BatchQuery

__all__ = ["ENTRY_OVERHEAD_BYTES", "DeliveryLedger", "Reply"]

logger = logging.getLogger(__name__)

Reply = Callable[[BatchAck], None]
_IN_PROGRESS = 0
#: Estimated memory of one entry besides its query id (entry, header, key tuple, dict slot).
ENTRY_OVERHEAD_BYTES = 512
_MAX_WAITERS = 64
_UNKNOWN_LOG_S = 10.0


def _cost(header: BatchHeader) -> int:
    return len(header.query_id) + ENTRY_OVERHEAD_BYTES


@dataclass
class _Entry:
    header: BatchHeader
    status: int = _IN_PROGRESS
    waiters: list[Reply] = field(default_factory=list)
    since: float = field(default_factory=time.monotonic)


class DeliveryLedger:
    """Thread-safe record of delivered groups, bounded by ``max_entries`` and ``max_bytes``."""

    def __init__(self, max_entries: int, redeliver_after_s: float = 30.0, max_bytes: int | None = None) -> None:
        self._max = max_entries
        self._max_bytes = max_bytes
        self._redeliver_after = redeliver_after_s
        self._entries: OrderedDict[tuple[str, int, int, int], _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.replayed_groups = 0
        self.replayed_messages = 0
        self.evicted = 0
        self.unknown_queries = 0
        self._unknown_logged = -_UNKNOWN_LOG_S

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        """Estimated bytes held by the entries."""
        return self._bytes

    def begin(self, header: BatchHeader, reply: Reply) -> bool:
        """Register a group's arrival; True means deliver it, False means it was a replay."""
        ack_now: int | None = None
        with self._lock:
            entry = self._entries.get(header.key)
            if entry is None:
                self._entries[header.key] = _Entry(header, _IN_PROGRESS, [reply])
                self._bytes += _cost(header)
                self._bound()
                return True
            stale = time.monotonic() - entry.since > self._redeliver_after
            redeliver = entry.status == FAILED or (entry.status == ACCEPTED and header.required == PROCESSED and stale)
            if redeliver:
                self._bytes += _cost(header) - _cost(entry.header)
                self._entries[header.key] = _Entry(header, _IN_PROGRESS, [reply])
                self._bound()
                return True
            self.replayed_groups += 1
            self.replayed_messages += header.count
            if entry.status == _IN_PROGRESS or (entry.status == ACCEPTED and header.required == PROCESSED):
                if len(entry.waiters) >= _MAX_WAITERS:  # a peer replaying in a loop: keep the newest
                    del entry.waiters[0]
                entry.waiters.append(reply)
            else:
                ack_now = entry.status
        if ack_now is not None:
            reply(_ack(header, ack_now))
        return False

    def query(self, query: BatchQuery, reply: Reply) -> None:
        """Answer a client asking, after a reconnect, for the ack of a group it sent before.

        The ack goes to ``reply`` now if the group reached ``query.required`` (or failed),
        else when it does.  A group the ledger does not know (committed, evicted, or this
        worker restarted since) is answered FAILED: the sender retries it.
        """
        log = False
        with self._lock:
            entry = self._entries.get(query.key)
            status: int | None = FAILED if entry is None else entry.status
            if entry is None:
                self.unknown_queries += 1
                now = time.monotonic()
                log = now - self._unknown_logged >= _UNKNOWN_LOG_S  # a restarted worker hears of every group
                if log:
                    self._unknown_logged = now
            elif entry.status == _IN_PROGRESS or (entry.status == ACCEPTED and query.required == PROCESSED):
                if len(entry.waiters) >= _MAX_WAITERS:
                    del entry.waiters[0]
                entry.waiters.append(reply)
                status = None
        if log:
            logger.warning(
                "group %s asked for after a reconnect is not in the delivery ledger (committed, evicted, "
                "or this worker restarted since): answering FAILED so the sender resends it (%d such so far)",
                query.key,
                self.unknown_queries,
            )
        if status is not None:
            reply(BatchAck(*query.key, status))

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
                self._bytes -= _cost(self._entries.pop(k).header)
            return len(doomed)

    def _bound(self) -> None:
        # Caller holds the lock.  One warning per call, however many entries go.
        gone = 0
        first: tuple[str, int, int, int] | None = None
        while len(self._entries) > self._max or (self._max_bytes is not None and self._bytes > self._max_bytes):
            key, entry = self._entries.popitem(last=False)
            self._bytes -= _cost(entry.header)
            first = first or key
            gone += 1
        if gone:
            self.evicted += gone
            logger.warning(
                "delivery ledger over %d entries or %s bytes: forgot %d entries (first %s) before their commit; "
                "a replay of them would be delivered again (raise storm.messaging.server.ledger.max.size / .max.bytes)",
                self._max,
                self._max_bytes,
                gone,
                first,
            )


def _ack(header: BatchHeader, status: int) -> BatchAck:
    return BatchAck(header.query_id, header.batch_id, header.partition, header.sequence, status)
