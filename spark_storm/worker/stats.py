"""Per-task counters and execute-latency percentiles, cheap enough for the hot path.

Counters are plain attributes bumped by the one executor thread that owns the task.
Latency is *sampled*, as Storm samples (``topology.stats.sample.rate``): the executor
times the first tuple of every batch it hands a task, and the time of the whole batch
(its busy time, for Storm's *capacity*).  Samples land in a log-scale histogram; two
histograms rotate every ``window`` seconds so percentiles describe the last one to two
windows, not the whole run.
"""

from __future__ import annotations

import math
import time
from typing import Final

from spark_storm.reports import TaskMetrics

__all__ = ["LatencyHistogram", "TaskStats"]

_BUCKETS: Final = 96
_BASE_S: Final = 1e-6  # bucket 0: <= 1 us
_STEP: Final = 2**0.25  # four buckets per doubling: ~19 % resolution
_LOG_STEP: Final = math.log(_STEP)


class LatencyHistogram:
    """Counts of latency samples in log-scale buckets (1 µs .. ~16 min)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.total = 0

    def record(self, seconds: float) -> None:
        index = 0 if seconds <= _BASE_S else min(_BUCKETS - 1, int(math.log(seconds / _BASE_S) / _LOG_STEP) + 1)
        self.counts[index] += 1
        self.total += 1

    def merged(self, other: LatencyHistogram) -> LatencyHistogram:
        out = LatencyHistogram()
        out.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        out.total = self.total + other.total
        return out

    def percentile(self, p: float) -> float | None:
        """Upper bound of the bucket holding the ``p``-th percentile, in seconds (None: no samples)."""
        if not self.total:
            return None
        rank = p / 100 * self.total
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank and count:
                return float(_BASE_S * _STEP**index)
        return float(_BASE_S * _STEP ** (_BUCKETS - 1))


class TaskStats:
    """Counters of one task, its sampled execute latency and its busy time."""

    __slots__ = (
        "_current",
        "_previous",
        "_rate_mark",
        "_rotated",
        "_window",
        "acked",
        "batches",
        "busy_s",
        "capacity",
        "emitted",
        "errors",
        "executed",
        "failed",
        "latency_sum_s",
        "rate",
        "ticks",
    )

    def __init__(self, window_s: float = 30.0) -> None:
        self.executed = 0
        self.batches = 0
        self.emitted = 0
        self.acked = 0
        self.failed = 0
        self.errors = 0
        self.ticks = 0
        self.busy_s = 0.0
        self.latency_sum_s = 0.0
        self._window = window_s
        self._current = LatencyHistogram()
        self._previous = LatencyHistogram()
        self._rotated = time.monotonic()
        now = time.monotonic()
        self._rate_mark = (now, 0, 0.0)
        self.rate = 0.0
        self.capacity = 0.0

    def sample(self, seconds: float) -> None:
        """Record one timed execute."""
        self._current.record(seconds)
        self.latency_sum_s += seconds
        if time.monotonic() - self._rotated >= self._window:
            self._previous, self._current = self._current, LatencyHistogram()
            self._rotated = time.monotonic()

    def update_rates(self) -> None:
        """Measure rate and capacity since the last call (the worker's timer calls it every second).

        So every reader — /health, /metrics, the UI — sees the same figures, whoever read last.
        """
        now = time.monotonic()
        then, executed_then, busy_then = self._rate_mark
        if now > then:
            self.rate = (self.executed - executed_then) / (now - then)
            self.capacity = min(1.0, (self.busy_s - busy_then) / (now - then))
            self._rate_mark = (now, self.executed, self.busy_s)

    def snapshot(self) -> TaskMetrics:
        """Counters, rate and capacity (over the last timer second), latency mean, p50 and p99."""
        hist = self._current.merged(self._previous)
        p50, p99 = hist.percentile(50), hist.percentile(99)
        samples = hist.total
        return {
            "executed": self.executed,
            "batches": self.batches,
            "emitted": self.emitted,
            "acked": self.acked,
            "failed": self.failed,
            "errors": self.errors,
            "ticks": self.ticks,
            "rate": round(self.rate, 1),
            "latency_ms": round(self.busy_s / self.executed * 1000, 4) if self.executed else 0.0,
            "latency_p50_ms": None if p50 is None else round(p50 * 1000, 4),
            "latency_p99_ms": None if p99 is None else round(p99 * 1000, 4),
            "latency_samples": samples,
            "busy_s": round(self.busy_s, 6),
            "capacity": round(self.capacity, 4),
        }
