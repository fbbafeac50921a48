"""Real worker processes on loopback, fed by a raw IClient; exact counts."""

from __future__ import annotations

import json
import signal
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest

from spark_storm.codec.tuples import BROADCAST_TASK
from spark_storm.messaging import TaskMessage
from spark_storm.topology import Slot
from spark_storm.transport import make_context
from tests.integration.runs import Run, arrow_payload, rows
from tests.support import wait_until

pytestmark = pytest.mark.integration

BOLT = "tests.integration.bolts:RecordingBolt"


def three_stage(grouping: str, record_dir: Path, **conf: Any) -> dict[str, Any]:
    first_input: dict[str, Any] = {"from": "in", "grouping": grouping}
    if grouping == "fields":
        first_input["fields"] = ["key"]
    return {
        "name": "three",
        "conf": {"record.dir": str(record_dir), **conf},
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": 2},
            {
                "id": "stage1",
                "bolt": BOLT,
                "parallelism": 2,
                "tasks": 4,
                "fields": ["key", "n"],
                "inputs": [first_input],
            },
            {
                "id": "stage2",
                "bolt": BOLT,
                "parallelism": 3,
                "tasks": 3,
                "inputs": [{"from": "stage1", "grouping": "fields", "fields": ["key"]}],
            },
        ],
    }


def _check_stage2(records: dict[str, dict[int, dict[str, Any]]], total: int) -> None:
    stage2 = records["stage2"]
    assert sum(r["count"] for r in stage2.values()) == total
    owners: dict[str, list[int]] = {}
    for task, rec in stage2.items():
        for key in rec["keys"]:
            owners.setdefault(key, []).append(task)
    assert all(len(t) == 1 for t in owners.values()), owners  # each key in exactly one task


@pytest.mark.parametrize("grouping", ["shuffle", "fields", "all", "global", "local_or_shuffle", "none", "load_aware"])
def test_three_stages_over_two_workers_every_grouping(tmp: Path, grouping: str) -> None:
    run = Run(tmp, three_stage(grouping, tmp / "records"), 2).start()
    n = 600
    run.send_to_sources(rows(n))
    records = run.stop()
    stage1 = records["stage1"]
    assert sorted(stage1) == [3, 4, 5, 6]  # tasks: in 1-2, stage1 3-6, stage2 7-9
    total1 = sum(r["count"] for r in stage1.values())
    if grouping == "all":
        assert all(r["count"] == n for r in stage1.values())
        assert total1 == 4 * n
    elif grouping == "global":
        assert stage1[3]["count"] == n
        assert total1 == n
    else:
        assert total1 == n
    if grouping == "fields":
        owners = Counter(k for r in stage1.values() for k in r["keys"])
        assert set(owners.values()) == {1}
    if grouping in ("shuffle", "none"):
        assert all(r["count"] > 0 for r in stage1.values())
    _check_stage2(records, total1)


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_three_workers_both_receive_modes(tmp: Path, mode: str) -> None:
    run = Run(tmp, three_stage("shuffle", tmp / "records"), 3, **{"topology.receiver.mode": mode}).start()
    run.send_to_sources(rows(900))
    records = run.stop()
    assert sum(r["count"] for r in records["stage1"].values()) == 900
    _check_stage2(records, 900)


def test_direct_grouping_reaches_the_chosen_task(tmp: Path) -> None:
    topo = {
        "name": "direct",
        "conf": {"record.dir": str(tmp / "records"), "direct.targets": [4, 5]},
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"]},
            {
                "id": "pick",
                "bolt": "tests.integration.bolts:DirectEmitter",
                "fields": ["key", "n"],
                "inputs": [{"from": "in"}],
            },
            {
                "id": "sink",
                "bolt": BOLT,
                "parallelism": 3,
                "inputs": [{"from": "pick", "grouping": "direct"}],
            },
        ],
    }
    run = Run(tmp, topo, 2).start()
    run.send_to_sources(rows(100))
    records = run.stop()
    assert {t: r["count"] for t, r in records["sink"].items()} == {3: 0, 4: 50, 5: 50}


def test_unknown_task_is_counted_and_dropped_and_broadcast_reaches_every_task(tmp: Path) -> None:
    run = Run(tmp, three_stage("shuffle", tmp / "records"), 1).start()
    slot = run.cluster.slots[0]
    conn = run.conns[slot]
    conn.send([TaskMessage(999, b"x"), TaskMessage(BROADCAST_TASK, msgpack.packb([-1, "default", ["hello"]]))])
    run.send_to_sources(rows(50))
    wait_until(lambda: run.health(slot)["counters"]["unknown_task"] == 1, what="the unknown task to be counted")
    records = run.stop()
    assert sum(r["count"] for r in records["stage1"].values()) == 50
    assert all(r["broadcast"] == 1 for comp in ("stage1", "stage2") for r in records[comp].values())
    assert "does not run" in run.cluster.log_tail(slot, 200)


