"""deploy() on local Spark (local[2,4]): workers as Spark tasks, fed by format("storm"), stopped with nothing left.

Every process a deployment starts is found by PID (its ZooKeeper server, the supervisor
tasks' Python workers, the spark-storm workers) and checked gone at the end; the bad inputs
each get their own test with the exact message.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_storm.errors import ConfigError, DeployError
from spark_storm.netutil import free_ports
from spark_storm.spark import deploy
from spark_storm.spark.deployment import state_check
from spark_storm.topology import load_topology
from tests.support import ROOT, wait_until, wordcount
from tests.support.cluster import alive
from tests.support.on_spark import FAST_DEPLOY, Processes, accepted, kill, processes, wait_all_gone
from tests.support.spark import write_json_rows

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(900)]

SECRET = "not-on-any-command-line-7f3a"


def _cmdlines_with(text: str) -> list[tuple[int, str]]:
    """Every process whose command line holds ``text``."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in line:
                out.append((int(proc.name), line))
    return out


def _stream(spark: Any, topo: Any, src: Path, ck: Path, **options: str) -> Any:
    return (
        spark.readStream.schema("sentence string")
        .option("maxFilesPerTrigger", 1)
        .json(str(src))
        .writeStream.format("storm")
        .option("topology", topo.name)
        .option("zookeeper", topo.zookeeper)
        .option("delivery", "processed")
        .options(**options)
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )


