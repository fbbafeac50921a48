"""A query listener counting what one streaming query sent (the demos' progress lines and checks)."""

from __future__ import annotations

import threading
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

__all__ = ["Sent"]


class Sent(StreamingQueryListener):
    """Counts the rows of every micro-batch of one query (``recentProgress`` keeps only 100).

    ``query_id`` names the query followed (set once it starts); a micro-batch longer than
    ``trigger_s`` counts as slow.  Spark calls it from its listener thread: the counters are
    read under ``_lock``'s writes.
    """

    def __init__(self, trigger_s: float) -> None:
        self.query_id: str | None = None
        self.trigger_s = trigger_s
        self.rows = 0
        self.batches = 0
        self.slow = 0  # micro-batches that took longer than the trigger interval
        self.last_ms = 0
        self.last_batch_id = -1  # the newest micro-batch reported, with rows or without
        self._lock = threading.Lock()

    def onQueryStarted(self, event: Any) -> None:
        return None

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if str(progress.id) != self.query_id:
            return
        with self._lock:
            self.last_batch_id = max(self.last_batch_id, int(progress.batchId))
        if not progress.numInputRows:
            return
        took = int(progress.durationMs.get("triggerExecution", 0))
        with self._lock:
            self.rows += int(progress.numInputRows)
            self.batches += 1
            self.last_ms = took
            self.slow += int(took > self.trigger_s * 1000)

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: Any) -> None:
        return None
