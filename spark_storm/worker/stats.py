"""Per-task counters and execute-latency histograms, cheap enough for the hot path.

Counters are plain attributes bumped by the one executor thread that owns the task.
Latency is *sampled*, as Storm samples (``topology.stats.sample.rate``): the executor
times the first tuple of every batch it hands a task (a batch bolt: its whole
``execute_batch``), and the time of the whole batch (its busy time, for Storm's
*capacity*).  A sample stands for every tuple executed since the previous one, so the
histograms count tuples: their count is ``executed``, and a task that runs big batches
weighs as much as the tuples it ran when a reader merges tasks.

Samples land in log-scale histograms (:mod:`spark_storm.latency`): one since the start
(exported by ``/metrics`` as a Prometheus histogram), and two that rotate every
``window`` seconds, so the p50/p99 in ``/health`` describe the last one to two windows.
"""

from __future__ import annotations

import time

from spark_storm.latency import LatencyHistogram, bucket_index
from spark_storm.reports import TaskMetrics

__all__ = ["LatencyHistogram", "TaskStats"]


class TaskStats:
    """Counters of one task, its sampled execute latency and its busy time."""

    __slots__ = (
        "_current",
        "_previous",
        "_rate_mark",
        "_rotated",
        "_sampled_executed",
        "_total",
        "_window",
        "acked",
        "batches",
        "busy_s",
        "capacity",
        "emitted",
        "errors",
        "executed",
        "failed",
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
        self._window = window_s
        self._current = LatencyHistogram()
        self._previous = LatencyHistogram()
        self._total = LatencyHistogram()
        self._sampled_executed = 0
        self._rotated = time.monotonic()
        now = time.monotonic()
        self._rate_mark = (now, 0, 0.0)
        self.rate = 0.0
        self.capacity = 0.0

    def sample(self, seconds: float) -> None:
        """Record one timed execute, standing for every tuple executed since the previous sample."""
        executed = self.executed
        weight = executed - self._sampled_executed
        if weight < 1:
            weight = 1
        self._sampled_executed = executed
        index = bucket_index(seconds)  # once for both histograms: this runs once per batch
        current, total = self._current, self._total
        current.counts[index] += weight
        current.total += weight
        total.counts[index] += weight
        total.total += weight
        total.sum_s += seconds * weight
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
        """Counters, rate and capacity (over the last timer second), latency mean, p50 and p99, histograms.

        ``latency_buckets``: the last one to two windows (what p50 and p99 describe;
        ``latency_samples`` counts the tuples their samples stand for).
        ``latency_total_buckets``: everything since the start (what ``/metrics`` exports),
        with ``latency_total_sum_s``, the weighted sum.  Buckets are ``[upper bound in
        seconds, tuples]`` pairs of the non-empty buckets.
        """
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
            "latency_buckets": hist.buckets(),
            "latency_total_buckets": self._total.buckets(),
            "latency_total_sum_s": round(self._total.sum_s, 6),
            "busy_s": round(self.busy_s, 6),
            "capacity": round(self.capacity, 4),
        }