def test_deploy_feeds_and_stops_leaving_nothing_and_the_name_is_free_again(spark: Any, tmp_path: Path) -> None:
    path = wordcount(tmp_path, "wcdeploy")
    rows = [{"sentence": f"the quick brown fox {i % 97}"} for i in range(2000)]
    write_json_rows(tmp_path / "src", rows, files=4)
    conf = {**FAST_DEPLOY, "storm.messaging.auth.secret": SECRET}
    started = time.monotonic()
    with deploy(spark, str(path), workers=1, conf=conf) as topo:
        print(f"deploy() to 1 worker running: {time.monotonic() - started:.1f}s")
        assert topo.name == "wcdeploy"
        assert re.fullmatch(r"127\.0\.0\.1:\d+/storm", topo.zookeeper), topo.zookeeper
        assert len(topo.workers()) == 1
        status = topo.status()
        assert (status.state, status.status, status.workers, status.requested, status.tasks) == (
            "running",
            "active",
            1,
            1,
            1,
        )
        listed = subprocess.run(
            [sys.executable, "-m", "spark_storm.cli", "list", "--zookeeper", topo.zookeeper],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert listed.returncode == 0, listed.stderr
        assert re.search(r"wcdeploy\s+active\s+1/1", listed.stdout), listed.stdout
        procs = processes(topo)
        assert procs.zookeeper is not None
        assert len(procs.supervisors) == 1
        assert len(procs.workers) == 1
        # the secret reached the worker (the stream below authenticates) through a file, never argv
        assert not _cmdlines_with(SECRET)
        q = _stream(spark, topo, tmp_path / "src", tmp_path / "ck", **{"storm.messaging.auth.secret": SECRET})
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
        assert not q.isActive
        sent = sum(int(p["numInputRows"]) for p in q.recentProgress)
        assert sent == len(rows)
        assert accepted(topo) == sent
        zk_dir = topo._zk_server.dir
    wait_all_gone(procs, "after stop()")
    assert not topo._running_jobs()
    assert topo.state == "stopped"
    assert not zk_dir.exists(), "deploy()'s ZooKeeper left its directory"
    assert not _cmdlines_with("wcdeploy")
    # the name is free again: a second deployment of it (its own new ZooKeeper) comes up
    with deploy(spark, str(path), workers=1, conf=FAST_DEPLOY) as again:
        assert again.status().state == "running"
        second = processes(again)
    wait_all_gone(second, "after the second stop()")


def test_a_killed_supervisor_task_runs_again_and_a_job_spark_gave_up_on_is_resubmitted(
    spark: Any, tmp_path: Path
) -> None:
    """local[2,4] retries a task 3 times: the 4th kill fails the job, and deploy() submits it again."""
    path = wordcount(tmp_path, "wcretry")
    with deploy(spark, str(path), workers=1, conf=FAST_DEPLOY) as topo:
        for kills in range(1, 5):
            before = processes(topo)
            (victim,) = before.supervisors.values()
            kill(victim)
            wait_all_gone(Processes(None, {}, before.workers), f"kill {kills}: the old task's worker")

            def replaced(old: dict[str, int] = before.supervisors) -> bool:
                now = processes(topo).supervisors
                return bool(now) and set(now) != set(old)

            wait_until(replaced, what=f"kill {kills}: a new supervisor task", timeout=180, interval=0.2)
            topo.wait_running(180)
            status = topo.status()
            print(f"after kill {kills}: {status}")
        assert status.resubmits == 1, status
        assert status.task_retries >= 3, status
        assert status.state == "running"
        last = processes(topo)
    wait_all_gone(last, "after stop()")


def test_cancelling_the_job_group_ends_the_deployment(spark: Any, tmp_path: Path) -> None:
    """What Spark's UI 'kill' link and a Databricks notebook detach do: the jobs are cancelled, everything ends."""
    path = wordcount(tmp_path, "wccancel")
    topo = deploy(spark, str(path), workers=1, conf=FAST_DEPLOY)
    procs = processes(topo)
    spark.sparkContext.cancelJobGroup("spark-storm-wccancel")
    assert topo.wait_stopped(120), topo.status()
    assert topo.state == "stopped"
    wait_all_gone(procs, "after the job group was cancelled")
    (task,) = procs.supervisors.values()
    wait_until(lambda: not alive(task), what="Spark to kill the cancelled task's Python worker", timeout=60)
    topo.stop()  # a no-op now


def test_supervisor_tasks_end_when_the_drivers_lease_is_gone(spark: Any, tmp_path: Path) -> None:
    """The driver's Python gone while Spark's JVM lives on (a notebook's REPL): the tasks end by themselves."""
    path = wordcount(tmp_path, "wclease")
    topo = deploy(spark, str(path), workers=1, conf=FAST_DEPLOY)
    procs = processes(topo)
    zk_server = topo._zk_server
    # what the driver's death leaves: no monitor, no nimbus, no ZooKeeper session (its lease expires with it)
    topo._ending.set()
    assert topo._nimbus is not None
    assert topo._cluster is not None
    topo._nimbus.stop()
    topo._cluster.close()
    started = time.monotonic()
    try:
        wait_all_gone(Processes(None, {}, procs.workers), "the tasks without a lease", 120)
        wait_until(lambda: not topo._running_jobs(), what="the supervisor jobs to end", timeout=60, interval=0.2)
        assert all(job.outcome == "done" for job in topo._jobs.values()), [j.detail for j in topo._jobs.values()]
        print(f"lease gone -> tasks and workers ended: {time.monotonic() - started:.1f}s")
    finally:
        zk_server.stop()


# ------------------------------------------------------------------ bad input: one line, nothing left running
def test_zero_workers_is_refused(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^deploy\(workers=0\): give the number of worker processes, an integer >= 1$"
    ):
        deploy(spark, str(wordcount(tmp_path)), workers=0)


def test_more_workers_than_local_cores_is_refused(spark: Any, tmp_path: Path) -> None:
    msg = (
        r"^deploy\(workers=2\): Spark runs local\[2,4\] with 2 task slot\(s\); the 2 worker\(s\) and the stream's "
        r"tasks \(storm.spark.deploy.reserve.slots=1\) need 3: use local\[3\] or more, or ask for fewer workers$"
    )
    with pytest.raises(DeployError, match=msg):
        deploy(spark, str(wordcount(tmp_path, "wctoomany")), workers=2)
    assert not _cmdlines_with("wctoomany")


def test_an_unreachable_zookeeper_is_refused(spark: Any, tmp_path: Path) -> None:
    (port,) = free_ports(1)
    msg = (
        rf"^deploy\(zookeeper='127.0.0.1:{port}'\): no ZooKeeper answered at 127.0.0.1:{port} within 2s: give the "
        r"address of a running ZooKeeper that the driver and every executor reach \(host:port\[/chroot\]\), or "
        r"leave zookeeper unset to have deploy\(\) start one$"
    )
    conf = {"storm.zookeeper.connection.timeout": 2000}
    with pytest.raises(DeployError, match=msg):
        deploy(spark, str(wordcount(tmp_path, "wcnozk")), workers=1, zookeeper=f"127.0.0.1:{port}", conf=conf)
    assert not _cmdlines_with("wcnozk")


def test_a_topology_that_cannot_be_planned_is_refused(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump({"name": "huge", "components": [{"id": "in", "source": True, "tasks": 40000}]}))
    msg = (
        r"^deploy\(\): topology 'huge' cannot be planned on 1 worker\(s\): topology 'huge' has 40000 tasks; "
        r"task ids must fit 1..32766$"
    )
    with pytest.raises(ConfigError, match=msg):
        deploy(spark, str(path), workers=1)


def test_cpus_per_worker_needs_a_cluster_manager_with_stage_level_scheduling(spark: Any, tmp_path: Path) -> None:
    msg = (
        r"^deploy\(cpus_per_worker=2\): Spark's stage-level scheduling \(a task resource profile\) needs a standalone, "
        r"YARN or Kubernetes master; local\[2,4\] has none: leave cpus_per_worker unset \(each worker task takes "
        r"spark.task.cpus\)$"
    )
    with pytest.raises(DeployError, match=msg):
        deploy(spark, str(wordcount(tmp_path)), workers=1, cpus_per_worker=2)


def test_state_on_one_hosts_disk_is_refused_when_executors_span_hosts(tmp_path: Path) -> None:
    path = tmp_path / "ledger.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "ledger",
                "components": [
                    {"id": "in", "source": True, "fields": ["key", "n"]},
                    {"id": "ledger", "bolt": "tests.integration.bolts:LedgerBolt", "inputs": [{"from": "in"}]},
                ],
            }
        )
    )
    topology = load_topology(path)
    msg = (
        r"^deploy\(\): topology 'ledger' keeps state \(ledger\) in the embedded provider, on the disk of whichever "
        r"executor runs the task, and this application's executors are on 2 hosts \(10.0.0.1, 10.0.0.2\): a task "
        r"Spark moves to another host could not restore it. Use topology.state.provider: redis \(with "
        r"topology.state.provider.config: \{url: redis://host:6379/0\}\), or put topology.state.provider.config.dir "
        r"on storage every executor mounts and pass deploy\(..., shared_state=True\)$"
    )
    with pytest.raises(DeployError, match=msg):
        state_check(topology, {}, {"10.0.0.1", "10.0.0.2"})
    state_check(topology, {}, {"10.0.0.1"})  # one host: every task finds the files
    state_check(topology, {"topology.state.provider": "redis"}, {"10.0.0.1", "10.0.0.2"})
    state_check(topology, {}, {"10.0.0.1", "10.0.0.2"}, shared_state=True)
    with pytest.raises(DeployError, match="on hosts not known yet"):
        state_check(topology, {}, None)


