"""Latency histograms: buckets that count tuples, add up across tasks, and give a component's percentiles."""

from __future__ import annotations

import time
from typing import Any

import pytest

from spark_storm.http_policy import cross_origin_refusal
from spark_storm.latency import (
    PROMETHEUS_BOUNDS_S,
    UPPER_BOUNDS_S,
    LatencyHistogram,
    cumulative_counts,
    merge_buckets,
    percentile_of,
)
from spark_storm.ui import views
from spark_storm.ui.sampler import Snapshot, TopologyReading, WorkerReading
from spark_storm.ui.source import ClusterView, TopologyRef, WorkerRef
from spark_storm.worker.stats import TaskStats


def test_bounds_are_distinct_ascending_and_the_exported_ones_double() -> None:
    assert list(UPPER_BOUNDS_S) == sorted(set(UPPER_BOUNDS_S))
    assert UPPER_BOUNDS_S[0] == 1e-6
    assert PROMETHEUS_BOUNDS_S[:4] == (1e-6, 2e-6, 4e-6, 8e-6)
    assert len(PROMETHEUS_BOUNDS_S) == 24
    h = LatencyHistogram()
    for seconds in (0.0, 1e-6, 2e-6, 2.1e-6, 1e-3, 3600.0):
        h.record(seconds)
    # a sample on a bound is in that bound's bucket; an hour is in the last bucket
    assert [b for b, _ in h.buckets()] == [1e-6, 2e-6, 2.378e-6, 0.001024, UPPER_BOUNDS_S[-1]]
    assert [c for _, c in h.buckets()] == [2, 1, 1, 1, 1]


def test_a_sample_counts_the_tuples_it_stands_for() -> None:
    stats = TaskStats(window_s=3600)
    for n, seconds in ((100, 1e-4), (1, 0.05), (400, 2e-4)):
        stats.executed += n
        stats.batches += 1
        stats.sample(seconds)
    snap = stats.snapshot()
    assert sum(c for _, c in snap["latency_total_buckets"]) == snap["executed"] == 501
    assert sum(c for _, c in snap["latency_buckets"]) == snap["latency_samples"] == 501
    assert snap["latency_total_sum_s"] == pytest.approx(100 * 1e-4 + 0.05 + 400 * 2e-4)
    # weighted: the one slow batch of one tuple is not the median, nor the p99
    assert snap["latency_p50_ms"] == snap["latency_p99_ms"] == 0.2153
    cumulative = dict(cumulative_counts(snap["latency_total_buckets"], PROMETHEUS_BOUNDS_S))
    assert (cumulative[0.000128], cumulative[0.000256], cumulative[0.03277], cumulative[0.06554]) == (
        100,
        500,
        500,
        501,
    )


def test_merging_adds_counts_bound_by_bound() -> None:
    a, b = LatencyHistogram(), LatencyHistogram()
    a.record(1e-4, 3)
    b.record(1e-4, 2)
    b.record(1.0)
    assert merge_buckets([a.buckets(), b.buckets()]) == a.merged(b).buckets() == [[0.0001076, 5], [1.049, 1]]
    assert percentile_of([], 99) is None
    assert percentile_of(a.merged(b).buckets(), 0) == 0.0001076


def _reading(tasks: Any) -> tuple[Snapshot, TopologyReading]:
    health: Any = {
        "worker": "127.0.0.1:6700",
        "topology": "t",
        "active": True,
        "executors": {
            "count[1-2]": {
                "component": "count",
                "queue": {"capacity": 64, "population": 0},
                "tasks": tasks,
            }
        },
    }
    ref = WorkerRef("t", "127.0.0.1", 6700, "running", "local", time.time(), 1.0, 1, "127.0.0.1", 9000)
    reading = TopologyReading(TopologyRef("t", "t", (ref,), None), (WorkerReading(ref, health),))
    return Snapshot(time.time(), ClusterView("local-cluster", "test", (reading.ref,)), {"t": reading}), reading


