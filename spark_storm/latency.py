"""Latency histograms: one log-scale bucket layout for the worker, its ``/metrics`` and the UI.

Bucket ``i`` counts the samples up to :data:`UPPER_BOUNDS_S` ``[i]``: bucket 0 holds everything
up to 1 µs, then four buckets per doubling (bounds about 19 % apart) up to about 14 s; the
last bucket also holds whatever is slower.  A sample carries a weight (one timed tuple can
stand for the batch it was timed in), so counts are tuples, not timings.

Percentiles cannot be merged: the p99 of two tasks is not the larger of their p99s.  Bucket
counts can: a reader adds the counts of several tasks (:func:`merge_buckets`) and reads the
percentile of the merge (:func:`percentile_of`).  Reports carry the non-empty buckets as
``[upper bound in seconds, count]`` pairs, so a reader needs no copy of the layout.

This module imports nothing from the package: the worker, the UI and the Prometheus
exporter all stand on it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Final

__all__ = [
    "PROMETHEUS_BOUNDS_S",
    "UPPER_BOUNDS_S",
    "Buckets",
    "LatencyHistogram",
    "bucket_index",
    "cumulative_counts",
    "merge_buckets",
    "percentile_of",
]

_BUCKETS: Final = 96
_BASE_S: Final = 1e-6  # bucket 0: <= 1 us
_STEP: Final = 2**0.25  # four buckets per doubling: ~19 % resolution
_LOG_STEP: Final = math.log(_STEP)

#: Upper bound of each bucket in seconds, rounded to 4 significant digits, so every process
#: (on any platform's libm) writes the same bounds and readers can add counts by bound.
UPPER_BOUNDS_S: Final[tuple[float, ...]] = tuple(float(f"{_BASE_S * _STEP**i:.4g}") for i in range(_BUCKETS))

#: The ``le`` bounds ``/metrics`` exports: one per doubling, 1 µs .. ~8.4 s (plus ``+Inf``).
#: Cumulative counts at a subset of the bounds are exact, only coarser: 25 series per task
#: instead of 97.
PROMETHEUS_BOUNDS_S: Final[tuple[float, ...]] = UPPER_BOUNDS_S[0 : _BUCKETS - 1 : 4]

#: Sparse buckets as reported: ``[[upper_bound_s, count], ...]``, ascending, counts > 0.
Buckets = list[list[float]]


def bucket_index(seconds: float) -> int:
    """Return the index of the bucket that counts a sample of ``seconds``."""
    if seconds <= _BASE_S:
        return 0
    # ceil: a sample on a bound belongs to that bound's bucket (less a hair of rounding error)
    return min(_BUCKETS - 1, math.ceil(math.log(seconds / _BASE_S) / _LOG_STEP - 1e-9))


class LatencyHistogram:
    """Weighted counts of latency samples in log-scale buckets, and their weighted sum."""

    __slots__ = ("counts", "sum_s", "total")

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.total = 0
        self.sum_s = 0.0

    def record(self, seconds: float, weight: int = 1) -> None:
        """Count ``weight`` samples of ``seconds`` each."""
        self.counts[bucket_index(seconds)] += weight
        self.total += weight
        self.sum_s += seconds * weight

    def merged(self, other: LatencyHistogram) -> LatencyHistogram:
        """Return a new histogram holding both histograms' samples."""
        out = LatencyHistogram()
        out.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        out.total = self.total + other.total
        out.sum_s = self.sum_s + other.sum_s
        return out

    def buckets(self) -> Buckets:
        """Return the non-empty buckets as ``[upper_bound_s, count]`` pairs, ascending."""
        return [[UPPER_BOUNDS_S[i], c] for i, c in enumerate(self.counts) if c]

    def percentile(self, p: float) -> float | None:
        """Upper bound of the bucket holding the ``p``-th percentile, in seconds (None: no samples)."""
        return percentile_of(self.buckets(), p)


def cumulative_counts(buckets: Iterable[Sequence[float]], bounds: Iterable[float]) -> list[tuple[float, float]]:
    """Return ``(bound, count of samples <= bound)`` for each of the ascending ``bounds``."""
    pairs = sorted((float(b), float(c)) for b, c in buckets)
    out = []
    seen = 0.0
    i = 0
    for bound in bounds:
        while i < len(pairs) and pairs[i][0] <= bound:
            seen += pairs[i][1]
            i += 1
        out.append((bound, seen))
    return out


def merge_buckets(reports: Iterable[Iterable[Sequence[float]]]) -> Buckets:
    """Add the counts of several reports' buckets, bound by bound; ascending by bound."""
    merged: dict[float, float] = {}
    for report in reports:
        for bound, count in report:
            merged[bound] = merged.get(bound, 0) + count
    return [[bound, merged[bound]] for bound in sorted(merged) if merged[bound] > 0]


def percentile_of(buckets: Iterable[Sequence[float]], p: float) -> float | None:
    """Upper bound (seconds) of the bucket holding the ``p``-th percentile of ``[bound, count]`` pairs.

    Parameters
    ----------
    buckets : iterable of (bound, count)
        Ascending by bound, as :meth:`LatencyHistogram.buckets` and :func:`merge_buckets` return them.
    p : float
        The percentile, 0 to 100.

    Returns
    -------
    float or None
        None when there are no samples.
    """
    pairs = [(float(b), float(c)) for b, c in buckets if c > 0]
    total = sum(c for _, c in pairs)
    if not total:
        return None
    rank = p / 100 * total
    seen = 0.0
    for bound, count in pairs:
        seen += count
        if seen >= rank:
            return bound
    return pairs[-1][0]
