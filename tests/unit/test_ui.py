"""The UI's pieces without a cluster: REST views from worker readings, the heartbeat source, /metrics text."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark_storm.errors import ActionNotSupportedError, UnknownTopologyError
from spark_storm.reports import HeartbeatFileWriter, WorkerHeartbeat, WorkerMetrics
from spark_storm.ui import views
from spark_storm.ui.local import LocalClusterSource
from spark_storm.ui.sampler import ExecutorCounts, Sample, Snapshot, TopologyReading, WorkerReading, executor_counts
from spark_storm.ui.source import ClusterView, TopologyRef, WorkerRef
from spark_storm.worker.http import prometheus_text
from tests.support import wait_until


def _task(executed: int, latency_ms: float = 0.5, **extra: Any) -> dict[str, Any]:
    return {
        "executed": executed,
        "emitted": executed,
        "acked": executed,
        "failed": 0,
        "errors": 0,
        "latency_ms": latency_ms,
        **extra,
    }


def _health(active: bool = True, executed: int = 100, **extra: Any) -> dict[str, Any]:
    return {
        "worker": "127.0.0.1:6700",
        "topology": "t",
        "active": active,
        "counters": {"received": executed},
        "backpressure_tasks": [],
        "held": 0,
        "acker": {"pending": 0, "completed": 0, "failed": 0},
        "server": {"received": executed, "pending": 0},
        "connections": {},
        "transfer_queue": {"capacity": 64, "population": 0, "overflow": 0, "arrival_rate": 0.0, "backpressure": False},
        "executors": {
            "split[1-2]": {
                "component": "split",
                "queue": {"capacity": 64, "population": 7, "overflow": 0, "arrival_rate": 3.0, "backpressure": True},
                "tasks": {"1": _task(executed), "2": _task(executed)},
            }
        },
        **extra,
    }


def _metrics(health: dict[str, Any]) -> WorkerMetrics:
    """The /health of a worker that leaves keys out (another version): the views read them with .get."""
    return cast(WorkerMetrics, health)


def _reading(*healths: dict[str, Any] | None, status: str | None = None) -> TopologyReading:
    workers = tuple(
        WorkerReading(
            WorkerRef(
                "t", "127.0.0.1", 6700 + i, "running", "local", time.time(), 12.0, 100 + i, "127.0.0.1", 9000 + i
            ),
            None if h is None else _metrics(h),
            None if h is not None else "GET failed",
        )
        for i, h in enumerate(healths)
    )
    return TopologyReading(TopologyRef("t", "t", tuple(w.ref for w in workers), status), workers)


def _snap(reading: TopologyReading) -> Snapshot:
    state = ClusterView("local-cluster", "test", (reading.ref,))
    return Snapshot(time.time(), state, {"t": reading})


def _sample(t: float, executed: int, busy_ms: float) -> Sample:
    return (t, {("127.0.0.1:6700", "split[1-2]"): ExecutorCounts("split", executed, executed, executed, 0, busy_ms)})


def test_pretty_seconds_like_storm() -> None:
    assert [views.pretty_seconds(s) for s in (None, 5, 233, 7205, 86400)] == [
        None,
        "5s",
        "3m 53s",
        "2h 0m 5s",
        "1d 0h 0m 0s",
    ]


def test_rate_and_capacity_are_measured_from_two_readings_over_the_window() -> None:
    reading = _reading(_health(executed=100))
    # 400 executed in 5 s, busy 2000 ms of those 5 s: 80/s, capacity 0.4 (Storm's definition)
    hist = [_sample(0.0, 0, 0.0), _sample(1.0, 50, 100.0), _sample(5.0, 400, 2000.0)]
    detail = views.topology_detail(_snap(reading), reading, hist, window_s=10)
    (comp,) = detail["bolts"]
    assert comp["rate"] == 80.0
    assert comp["capacity"] == "0.400"
    # a shorter window uses the newest pair only: 350 in 4 s
    (comp,) = views.topology_detail(_snap(reading), reading, hist, window_s=3)["bolts"]
    assert comp["rate"] == 87.5
    # a worker restart (counter went down) counts from zero, never negative
    hist = [_sample(0.0, 900, 0.0), _sample(2.0, 40, 20.0)]
    (comp,) = views.topology_detail(_snap(reading), reading, hist, window_s=10)["bolts"]
    assert comp["rate"] == 20.0


def test_what_the_workers_do_not_report_is_null_not_zero() -> None:
    reading = _reading(_health())
    detail = views.topology_detail(_snap(reading), reading, [], window_s=5)
    (comp,) = detail["bolts"]
    assert comp["rate"] is None  # one reading: no rate yet
    assert comp["capacity"] is None
    assert comp["latencyP50Ms"] is None
    assert comp["latencyP99Ms"] is None
    assert comp["lastError"] is None
    assert comp["type"] is None
    assert detail["errors"] is None
    assert detail["writers"] is None
    assert (comp["executed"], comp["tasks"], comp["executors"]) == (200, 2, 1)
    assert comp["executeLatency"] == "0.500"
    assert (comp["queuePopulation"], comp["queueCapacity"], comp["backpressureExecutors"]) == (7, 64, 1)


def test_keys_the_workers_report_are_used_as_they_are() -> None:
    health = _health(
        rss_bytes=123_000_000,
        uptime_s=99.5,
        errors=[{"time": time.time() - 3, "component": "split", "task": 2, "error": "ValueError: bad"}],
        writers=[
            {
                "query_id": "q1",
                "last_batch_id": 7,
                "rows": 1000,
                "groups": 4,
                "replays": 1,
                "failed": 0,
                "ack_latency_p50_ms": 2.5,
                "ack_latency_p99_ms": 9.0,
            }
        ],
        components={"split": {"source": False}},
    )
    ex = health["executors"]["split[1-2]"]
    ex["capacity"] = 0.75
    ex["tasks"]["1"].update(latency_p50_ms=0.2, latency_p99_ms=3.0, rate=40.0, latency_buckets=[[2e-4, 60], [3e-3, 1]])
    ex["tasks"]["2"].update(latency_p50_ms=0.4, latency_p99_ms=1.0, rate=10.0, latency_buckets=[[4e-4, 39], [1e-3, 1]])
    reading = _reading(health)
    detail = views.topology_detail(_snap(reading), reading, [], window_s=5)
    (comp,) = detail["bolts"]
    assert comp["type"] == "bolt"
    assert (comp["rate"], comp["capacity"]) == (50.0, "0.750")
    # from the tasks' buckets added together: 60 + 39 + 1 + 1 tuples, the 50th at 0.2 ms, the 100th at 1 ms
    assert (comp["latencyP50Ms"], comp["latencyP99Ms"]) == (0.2, 1.0)
    assert comp["lastError"] == "ValueError: bad"
    assert comp["errorPort"] == 6700
    (worker,) = detail["workers"]
    assert (worker["rssBytes"], worker["uptimeSeconds"]) == (123_000_000, 99)
    assert detail["errors"][0]["errorLapsedSecs"] in (2, 3, 4)
    assert detail["writers"] == [
        {
            "worker": "127.0.0.1:6700",
            "queryId": "q1",
            "lastBatchId": 7,
            "rows": 1000,
            "groups": 4,
            "replays": 1,
            "failed": 0,
            "ackLatencyP50Ms": 2.5,
            "ackLatencyP99Ms": 9.0,
        }
    ]
    # the workers measure rate and capacity every second: their figures win over the UI's own
    # measurement, which stands in only for a worker that does not report them
    hist = [_sample(0.0, 0, 0.0), _sample(2.0, 300, 500.0)]
    (comp,) = views.topology_detail(_snap(reading), reading, hist, window_s=5)["bolts"]
    assert (comp["rate"], comp["capacity"]) == (50.0, "0.750")
    comp_detail = views.component_detail(_snap(reading), reading, [], 5, "split")
    assert comp_detail is not None
    assert [t["rate"] for t in comp_detail["taskStats"]] == [40.0, 10.0]
    assert views.component_detail(_snap(reading), reading, [], 5, "nope") is None
    del ex["capacity"]
    del ex["tasks"]["2"]["rate"]
    (comp,) = views.topology_detail(_snap(reading), reading, hist, window_s=5)["bolts"]
    assert (comp["rate"], comp["capacity"]) == (150.0, "0.250")  # 300 in 2 s, busy 500 ms of 2 s


def _state(epoch: int, keys: int, rollbacks: int, restores: int, buckets: list[list[float]] | None) -> dict[str, Any]:
    st: dict[str, Any] = {
        "stateful": True,
        "keys": keys,
        "last_checkpoint_bytes": 10 * keys,
        "checkpoint_p50_ms": 1.0,
        "checkpoint_p99_ms": 99.0,
        "checkpoints": int(sum(c for _, c in buckets or [])),
        "restores": restores,
        "rollbacks": rollbacks,
        "epoch": epoch,
    }
    if buckets is not None:
        st["checkpoint_buckets"] = buckets
    return st


def _stateful(port: int, committed: int, state: dict[str, Any]) -> dict[str, Any]:
    health = _health(worker=f"127.0.0.1:{port}")
    health["executors"]["split[1-2]"]["state"] = state
    health["checkpoint"] = {
        "worker": f"127.0.0.1:{port}",
        "stateful": True,
        "epoch": committed + 1,
        "committed": committed,
        "generation": 2,
        "dirty": True,
        "reasons": ["task 1 restored epoch 4 at start"],
        "replaying": False,
        "last_group_age_s": 0.54,
        "rollbacks": 1,
        "replayed_records": 12,
        "committed_epochs": 3,
        "logged_groups": 9,
        "provider": "memory",
        "last_commit_at": None,
    }
    return health


def test_a_stateful_components_figures_are_merged_over_its_executors() -> None:
    # executor A: 99 checkpoints of 1 ms; B: one of 1 s. Merged, the p99 is 1 ms: the slowest
    # executor's own p99 (1 s) is not the component's.
    a = _stateful(6700, 5, _state(6, 30, rollbacks=2, restores=0, buckets=[[1e-3, 99]]))
    b = _stateful(6701, 4, _state(5, 12, rollbacks=1, restores=2, buckets=[[1.0, 1]]))
    reading = _reading(a, b)
    detail = views.topology_detail(_snap(reading), reading, [], 5)
    (comp,) = detail["bolts"]
    assert comp["state"] == {
        "executors": 2,
        "committedEpoch": 4,  # the lowest of its workers: every task is committed through it
        "checkpointEpoch": 5,
        "keys": 42,
        "lastCheckpointBytes": 420,
        "checkpointP50Ms": 1.0,
        "checkpointP99Ms": 1.0,
        "checkpoints": 100,
        "restores": 2,  # tasks that came back from a checkpoint: summed
        "rollbacks": 2,  # one rollback rolls every executor back: the most any went through, not a sum
    }
    assert detail["committedEpoch"] == 4
    assert [r["worker"] for r in detail["checkpoints"]] == ["127.0.0.1:6700", "127.0.0.1:6701"]
    row = detail["checkpoints"][0]
    assert (row["dirty"], row["reasons"], row["generation"], row["replayedRecords"]) == (
        True,
        ["task 1 restored epoch 4 at start"],
        2,
        12,
    )
    assert (row["lastGroupAgeSecs"], row["lastCommitTime"], row["lastCommitLapsedSecs"]) == (0.5, None, None)
    # workers without histograms (another version): one executor's own percentiles are exact, two cannot be merged
    for h in (a, b):
        del h["executors"]["split[1-2]"]["state"]["checkpoint_buckets"]
    (comp,) = views.topology_detail(_snap(_reading(a)), _reading(a), [], 5)["bolts"]
    assert (comp["state"]["checkpointP50Ms"], comp["state"]["checkpointP99Ms"]) == (1.0, 99.0)
    (comp,) = views.topology_detail(_snap(reading), reading, [], 5)["bolts"]
    assert (comp["state"]["checkpointP50Ms"], comp["state"]["checkpointP99Ms"]) == (None, None)
    # a worker without a checkpoint view leaves the committed epoch unknown
    del b["checkpoint"]
    detail = views.topology_detail(_snap(reading), reading, [], 5)
    assert detail["bolts"][0]["state"]["committedEpoch"] is None
    assert len(detail["checkpoints"]) == 1


def test_a_stateless_topology_has_no_state_and_an_empty_checkpoint_list() -> None:
    reading = _reading(_health(checkpoint=None))
    detail = views.topology_detail(_snap(reading), reading, [], 5)
    assert (detail["bolts"][0]["state"], detail["checkpoints"], detail["committedEpoch"]) == (None, [], None)
    assert detail["executorStats"][0]["state"] is None
    reading = _reading(_health())  # a worker that does not report the key at all
    detail = views.topology_detail(_snap(reading), reading, [], 5)
    assert (detail["checkpoints"], detail["committedEpoch"]) == (None, None)


@pytest.mark.parametrize(
    ("flags", "recorded", "want"),
    [
        ((True, True), None, "ACTIVE"),
        ((False, False), None, "INACTIVE"),
        ((True, False), None, "PARTIALLY ACTIVE"),
        ((True, True), "KILLED", "KILLED"),
    ],
)
def test_status_comes_from_the_cluster_or_the_workers(flags: tuple[bool, ...], recorded: str | None, want: str) -> None:
    reading = _reading(*(_health(active=f) for f in flags), status=recorded)
    assert views.topology_summary(_snap(reading))["topologies"][0]["status"] == want


def test_an_unreachable_worker_keeps_its_executors_in_the_totals() -> None:
    first = _reading(_health()).workers[0]
    ref = WorkerRef(
        "t", "127.0.0.1", 6701, "running", "local", time.time(), 3.0, 7, metrics_port=1, executors=("count[3-5]",)
    )
    unreachable = WorkerReading(ref, None, "GET failed")
    reading = TopologyReading(TopologyRef("t", "t", (first.ref, ref)), (first, unreachable))
    (row,) = views.topology_summary(_snap(reading))["topologies"]
    assert (row["executorsTotal"], row["tasksTotal"], row["workersTotal"]) == (2, 5, 2)
    detail = views.topology_detail(_snap(reading), reading, [], 5)
    assert [w["status"] for w in detail["workers"]] == ["active", "unreachable"]
    assert detail["workers"][1]["error"] == "GET failed"


def test_chart_history_is_executed_per_second_per_component() -> None:
    hist = [_sample(10.0, 0, 0), _sample(12.0, 100, 0), _sample(13.0, 400, 0)]
    out = views.chart_history(hist)
    assert out["times"] == [12.0, 13.0]
    assert out["executedPerSecond"] == {"split": [50.0, 300.0]}
    assert executor_counts(_metrics(_health(executed=5)))["split[1-2]"] == ExecutorCounts("split", 10, 10, 10, 0, 5.0)
    with_busy = _health(executed=5)
    for t in with_busy["executors"]["split[1-2]"]["tasks"].values():
        t["busy_s"] = 0.25  # the worker's own clock of time in execute wins over executed x mean
    assert executor_counts(_metrics(with_busy))["split[1-2]"].busy_ms == 500.0


# ---------------------------------------------------------------------- the heartbeat source
def _beat(directory: Path, port: int, pid: int, *, status: str = "running", age: float = 0.0) -> None:
    record: WorkerHeartbeat = {
        "topology": "wc",
        "worker": f"127.0.0.1:{port}",
        "pid": pid,
        "status": status,
        "time": time.time() - age,
        "uptime_s": 5.0,
        "executors": ["split[1-2]"],
        "received": 0,
        "metrics_port": 1,
        "metrics_host": "127.0.0.1",
    }
    HeartbeatFileWriter(directory, "wc", port).write(record)


def test_heartbeats_make_workers_alive_dead_or_stopped(tmp_path: Path) -> None:
    # A real process that looks like `spark-storm worker --port 7001` in /proc/<pid>/cmdline.
    code = "import time; time.sleep(60)"
    worker = subprocess.Popen([sys.executable, "-c", code, "spark_storm.cli", "worker", "--port", "7001"])
    statm = Path(f"/proc/{worker.pid}/statm")
    wait_until(  # the interpreter has loaded (right after fork the process is a few pages)
        lambda: int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") > 2_000_000, what="python to start"
    )
    try:
        _beat(tmp_path, 7001, worker.pid)
        _beat(tmp_path, 7002, worker.pid, age=60)  # stale
        _beat(tmp_path, 7003, os.getpid())  # pid is not a worker for port 7003 (pid reused)
        _beat(tmp_path, 7004, worker.pid, status="stopped")
        (tmp_path / "notes-1.json").write_text("[1, 2]")  # named like one, but not a heartbeat: ignored
        source = LocalClusterSource(tmp_path, worker_timeout_s=10)
        (topo,) = source.state().topologies
        assert {w.port: w.status for w in topo.workers} == {
            7001: "running",
            7002: "dead",
            7003: "dead",
            7004: "stopped",
        }
        assert (topo.workers[0].rss_bytes or 0) > 1_000_000
        assert topo.status is None  # no nimbus: the UI asks the workers
        (sup,) = source.state().supervisors
        assert (sup.slots_total, sup.slots_used) == (1, 1)
        with pytest.raises(ActionNotSupportedError, match="needs cluster mode"):
            source.rebalance("wc", 0, {})
        with pytest.raises(UnknownTopologyError, match="'nope'"):
            source.kill("nope", 0)
        source.kill("wc", 0)  # SIGTERM to the live worker only
        assert worker.wait(10) == -15
        _beat(tmp_path, 7001, worker.pid)  # even with a fresh heartbeat: its process is gone
        assert source.state().topologies == ()
        source.close()
    finally:
        worker.kill()
        worker.wait()


def test_kill_waits_before_stopping_and_close_cancels_it(tmp_path: Path) -> None:
    code = "import time; time.sleep(60)"
    worker = subprocess.Popen([sys.executable, "-c", code, "spark_storm.cli", "worker", "--port", "7001"])
    statm = Path(f"/proc/{worker.pid}/statm")
    wait_until(  # the interpreter has loaded (right after fork the process is a few pages)
        lambda: int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") > 2_000_000, what="python to start"
    )
    try:
        _beat(tmp_path, 7001, worker.pid)
        source = LocalClusterSource(tmp_path)
        source.kill("wc", 30)
        assert source.state().topologies[0].status == "KILLED"
        source.close()  # the UI stopped before the wait ended: nothing is killed
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait()


# ---------------------------------------------------------------------- /metrics
def test_metrics_text_is_prometheus_clients_own_one_family_each() -> None:
    health = _health(rss_bytes=5_000_000, uptime_s=12.5, topology='we"ird\ntopo')
    health["executors"]["split[1-2]"]["capacity"] = 0.25
    health["executors"]["split[1-2]"]["tasks"]["1"].update(
        latency_p99_ms=4.5, rate=None, latency_total_buckets=[[2e-06, 99], [0.004096, 1]], latency_total_sum_s=0.0042
    )
    health["connections"] = {"127.0.0.1:6701": {"sent": 5, "pending": 1, "status": "ready"}}
    text = prometheus_text(health)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert len(families) == len(list(text_string_to_metric_families(text)))
    executed = families["spark_storm_bolt_executed"]
    assert executed.type == "counter"
    assert sorted((s.labels["task"], s.value) for s in executed.samples) == [("1", 100.0), ("2", 100.0)]
    assert executed.samples[0].labels["topology"] == 'we"ird\ntopo'
    assert families["spark_storm_executor_capacity"].samples[0].value == 0.25
    assert "spark_storm_bolt_latency_p99_ms" not in families  # a histogram, not percentile gauges
    latency = families["spark_storm_bolt_execute_latency_seconds"]
    assert latency.type == "histogram"
    by_le = {s.labels["le"]: s.value for s in latency.samples if s.name.endswith("_bucket")}
    assert (by_le["1e-06"], by_le["2e-06"], by_le["0.002048"], by_le["0.004096"], by_le["+Inf"]) == (
        0,
        99,
        99,
        100,
        100,
    )
    assert {s.name: s.value for s in latency.samples if not s.name.endswith("_bucket")} == {
        "spark_storm_bolt_execute_latency_seconds_count": 100,
        "spark_storm_bolt_execute_latency_seconds_sum": 0.0042,
    }
    assert "spark_storm_bolt_rate" not in families  # a null is not a sample
    assert families["spark_storm_worker_rss_bytes"].samples[0].value == 5_000_000
    assert families["spark_storm_queue_backpressure"].type == "gauge"
    assert families["spark_storm_connection_ready"].samples[0].labels["dest"] == "127.0.0.1:6701"
