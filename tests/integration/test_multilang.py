"""Multilang components with real child processes in real workers.

Storm's own children (storm.py's splitsentence.py, storm.js's randomsentence.js, from the
Maven Central jars scripts/fetch-jars gets) under Storm's own Flux file; a test child that
misbehaves on purpose (hangs, writes garbage, exits mid-stream); a command that does not
exist; pystorm bolts in-process.
"""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.topology import Slot
from tests.integration.runs import Run, rows
from tests.support import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHILD = str(Path(__file__).resolve().parent / "children" / "echo_bolt.py")
FLUX = ROOT / "tests" / "data" / "flux"


def _topology(tmp: Path, serializer: str = "json", **conf: object) -> dict[str, Any]:
    command = [sys.executable, CHILD] + (["--serializer", "msgpack"] if serializer == "msgpack" else [])
    return {
        "name": "ml",
        "conf": {"topology.multilang.serializer": serializer, **conf},
        "components": [
            {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": 1},
            {
                "id": "echo",
                "shell": command,
                "fields": ["key", "n"],
                "parallelism": 2,
                "inputs": [{"from": "in", "grouping": "shuffle"}],
            },
            {
                "id": "out",
                "bolt": "tests.integration.bolts:RecordingBolt",
                "conf": {"record.dir": str(tmp / "records")},
                "inputs": [{"from": "echo", "grouping": "fields", "fields": ["key"]}],
            },
        ],
    }


def _tasks(health: Any, component: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for executor in health["executors"].values():
        if executor["component"] == component:
            out.update(executor["tasks"])
    return out


def _total(health: Any, component: str, counter: str) -> int:
    return sum(t[counter] for t in _tasks(health, component).values())


def _errors(run: Run, slot: Slot) -> str:
    return "\n".join(e["error"] for e in run.health(slot)["errors"])


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
def test_multilang_bolt_exact_through_a_worker(tmp: Path, serializer: str) -> None:
    run = Run(tmp, _topology(tmp, serializer), 1).start()
    slot = run.cluster.slots[0]
    run.send_to_sources(rows(3000))
    wait_until(lambda: _total(run.health(slot), "out", "executed") >= 3000, what="3000 tuples through the children")
    health = run.health(slot)
    assert _total(health, "echo", "acked") == 3000
    assert _total(health, "echo", "failed") == 0
    records = run.stop()
    counts: dict[str, int] = {}
    for rec in records["out"].values():
        for key, n in rec["keys"].items():
            counts[key] = counts.get(key, 0) + n
    assert counts == {f"k{i}": len(range(i, 3000, 17)) for i in range(17)}


def test_an_ordered_shutdown_waits_for_what_a_slow_child_still_holds(tmp: Path) -> None:
    """The worker stopped while a slow child held hundreds of tuples: all of them reach the bolt after it.

    The worker's quiet check took the child's executor as idle once ``execute`` had queued the
    tuples, stopped every executor, and the bolt after the child was cleaned up before the
    child's last emits reached it (tests/spark/test_streamparse.py's counts, one apart, under
    load).  Now ``Bolt.in_flight`` (the child's queued and unacked tuples) keeps it busy.
    """
    topo = _topology(tmp)
    topo["components"][1]["shell"] = [sys.executable, CHILD, "--delay-ms", "5"]
    topo["components"][1]["parallelism"] = 1
    run = Run(tmp, topo, 1).start()
    slot = run.cluster.slots[0]
    run.send_to_sources(rows(400))
    wait_until(lambda: _total(run.health(slot), "in", "executed") >= 400, what="400 tuples handed to the child")
    assert _total(run.health(slot), "out", "executed") < 400  # the child is still at it (2 s of work)
    records = run.stop()
    assert sum(r["count"] for r in records["out"].values()) == 400


def test_hung_child_is_killed_and_restarted(tmp: Path) -> None:
    conf = {"topology.subprocess.timeout.secs": 1, "topology.multilang.heartbeat.interval.ms": 200}
    topo = _topology(tmp, "json", **conf)
    topo["components"][1]["parallelism"] = 1
    run = Run(tmp, topo, 1).start()
    slot = run.cluster.slots[0]
    run.send_to_sources([["hang", 0]])
    wait_until(lambda: "heartbeat timeout" in _errors(run, slot), what="the hung child killed", timeout=20)
    errors = _errors(run, slot)
    assert f"`{sys.executable} {CHILD}`" in errors  # names the command
    assert "failed its 1 pending tuples; restarting it in" in errors
    assert _total(run.health(slot), "echo", "failed") == 1
    wait_until(lambda: "started" in run.cluster.log_tail(slot, 200).split("heartbeat timeout")[-1], what="a new child")
    run.send_to_sources(rows(500))
    wait_until(lambda: _total(run.health(slot), "out", "executed") >= 500, what="500 tuples through the new child")
    assert _total(run.health(slot), "echo", "acked") == 500
    run.stop()


def test_child_writing_garbage_is_restarted(tmp: Path) -> None:
    run = Run(tmp, _topology(tmp), 1).start()
    slot = run.cluster.slots[0]
    run.send_to_sources([["garbage", 0]])
    wait_until(lambda: "not a multilang message" in _errors(run, slot), what="the garbage reported", timeout=20)
    assert "'this is not a multilang message" in _errors(run, slot)
    run.send_to_sources(rows(300))
    wait_until(lambda: _total(run.health(slot), "out", "executed") >= 300, what="300 tuples after the restart")
    run.stop()


def test_child_exiting_mid_stream_fails_its_tuples_and_is_restarted(tmp: Path) -> None:
    topo = _topology(tmp)
    topo["components"][1]["parallelism"] = 1
    run = Run(tmp, topo, 1).start()
    slot = run.cluster.slots[0]
    run.send_to_sources(rows(200))
    wait_until(lambda: _total(run.health(slot), "out", "executed") >= 200, what="200 tuples before the exit")
    run.send_to_sources([["exit", 1]])
    wait_until(lambda: "exited with code 3" in _errors(run, slot), what="the exit reported", timeout=20)
    errors = _errors(run, slot)
    assert "its last stderr line: 'dying on purpose'" in errors
    assert _total(run.health(slot), "echo", "failed") >= 1
    run.send_to_sources(rows(200))
    wait_until(lambda: _total(run.health(slot), "out", "executed") >= 400, what="200 more after the restart")
    run.stop()


def test_command_not_found_stops_the_worker_at_start_with_a_clear_error(tmp: Path) -> None:
    topo = _topology(tmp)
    topo["components"][1]["shell"] = ["no-such-interpreter-here", "split.py"]
    run = Run(tmp, topo, 1)
    slot = run.cluster.slots[0]
    run.cluster.start_worker(slot)
    assert run.cluster.procs[slot].wait(60) != 0
    log = run.cluster.log_tail(slot, 200)
    assert (
        "component 'echo': multilang command 'no-such-interpreter-here split.py' cannot start: "
        "'no-such-interpreter-here' is not on PATH"
    ) in log
    run.stopped = True
    run.ctx.term()


def _storm_resources(tmp: Path) -> None:
    """Storm's storm.py / storm.js and Flux's example children, from the Maven Central jars."""
    jars = sorted((ROOT / "jars" / "multilang").glob("*.jar"))
    if len(jars) < 3:
        pytest.skip("Storm's multilang jars are missing: run scripts/fetch-jars")
    for jar in jars:
        with zipfile.ZipFile(jar) as z:
            for name in z.namelist():
                if name.startswith("resources/") and name.endswith((".py", ".js")):
                    (tmp / Path(name).name).write_bytes(z.read(name))


def test_storms_own_children_under_storms_own_flux_file(tmp: Path) -> None:
    """flux-examples' multilang.yaml unchanged: node randomsentence.js (ShellSpout) -> python3 splitsentence.py."""
    if shutil.which("node") is None or shutil.which("python3") is None:
        pytest.skip(
            "node and python3 are needed for Storm's JavaScript spout and Python bolt: apt-get install nodejs python3"
        )
    _storm_resources(tmp)
    shutil.copy(FLUX / "multilang.yaml", tmp / "multilang.yaml")
    cluster = LocalCluster(str(tmp / "multilang.yaml"), 1)
    try:
        cluster.start()
        slot = cluster.slots[0]
        run = Run.__new__(Run)
        run.cluster = cluster
        wait_until(
            lambda: _total(run.health(slot), "sentence-spout", "acked") >= 10,
            what="10 sentence trees acked back to the JavaScript spout",
            timeout=60,
        )
        health = run.health(slot)
        assert _total(health, "splitsentence", "acked") >= 10
        assert _total(health, "count", "executed") >= 30  # words counted by TestWordCounter
        assert _total(health, "log", "executed") >= 30
        assert health["errors"] == []
    finally:
        codes = cluster.stop()
    assert all(c == 0 for c in codes.values()), cluster.log_tail(cluster.slots[0], 50)


def test_pystorm_bolt_in_process(tmp: Path) -> None:
    topo = _topology(tmp)
    topo["components"][1] = {
        "id": "echo",
        "bolt": "tests.integration.pystorm_bolts:EchoBolt",
        "fields": ["key", "n"],
        "parallelism": 2,
        "inputs": [{"from": "in", "grouping": "shuffle"}],
    }
    run = Run(tmp, topo, 1).start()
    slot = run.cluster.slots[0]
    run.send_to_sources([*rows(1000), ["boom", 0]])
    wait_until(
        lambda: _total(run.health(slot), "out", "executed") >= 1000, what="1000 tuples through pystorm in-process"
    )
    wait_until(lambda: "RuntimeError: boom on purpose" in _errors(run, slot), what="the bolt's exception reported")
    health = run.health(slot)
    assert _total(health, "echo", "acked") == 1000
    assert _total(health, "echo", "failed") == 1  # auto_fail
    records = run.stop()
    assert sum(sum(r["keys"].values()) for r in records["out"].values()) == 1000


def _spout_topology(tmp: Path, spout: dict[str, Any], **conf: object) -> dict[str, Any]:
    return {
        "name": "spouts",
        "conf": {"record.dir": str(tmp / "records"), **conf},
        "components": [
            {"id": "s", "fields": ["key", "n"], **spout},
            {
                "id": "out",
                "bolt": "tests.integration.bolts:RecordingBolt",
                "parallelism": 2,
                "inputs": [{"from": "s", "grouping": "fields", "fields": ["key"]}],
            },
        ],
    }


def test_python_spout_trees_ack_and_fail_back_to_the_spout(tmp: Path) -> None:
    topo = _spout_topology(tmp, {"spout": "tests.integration.bolts:ReliableSpout"}, **{"spout.count": 100})
    run = Run(tmp, topo, 2).start()  # the trees cross workers: acks travel back to the spout's acker
    spout_slot = run.plan.task_slot[run.plan.component_tasks["s"][0]]
    wait_until(lambda: _total(run.health(spout_slot), "s", "acked") == 90, what="90 trees acked to the spout")
    wait_until(lambda: _total(run.health(spout_slot), "s", "failed") == 10, what="the 10 'boom' trees failed")
    run.stop()
    recorded = json.loads(next((tmp / "records").glob("spout-*.record")).read_text())
    assert recorded["failed"] == list(range(0, 100, 10))
    assert recorded["acked"] == [i for i in range(100) if i % 10]


def test_hung_shell_spout_is_killed_and_restarted(tmp: Path) -> None:
    spout = {"shell": [sys.executable, str(Path(CHILD).parent / "count_spout.py"), "--hang-after", "50"], "spout": True}
    topo = _spout_topology(tmp, spout, **{"topology.subprocess.timeout.secs": 1})
    run = Run(tmp, topo, 1).start()
    slot = run.cluster.slots[0]
    wait_until(lambda: "no sync for 'next'" in _errors(run, slot), what="the hung spout child killed", timeout=30)
    errors = _errors(run, slot)
    assert f"multilang spout s:{run.plan.component_tasks['s'][0]}: child" in errors
    assert "count_spout.py --hang-after 50` (pid" in errors
    assert "restarting it in" in errors
    wait_until(lambda: _total(run.health(slot), "s", "acked") >= 80, what="the restarted child's trees acked")
    run.stop()