def test_bolt_exception_is_logged_and_the_executor_goes_on(tmp: Path) -> None:
    run = Run(tmp, three_stage("global", tmp / "records"), 1).start()
    run.send_to_sources([["boom", 0], *rows(20)])
    slot = run.cluster.slots[0]
    wait_until(
        lambda: sum(t["errors"] for e in run.health(slot)["executors"].values() for t in e["tasks"].values()) == 1,
        what="the error to be counted",
    )
    records = run.stop()
    assert records["stage1"][3]["count"] == 20
    assert "boom on purpose" in run.cluster.log_tail(slot, 200)


def test_backpressure_holds_the_sender_without_loss_or_unbounded_memory(tmp: Path) -> None:
    high = 64_000
    topo = three_stage("shuffle", tmp / "records", **{"record.delay.s": 0.002})
    run = Run(
        tmp,
        topo,
        1,
        **{
            "topology.executor.receive.buffer.size": 64,
            "storm.messaging.tcp.buffer.high.watermark": high,
            "storm.messaging.tcp.buffer.low.watermark": high // 2,
        },
    ).start()
    slot = run.cluster.slots[0]
    conn = run.conns[slot]
    sources = list(run.plan.component_tasks["in"])
    n = 3000
    peak = 0
    saw_bp = False
    for i in range(0, n, 100):
        conn.send([TaskMessage(sources[j % 2], msgpack.packb([f"k{j % 7}", j]) + b" " * 0) for j in range(i, i + 100)])
        peak = max(peak, conn.metrics()["pending_bytes"])
        saw_bp = saw_bp or bool(conn.backpressure_tasks())
    assert conn.flush(120)
    assert peak <= high + 20_000  # bounded by the watermark (plus one batch)
    health = run.health(slot)
    overflow = sum(e["queue"]["overflow"] for e in health["executors"].values())
    assert saw_bp or overflow > 0
    records = run.stop()
    assert sum(r["count"] for r in records["stage1"].values()) == n
    _check_stage2(records, n)


def test_sigterm_drains_everything_in_flight(tmp: Path) -> None:
    topo = three_stage("shuffle", tmp / "records", **{"record.delay.s": 0.0005})
    run = Run(tmp, topo, 1).start()
    run.send_to_sources(rows(2000))  # all acknowledged: in the worker's queues, mostly unprocessed
    slot = run.cluster.slots[0]
    proc = run.cluster.procs[slot]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, run.cluster.log_tail(slot)
    records = run.stop()
    assert sum(r["count"] for r in records["stage1"].values()) == 2000
    _check_stage2(records, 2000)
    hb = run.cluster.heartbeat(slot)
    assert hb is not None
    assert hb["status"] == "stopped"