def test_a_components_p99_comes_from_its_tasks_buckets_not_the_slowest_tasks_p99() -> None:
    fast, slow = TaskStats(window_s=3600), TaskStats(window_s=3600)
    for _ in range(99):  # 9,900 tuples at ~1 ms
        fast.executed += 100
        fast.sample(1e-3)
    for _ in range(100):  # 100 tuples at ~1 s: 1 % of the component's tuples
        slow.executed += 1
        slow.sample(1.0)
    tasks = {"1": fast.snapshot(), "2": slow.snapshot()}
    assert (tasks["1"]["latency_p99_ms"], tasks["2"]["latency_p99_ms"]) == (1.024, 1049.0)
    snap, reading = _reading(tasks)
    (comp,) = views.topology_detail(snap, reading, [], window_s=5)["bolts"]
    # The slowest task's p99 is 1 s, but 99 % of the component's tuples took ~1 ms.
    assert comp["latencyP99Ms"] == 1.024
    assert comp["latencyP99Ms"] != max(t["latency_p99_ms"] or 0.0 for t in tasks.values())
    assert comp["latencyP50Ms"] == 1.024
    # The task rows keep each task's own figures.
    detail = views.component_detail(snap, reading, [], 5, "count")
    assert detail is not None
    assert [t["latencyP99Ms"] for t in detail["taskStats"]] == [1.024, 1049.0]
    # Once the slow task holds 2 % of the tuples, the component's p99 is slow as well.
    for _ in range(100):
        slow.executed += 1
        slow.sample(1.0)
    snap, reading = _reading({"1": fast.snapshot(), "2": slow.snapshot()})
    (comp,) = views.topology_detail(snap, reading, [], window_s=5)["bolts"]
    assert comp["latencyP99Ms"] == 1049.0


def test_malformed_buckets_from_a_worker_are_skipped_not_fatal() -> None:
    snap, reading = _reading(
        {"1": {"executed": 5, "latency_buckets": [[1e-3, 5], ["x", 1], [2e-3], None, [1.0, True]]}}
    )
    (comp,) = views.topology_detail(snap, reading, [], window_s=5)["bolts"]
    assert comp["latencyP99Ms"] == 1.0
    snap, reading = _reading({"1": {"executed": 5, "latency_buckets": "nope"}})
    (comp,) = views.topology_detail(snap, reading, [], window_s=5)["bolts"]
    assert comp["latencyP99Ms"] is None


@pytest.mark.parametrize(
    ("headers", "bound", "refused"),
    [
        ({"Host": "127.0.0.1:7000"}, "127.0.0.1", None),  # curl, urllib
        ({"Host": "localhost:7000", "Origin": "http://localhost:7000"}, "127.0.0.1", None),  # its own page
        ({"Host": "127.0.0.1:7000", "Origin": "http://evil.example"}, "127.0.0.1", "cross-origin"),
        ({"Host": "127.0.0.1:7000", "Origin": "null"}, "127.0.0.1", "cross-origin"),  # a sandboxed page
        ({"Host": "127.0.0.1:7000", "Origin": "http://127.0.0.1:8080"}, "127.0.0.1", "cross-origin"),  # another port
        ({"Host": "evil.example:7000", "Origin": "http://evil.example:7000"}, "127.0.0.1", "re-pointed DNS"),
        ({"Host": "[::1]:7000"}, "127.0.0.1", None),
        ({"Host": "worker-a.example:7000", "Origin": "http://worker-a.example:7000"}, "0.0.0.0", None),
        ({"Host": "worker-a.example:7000", "Origin": "http://evil.example"}, "0.0.0.0", "cross-origin"),
    ],
)
def test_the_origin_guard(headers: dict[str, str], bound: str, refused: str | None) -> None:
    why = cross_origin_refusal(headers, bound)
    assert (why is None) if refused is None else (why is not None and refused in why)
