"""The UI's REST API against a real local cluster, with a plain HTTP client."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_storm.latency import merge_buckets, percentile_of
from tests.integration.ui_support import LedgerUI, UICluster, pipeline
from tests.support import wait_until
from tests.support.ledger import expected, ledger_state

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ui_cluster(tmp: Path) -> Iterator[UICluster]:
    run = UICluster(tmp, pipeline(tmp / "records")).start()
    yield run
    if not run.stopped:
        run.stop()


def test_summaries_have_storms_shapes_and_the_clusters_numbers(ui_cluster: UICluster) -> None:
    summary = ui_cluster.get("cluster/summary")
    assert summary["clusterKind"] == "local-cluster"
    assert str(ui_cluster.cluster.heartbeat_dir) in summary["source"]
    # in: 2 tasks/2 executors, stage1: 4 tasks/2 executors, stage2: 2 tasks/2 executors
    assert (summary["slotsTotal"], summary["slotsUsed"], summary["slotsFree"]) == (2, 2, 0)
    assert (summary["executorsTotal"], summary["tasksTotal"], summary["topologies"]) == (6, 8, 1)
    assert summary["nimbusLeader"] is None
    assert ui_cluster.get("nimbus/summary") == {"nimbuses": []}

    (topo,) = ui_cluster.get("topology/summary")["topologies"]
    assert topo["id"] == topo["name"] == "pipeline"
    assert topo["status"] == "ACTIVE"
    assert (topo["workersTotal"], topo["executorsTotal"], topo["tasksTotal"]) == (2, 6, 8)
    assert isinstance(topo["uptimeSeconds"], int)

    sup = ui_cluster.get("supervisor/summary")
    assert [(s["slotsTotal"], s["slotsUsed"]) for s in sup["supervisors"]] == [(2, 2)]
    slots = sorted(w["port"] for w in sup["workers"])
    assert slots == sorted(s.port for s in ui_cluster.cluster.slots)
    assert all(w["rssBytes"] > 1_000_000 for w in sup["workers"])  # read from /proc: a Python process
    hosts = ui_cluster.get("topology-workers/pipeline")["hostPortList"]
    assert sorted(h["port"] for h in hosts) == slots


def test_counts_match_the_workers_and_rates_are_measured(ui_cluster: UICluster) -> None:
    for _ in range(4):  # spread over a few samples so the rate window sees traffic
        ui_cluster.send(150)
        ui_cluster.wait_new_samples(2)
    ui_cluster.wait_executed("stage2", 600)
    ui_cluster.wait_executed("stage1", 600)
    comps = ui_cluster.components()
    truth = ui_cluster.health_totals()
    for cid, want in truth.items():
        assert {k: comps[cid][k] for k in want} == want, cid
    assert comps["in"]["executed"] == comps["in"]["emitted"] == 600
    assert comps["stage1"]["acked"] == 600
    assert (comps["stage1"]["executors"], comps["stage1"]["tasks"]) == (2, 4)
    assert comps["stage1"]["queueCapacity"] == 2 * 16384
    assert comps["stage1"]["backpressureExecutors"] == 0
    assert float(comps["stage1"]["executeLatency"]) > 0
    # A component's percentiles are those of its tasks' histograms added up (read here from the workers).
    ui_cluster.wait_new_samples(1)
    comps = ui_cluster.components()
    reports = []
    for slot in ui_cluster.cluster.slots:
        executors = ui_cluster.cluster.health(slot)["executors"].values()
        reports += [t["latency_buckets"] for e in executors if e["component"] == "stage1" for t in e["tasks"].values()]
    assert sum(c for report in reports for _, c in report) == 600
    for p in (50, 99):
        merged = percentile_of(merge_buckets(reports), p)
        assert merged is not None
        assert comps["stage1"][f"latencyP{p}Ms"] == round(merged * 1000, 4)
    detail = ui_cluster.get("topology/pipeline")
    assert detail["topologyStats"][0]["acked"] == sum(c["acked"] for c in comps.values())
    assert {w["port"] for w in detail["workers"]} == {s.port for s in ui_cluster.cluster.slots}
    assert all(w["status"] == "active" for w in detail["workers"])
    assert len(detail["executorStats"]) == 6

    history = ui_cluster.get("topology/pipeline/history")
    assert set(history["executedPerSecond"]) == {"in", "stage1", "stage2"}
    assert len(history["times"]) == len(history["executedPerSecond"]["stage1"]) >= 4
    # every executed tuple appears in the chart: the rates integrate back to the counts
    # (the first sample was taken before any tuple was sent)
    first_time, first_counts = ui_cluster.ui.sampler.history("pipeline")[0]
    assert sum(c.executed for c in first_counts.values() if c.component == "stage1") == 0
    edges = [first_time, *history["times"]]
    rates = history["executedPerSecond"]["stage1"]
    integrated = sum(r * (b - a) for r, a, b in zip(rates, edges, edges[1:], strict=False))
    assert integrated == pytest.approx(600, rel=0.02)

    comp = ui_cluster.get("topology/pipeline/component/stage1")
    assert comp["componentType"] in (None, "bolt", "source")
    assert sorted(t["task"] for t in comp["taskStats"]) == list(ui_cluster.cluster.plan.component_tasks["stage1"])
    assert sum(t["executed"] for t in comp["taskStats"]) == 600
    assert comp["boltStats"][0]["executed"] == 600


def test_deactivate_holds_tuples_and_activate_releases_them(ui_cluster: UICluster) -> None:
    ui_cluster.send(100)
    ui_cluster.wait_executed("stage2", 100)
    status, body = ui_cluster.post("topology/pipeline/deactivate")
    assert (status, body) == (200, {"topologyOperation": "deactivate", "topologyId": "pipeline", "status": "success"})
    assert ui_cluster.get("topology/pipeline")["status"] == "INACTIVE"
    ui_cluster.send(300)  # accepted into the source's queues, not executed
    wait_until(lambda: ui_cluster.components()["in"]["queuePopulation"] == 300, what="300 queued at the source")
    comps = ui_cluster.components()
    assert [comps[c]["executed"] for c in ("in", "stage1", "stage2")] == [100, 100, 100]
    status, body = ui_cluster.post("topology/pipeline/activate")
    assert status == 200
    assert body["topologyOperation"] == "activate"
    ui_cluster.wait_executed("stage2", 400)
    assert ui_cluster.get("topology/pipeline")["status"] == "ACTIVE"


def test_errors_are_clear_json(ui_cluster: UICluster) -> None:
    status, body = ui_cluster.post("topology/pipeline/rebalance/0", b'{"rebalanceOptions": {"numWorkers": 3}}')
    assert status == 501
    assert body["error"] == "Not Implemented"
    assert "needs cluster mode" in body["errorMessage"]
    status, body = ui_cluster.post("topology/nope/activate")
    assert status == 404
    assert "nope" in body["errorMessage"]
    status, body = ui_cluster.post("topology/pipeline/kill/soon")
    assert status == 400
    assert "'soon'" in body["errorMessage"]
    status, body = ui_cluster.post("topology/pipeline/kill")
    assert status == 400
    assert "<wait-secs>" in body["errorMessage"]
    status, body = ui_cluster.post("topology/pipeline/deactivate", headers={"Origin": "http://evil.example"})
    assert status == 403
    assert ui_cluster.get("topology/pipeline")["status"] == "ACTIVE"  # refused means nothing happened
    for path in ("topology/nope", "topology/pipeline/component/nope", "no/such/thing"):
        with pytest.raises(urllib.request.HTTPError) as err:
            ui_cluster.get(path)
        assert err.value.code == 404
        assert json.loads(err.value.read())["errorMessage"]


def test_kill_is_an_ordered_stop_of_the_workers(ui_cluster: UICluster) -> None:
    ui_cluster.send(200)
    status, body = ui_cluster.post("topology/pipeline/kill/0")
    assert (status, body["topologyOperation"]) == (200, "kill")
    procs = ui_cluster.cluster.procs.values()
    wait_until(lambda: all(p.poll() is not None for p in procs), what="every worker to exit", timeout=60)
    assert [p.returncode for p in procs] == [0, 0]  # SIGTERM: drained and stopped cleanly
    wait_until(lambda: ui_cluster.get("topology/summary")["topologies"] == [], what="the topology to be gone")
    records = ui_cluster.stop()
    assert sum(r["count"] for r in records["stage2"].values()) == 200  # everything accepted was processed


def _wordcount(tmp: Path) -> Path:
    topo = yaml.safe_load((ROOT / "conf" / "topologies" / "wordcount.yaml").read_text())
    for comp in topo["components"]:
        if comp["id"] == "report":
            comp["conf"]["report.dir"] = str(tmp / "report")
    path = tmp / "wordcount.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def _read_until(proc: subprocess.Popen[str], marker: str) -> str:
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(marker):
            break
    return "".join(lines)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_local_cluster_serves_the_ui_and_the_wordcount_bolts_take_ticks_without_errors(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "spark_storm.cli", "local-cluster", "--topology", str(_wordcount(tmp_path))]
    proc = subprocess.Popen(
        [*cmd, "--workers", "2", "--ui-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        text = _read_until(proc, "running;")
        (url_line,) = [line for line in text.splitlines() if line.startswith("UI: http://")]
        url = url_line.removeprefix("UI: ")
        assert url.endswith("/topology.html?id=wordcount")
        base = url.split("/topology.html")[0]
        with urllib.request.urlopen(url, timeout=10) as r:
            assert b'id="components"' in r.read()

        # wordcount.yaml ticks every bolt once a second: split must take them without an error
        def ticked() -> bool:
            topology = _get(f"{base}/api/v1/topology/wordcount")
            spouts = [c["componentId"] for c in topology["spouts"]]  # the source, once workers reported
            ticks = {c["componentId"]: c["ticks"] for c in topology["bolts"]}
            bolts_ok = set(ticks) == {"split", "count", "report"} and all(n >= 2 for n in ticks.values())
            return spouts == ["sentences"] and bolts_ok

        wait_until(ticked, what="two ticks through every bolt", timeout=30)
        topology = _get(f"{base}/api/v1/topology/wordcount")
        comps = topology["spouts"] + topology["bolts"]
        assert {c["componentId"]: c["errorCount"] for c in comps} == dict.fromkeys(
            ("count", "report", "sentences", "split"), 0
        )
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, text + rest


def test_ui_command_finds_a_local_clusters_workers(ui_cluster: UICluster) -> None:
    hb = str(ui_cluster.cluster.heartbeat_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_storm.cli", "ui", "--heartbeat-dir", hb, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = _read_until(proc, "spark-storm UI on")
        base = line.split("UI on ")[1].split("/ ")[0]
        (topo,) = _get(f"{base}/api/v1/topology/summary")["topologies"]
        assert (topo["name"], topo["workersTotal"]) == ("pipeline", 2)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    bad = subprocess.run(
        [sys.executable, "-m", "spark_storm.cli", "ui", "--heartbeat-dir", str(Path(hb) / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "is not a directory" in bad.stderr


def _state_per_the_workers(run: LedgerUI) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The ledger's state summed as the UI should, and each worker's checkpoint view: read from every /health."""
    executors, checkpoints = [], {}
    for slot in run.cluster.slots:
        health: Any = run.cluster.health(slot)  # read as JSON: every key is there (this version wrote it)
        checkpoints[str(slot)] = health["checkpoint"]
        executors += [
            (ex["state"], health["checkpoint"]) for ex in health["executors"].values() if ex["component"] == "ledger"
        ]
    merged = merge_buckets(st["checkpoint_buckets"] for st, _ in executors)
    p50, p99 = percentile_of(merged, 50), percentile_of(merged, 99)
    state = {
        "executors": len(executors),
        "committedEpoch": min(cp["committed"] for _, cp in executors),
        "checkpointEpoch": min(st["epoch"] for st, _ in executors),
        "keys": sum(st["keys"] for st, _ in executors),
        "lastCheckpointBytes": sum(st["last_checkpoint_bytes"] for st, _ in executors),
        "checkpointP50Ms": None if p50 is None else round(p50 * 1000, 3),
        "checkpointP99Ms": None if p99 is None else round(p99 * 1000, 3),
        "checkpoints": sum(st["checkpoints"] for st, _ in executors),
        "restores": sum(st["restores"] for st, _ in executors),
        "rollbacks": max(st["rollbacks"] for st, _ in executors),
    }
    return state, checkpoints