def test_metrics_endpoint_speaks_prometheus(tmp: Path) -> None:
    run = Run(tmp, three_stage("fields", tmp / "records"), 1).start()
    run.send_to_sources(rows(30))
    slot = run.cluster.slots[0]
    hb = run.cluster.heartbeat(slot)
    assert hb is not None
    assert hb["metrics_port"] is not None

    def stage2_executed() -> int:
        executors = run.health(slot)["executors"].values()
        return sum(t["executed"] for e in executors if e["component"] == "stage2" for t in e["tasks"].values())

    wait_until(lambda: stage2_executed() == 30, what="30 executed by stage2")
    with urllib.request.urlopen(f"http://127.0.0.1:{hb['metrics_port']}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names))  # each family once: no interleaving
    by_name = {f.name: f for f in families}
    assert by_name["spark_storm_bolt_executed"].type == "counter"
    executed = [s for s in by_name["spark_storm_bolt_executed"].samples if s.labels["component"] == "stage2"]
    assert sum(s.value for s in executed) == 30
    assert all(s.labels["topology"] == "three" and s.name.endswith("_total") for s in executed)
    assert {s.labels["queue"] for s in by_name["spark_storm_queue_capacity"].samples} >= {"transfer"}
    # Execute latency is a histogram per task that counts tuples: _count is the task's executed,
    # the buckets are cumulative and end at +Inf, _sum is positive seconds.
    latency = by_name["spark_storm_bolt_execute_latency_seconds"]
    assert latency.type == "histogram"
    per_task: dict[str, dict[str, Any]] = {}
    for s in latency.samples:
        if s.labels["component"] == "stage2":
            entry = per_task.setdefault(s.labels["task"], {"buckets": []})
            if s.name.endswith("_bucket"):
                entry["buckets"].append((float(s.labels["le"]), s.value))
            else:
                entry[s.name.rsplit("_", 1)[1]] = s.value
    assert {s.labels["task"]: s.value for s in executed} == {t: e["count"] for t, e in per_task.items()}
    for entry in per_task.values():
        counts = [n for _, n in sorted(entry["buckets"])]
        assert counts == sorted(counts)  # cumulative
        assert sorted(entry["buckets"])[-1] == (float("inf"), entry["count"])
        assert len(counts) == 25  # one bound per doubling from 1 us, and +Inf
        assert entry["sum"] > 0 or entry["count"] == 0
    assert "spark_storm_bolt_latency_p99_ms" not in by_name  # percentiles cannot be added up: no gauges
    run.stop()


def _post(port: int, path: str) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return str(r.read().decode())


def test_deactivate_holds_tuples_activate_releases_them_and_ticks_and_loads_flow(tmp: Path) -> None:
    topo = three_stage("shuffle", tmp / "records", **{"topology.tick.tuple.freq.secs": 0.1})
    run = Run(tmp, topo, 1, **{"topology.load.metrics.interval.ms": 50}).start()
    slot = run.cluster.slots[0]
    hb = run.cluster.heartbeat(slot)
    assert hb is not None
    assert hb["metrics_port"] is not None
    port = hb["metrics_port"]
    assert json.loads(_post(port, "/deactivate")) == {"active": False}
    run.send_to_sources(rows(40))
    health = run.health(slot)
    assert health["active"] is False
    assert sum(e["queue"]["population"] for e in health["executors"].values()) == 40
    conn = run.conns[slot]
    sources = list(run.plan.component_tasks["in"])
    wait_until(lambda: set(conn.get_load(sources)) == set(sources), what="load metrics from the worker")
    assert json.loads(_post(port, "/activate")) == {"active": True}
    wait_until(
        lambda: sum(e["queue"]["population"] for e in run.health(slot)["executors"].values()) == 0,
        what="queues to drain after activate",
    )
    records = run.stop()
    assert sum(r["count"] for r in records["stage1"].values()) == 40
    assert all(r["ticks"] >= 1 for r in records["stage2"].values())


def test_dead_letter_file_gets_unknown_tasks(tmp: Path) -> None:
    dead = tmp / "dead.jsonl"
    run = Run(tmp, three_stage("shuffle", tmp / "records"), 1, **{"topology.worker.dead.letter.file": str(dead)})
    run.start()
    run.conns[run.cluster.slots[0]].send([TaskMessage(4242, b"lost?")])
    wait_until(dead.exists, what="the dead-letter file")
    run.stop()
    record = json.loads(dead.read_text().splitlines()[0])
    assert record["task"] == 4242
    assert bytes.fromhex(record["payload_hex"]) == b"lost?"


def test_ctrl_c_on_local_cluster_drains_every_worker_in_order(tmp: Path) -> None:
    """Ctrl-C in a terminal signals the whole foreground process group, as done here."""
    import os
    import subprocess
    import sys

    from spark_storm.topology import load_topology, plan

    wordcount = Path(__file__).resolve().parents[2] / "conf" / "topologies" / "wordcount.yaml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_storm.cli", "local-cluster", "--topology", str(wordcount), "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp,
        start_new_session=True,  # its own process group, like a shell job
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("running;"):
            break
    text = "".join(lines)
    assert "starting 2 workers of wordcount" in text
    assert text.count("metrics http://127.0.0.1:") == 2
    workers = text.split("starting 2 workers of wordcount: ")[1].split()[0]
    p = plan(load_topology(wordcount), workers)
    ctx = make_context({"storm.messaging.transport": "tcp"})
    sources = list(p.component_tasks["sentences"])
    conns = {s: ctx.connect("wordcount", s.host, s.port) for s in p.slots}
    for i in range(2000):
        task = sources[i % len(sources)]
        conns[p.task_slot[task]].send([TaskMessage(task, msgpack.packb(["the quick brown fox"]))])
    for conn in conns.values():
        assert conn.flush(30)  # accepted by the workers, maybe not yet processed
    ctx.term()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: every process of the foreground group
    rest, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, text + rest
    assert rest.count("exited with 0") == 2, rest
    final: Counter[str] = Counter()
    for path in (tmp / "wordcount-report").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            final.update(json.loads(line).get("final", {}))
    assert final["the"] == 2000  # everything accepted went through split, count and report


def test_groups_with_arrow_payloads_are_acked_processed_once_bolts_acked(tmp: Path) -> None:
    from spark_storm.messaging.wire import ACCEPTED, FAILED, PROCESSED, BatchHeader

    topo = three_stage("shuffle", tmp / "records", **{"topology.bolt.error.policy": "fail"})
    topo["components"][0]["bolt"] = BOLT  # the entry component records and acks itself
    run = Run(tmp, topo, 1).start()
    slot = run.cluster.slots[0]
    conn = run.conns[slot]
    rows = [[f"k{i % 5}", i] for i in range(300)]
    msgs = [
        TaskMessage(1, arrow_payload(rows[:150], ["key", "n"])),
        TaskMessage(2, arrow_payload(rows[150:], ["n", "key"])),
    ]
    h = BatchHeader("q", 0, 0, 0, 2, PROCESSED)
    conn.send_group(h, msgs)
    assert conn.wait_acks([h.key], PROCESSED, 30) == {h.key: PROCESSED}
    conn.send_group(h, msgs)  # a replay of a processed group: dropped
    assert conn.wait_acks([h.key], ACCEPTED, 30) == {h.key: PROCESSED}
    bad = BatchHeader("q", 0, 0, 1, 1, PROCESSED)
    conn.send_group(bad, [TaskMessage(1, arrow_payload([["boom", 0]], ["key", "n"]))])
    assert conn.wait_acks([bad.key], PROCESSED, 30) == {bad.key: FAILED}
    missing = BatchHeader("q", 0, 0, 2, 2, ACCEPTED)
    good_then_bad = [
        TaskMessage(1, arrow_payload([["fine", 1]], ["key", "n"])),
        TaskMessage(2, arrow_payload([["x"]], ["key"])),
    ]
    conn.send_group(missing, good_then_bad)  # the second lacks field "n": nothing of the group is queued
    assert conn.wait_acks([missing.key], ACCEPTED, 30) == {missing.key: FAILED}
    wait_until(lambda: run.health(slot)["counters"]["bad_payload"] == 1, what="the bad payload to be counted")
    records = run.stop()
    assert sum(r["count"] for r in records["in"].values()) == 300
    assert sum(r["count"] for r in records["stage1"].values()) == 300


def test_processed_waits_for_the_whole_anchored_tree_across_workers(tmp: Path) -> None:
    from spark_storm.messaging.wire import FAILED, PROCESSED, BatchHeader

    topo = three_stage("shuffle", tmp / "records", **{"record.delay.s": 0.002, "record.boom.component": "stage2"})
    topo["components"][0]["bolt"] = BOLT  # entry bolt forwards anchored (emit(..., anchors=tup)) and acks
    run = Run(tmp, topo, 2).start()
    rows = [[f"k{i % 9}", i] for i in range(200)]
    h = BatchHeader("q", 0, 0, 0, 0, PROCESSED)
    by_slot: dict[Slot, list[TaskMessage]] = {}
    for i, row in enumerate(rows):
        task = run.plan.component_tasks["in"][i % 2]
        by_slot.setdefault(run.plan.task_slot[task], []).append(TaskMessage(task, arrow_payload([row], ["key", "n"])))
    keys = []
    for seq, (slot, msgs) in enumerate(sorted(by_slot.items())):
        hs = BatchHeader(h.query_id, 0, 0, seq, len(msgs), PROCESSED)
        run.conns[slot].send_group(hs, msgs)
        keys.append((slot, hs.key))
    for slot, key in keys:
        assert run.conns[slot].wait_acks([key], PROCESSED, 60) == {key: PROCESSED}

    def executed(component: str) -> int:
        return sum(
            t["executed"] - 0
            for s in run.cluster.slots
            for e in run.health(s)["executors"].values()
            if e["component"] == component
            for t in e["tasks"].values()
        )

    # PROCESSED came only once the last stage, on either worker, had acked every tuple.
    assert executed("stage2") >= 200
    trees = [run.health(s)["acker"] for s in run.cluster.slots]
    assert sum(t["completed"] for t in trees) == 200
    assert sum(t["pending"] for t in trees) == 0
    # A failure two hops downstream fails the group.
    slot = run.plan.task_slot[run.plan.component_tasks["in"][0]]
    bad = BatchHeader("q", 1, 0, 0, 1, PROCESSED)
    run.conns[slot].send_group(
        bad, [TaskMessage(run.plan.component_tasks["in"][0], arrow_payload([["boom", 1]], ["key", "n"]))]
    )
    assert run.conns[slot].wait_acks([bad.key], PROCESSED, 60) == {bad.key: FAILED}
    run.stop()