def test_workers_that_never_run_time_out_and_leave_nothing(spark: Any, tmp_path: Path) -> None:
    """A worker that cannot start (its bolt fails in prepare) keeps deploy() from returning: it stops what it began."""
    path = tmp_path / "broken.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "wcbroken",
                "components": [
                    {
                        "id": "in",
                        "source": True,
                        "fields": ["key", "n"],
                        "bolt": "tests.integration.bolts:RecordingBolt",
                        # its journal cannot be opened: prepare raises, the worker exits, again and again
                        "conf": {"record.dir": str(tmp_path / "missing"), "record.journal": True},
                    }
                ],
            }
        )
    )
    msg = r"^deployment of wcbroken: not running after 40s: workers 127\.0\.0\.1:\d+ do not run assignment v1 yet$"
    with pytest.raises(DeployError, match=msg):
        deploy(spark, str(path), workers=1, conf=FAST_DEPLOY, timeout=40)
    wait_until(lambda: not _cmdlines_with("wcbroken"), what="wcbroken's processes to end", timeout=60, interval=0.2)
    assert not list(Path("/tmp").glob("spark-storm-zk-wcbroken-*")), "deploy()'s ZooKeeper directory is left"


# ------------------------------------------------------------------ deploy(from_savepoint=...)
def test_deploy_from_a_savepoint_starts_with_its_state_migrated(spark: Any, tmp_path: Path) -> None:
    from spark_storm.state.files import EmbeddedBackend
    from tests.support.ledger import Ledger, expected

    (tmp_path / "v1").mkdir()
    with Ledger(tmp_path / "v1") as run:
        for batch in range(2):
            run.feed(batch)
            run.commit(batch)
        taken = run.cluster.savepoint(tmp_path / "sp")
        answer = expected(run.batches)
        source = yaml.safe_load(run.topology.read_text())
    next(c for c in source["components"] if c["id"] == "ledger")["bolt"] = (
        "tests.integration.savepoint_bolts:LedgerBoltV2"
    )
    source["conf"]["topology.state.provider.config"] = {"dir": str(tmp_path / "v2-state")}
    v2 = tmp_path / "ledger-v2.yaml"
    v2.write_text(yaml.safe_dump(source))
    with deploy(spark, str(v2), workers=1, from_savepoint=taken["path"], conf=FAST_DEPLOY) as topo:
        the_plan = topo.plan()
        assert the_plan is not None
        backend = EmbeddedBackend("ledger", tmp_path / "v2-state")
        got: dict[str, Any] = {}
        for task in the_plan.component_tasks["ledger"]:
            got.update(backend.task_store(task).restore()[1])
        print(f"deployed from {taken['path']}: {len(got)} keys restored")
        assert got == {k: {"count": c, "sum": s} for k, (c, s) in answer.items()}


def test_deploy_from_a_savepoint_needs_a_topology_file_and_a_real_savepoint(spark: Any, tmp_path: Path) -> None:
    from spark_storm.errors import SavepointError

    with pytest.raises(ConfigError, match=r"^deploy\(from_savepoint=\.\.\.\) starts a topology from its file"):
        deploy(spark, "wordcount", workers=1, from_savepoint=str(tmp_path))
    with pytest.raises(SavepointError, match=r"^savepoint .*nothere does not exist; pass the directory"):
        deploy(spark, str(wordcount(tmp_path, "wcfromsp")), workers=1, from_savepoint=str(tmp_path / "nothere"))
    assert not _cmdlines_with("wcfromsp")