def _assert_checkpoint_rows(run: LedgerUI, views: dict[str, dict[str, Any]]) -> None:
    topo = run.get("topology/ledger")
    rows = {r["worker"]: r for r in topo["checkpoints"]}
    assert set(rows) == set(views)
    for worker, cp in views.items():
        row = rows[worker]
        assert (row["epoch"], row["committed"], row["generation"], row["dirty"]) == (
            cp["epoch"],
            cp["committed"],
            cp["generation"],
            cp["dirty"],
        ), worker
        assert (row["rollbacks"], row["replayedRecords"], row["committedEpochs"], row["provider"]) == (
            cp["rollbacks"],
            cp["replayed_records"],
            cp["committed_epochs"],
            cp["provider"],
        ), worker
        assert row["reasons"] == cp["reasons"]
    assert topo["committedEpoch"] == min(cp["committed"] for cp in views.values())


def test_a_stateful_components_state_through_commits_a_sigkill_and_a_rollback(tmp: Path) -> None:
    with LedgerUI(tmp) as run:
        plan = run.cluster.plan
        st = run.wait_state(lambda s: s["executors"] == 2, "the ledger's two executors to report state")
        assert st == {
            "executors": 2,
            "committedEpoch": 0,
            "checkpointEpoch": 0,
            "keys": 0,
            "lastCheckpointBytes": 0,
            "checkpointP50Ms": None,  # no checkpoint yet: unknown, not zero
            "checkpointP99Ms": None,
            "checkpoints": 0,
            "restores": 0,  # a first start restores nothing
            "rollbacks": 0,
        }
        topo = run.get("topology/ledger")
        comps = {c["componentId"]: c for c in topo["spouts"] + topo["bolts"]}
        assert (comps["in"]["state"], comps["mid"]["state"]) == (None, None)  # stateless components
        assert comps["ledger"]["state"] == st
        assert [x["state"] is not None for x in topo["executorStats"] if x["component"] == "ledger"] == [True, True]
        assert {r["worker"] for r in topo["checkpoints"]} == {str(s) for s in run.cluster.slots}
        assert all(r["dirty"] is False and r["generation"] == 0 for r in topo["checkpoints"])

        for batch in range(2):
            assert run.feed_and_commit(batch).rolled_back_to is None
        # 4 ledger tasks wrote epochs 1 and 2: 8 task checkpoints, every key of the two batches in state
        st = run.wait_state(lambda s: (s["committedEpoch"], s["checkpoints"]) == (2, 8), "epoch 2 committed")
        truth, views = _state_per_the_workers(run)
        assert st == truth
        assert (st["checkpointEpoch"], st["keys"]) == (2, len(expected(run.batches)))
        assert st["lastCheckpointBytes"] > 0
        assert 0 < st["checkpointP50Ms"] <= st["checkpointP99Ms"]
        _assert_checkpoint_rows(run, views)

        # SIGKILL a worker with ledger tasks and restart it: they restore epoch 2; the next commit rolls back
        tasks = plan.component_tasks["ledger"]
        victim = next(s for s in run.cluster.slots if any(plan.task_slot[t] == s for t in tasks))
        restored = [t for t in tasks if plan.task_slot[t] == victim]
        run.cluster.kill(victim)
        run.cluster.start_worker(victim)
        run.cluster.wait_running(60, [victim])

        def victim_row() -> dict[str, Any]:
            rows: dict[str, dict[str, Any]] = {r["worker"]: r for r in run.get("topology/ledger")["checkpoints"]}
            return rows.get(str(victim), {})

        wait_until(lambda: victim_row().get("dirty") is True, what="the restarted worker shown dirty")
        reasons = victim_row()["reasons"]
        assert {f"task {t} restored epoch 2 at start" for t in restored} <= set(reasons), reasons
        result = run.feed_and_commit(2)
        assert result.rolled_back_to == 2
        st = run.wait_state(
            lambda s: s["committedEpoch"] == 3 and s["restores"] == len(restored) and s["rollbacks"] >= 1,
            "epoch 3 committed after the restarted tasks restored and everyone rolled back",
        )
        truth, views = _state_per_the_workers(run)
        assert st == truth
        assert st["keys"] == len(expected(run.batches))
        _assert_checkpoint_rows(run, views)
        assert all(cp["rollbacks"] >= 1 and not cp["dirty"] for cp in views.values())
        # the component page carries the same figures, per executor too
        comp = run.ledger()
        assert sum(x["state"]["keys"] for x in comp["executorStats"]) == st["keys"]
        assert {x["id"]: x["state"]["restores"] for x in comp["executorStats"]} == {
            x["id"]: x["tasks"] if x["worker"] == str(victim) else 0 for x in comp["executorStats"]
        }
        assert ledger_state(tmp / "state", "ledger", plan) == expected(run.batches)  # and the state is exact
        print(
            f"rollbacks {st['rollbacks']} (attempts {result.attempts}), restores {st['restores']}, "
            f"replayed records {sum(cp['replayed_records'] for cp in views.values())}, "
            f"checkpoint p50/p99 {st['checkpointP50Ms']}/{st['checkpointP99Ms']} ms"
        )
