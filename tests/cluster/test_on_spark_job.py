"""jobs/storm_on_spark.py: SIGTERM to the spark-submit job stops everything, ``spark-storm kill`` from outside ends
the job, and a SIGKILLed driver leaves nothing running (every process checked by PID)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spark_storm.cluster.hosted import parse_supervisor_id
from spark_storm.cluster.state import ClusterState
from tests.support import ROOT, wait_until
from tests.support.cluster import alive, cli
from tests.support.on_spark import FAST_DEPLOY, Processes, read_until, wait_all_gone

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(900)]


def _topology(tmp: Path, name: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n"
        "components:\n"
        "  - {id: sentences, source: true, fields: [sentence]}\n"
        "  - id: split\n"
        "    bolt: spark_storm.examples.wordcount:SplitBolt\n"
        "    fields: [word]\n"
        "    inputs: [{from: sentences, grouping: shuffle}]\n"
    )
    return path


def _job(path: Path, *, submit: bool) -> subprocess.Popen[str]:
    """The job under spark-submit (local[2,4]) or as a plain ``python`` run (local[*]), in a session of its own."""
    sets = [arg for key, value in FAST_DEPLOY.items() for arg in ("--set", f"{key}={json.dumps(value)}")]
    args = [str(ROOT / "jobs" / "storm_on_spark.py"), "--topology", str(path), "--workers", "1", *sets]
    if submit:
        spark_submit = Path(sys.executable).parent / "spark-submit"
        command = [str(spark_submit), "--master", "local[2,4]", "--conf", "spark.ui.enabled=false", *args]
    else:
        command = [sys.executable, *args]
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        start_new_session=True,
    )


def _deployed(job: subprocess.Popen[str], name: str) -> tuple[str, Processes]:
    """Wait for the job's ``deployed`` line; its ZooKeeper and the processes the deployment runs."""
    line, _ = read_until(job, "deployed ")
    zookeeper = line.split("zookeeper=")[1].split()[0]
    with ClusterState(zookeeper, FAST_DEPLOY) as state:
        supervisors = {
            sid: info.pid for sid, info in state.supervisors().items() if parse_supervisor_id(sid, name) is not None
        }
        workers = {str(slot): int(hb.record["pid"]) for slot, hb in state.read_heartbeats(name).items()}
    servers = [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and f"spark-storm-zk-{name}-".encode() in _cmdline(p)
    ]
    assert servers, f"no ZooKeeper server of {name} runs"
    return zookeeper, Processes(min(servers), supervisors, workers)


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def _rest(job: subprocess.Popen[str], timeout: float = 180) -> str:
    out, _ = job.communicate(timeout=timeout)
    return out


def test_sigterm_to_the_spark_submit_job_stops_everything(tmp_path: Path) -> None:
    name = "jobterm"
    job = _job(_topology(tmp_path, name), submit=True)
    try:
        _, procs = _deployed(job, name)
        os.killpg(job.pid, signal.SIGTERM)  # what Ctrl-C, a scheduler or a container stop sends the job's group
        out = _rest(job)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate(timeout=30)
    wait_all_gone(procs, "after SIGTERM to the job")
    (task,) = procs.supervisors.values()
    wait_until(lambda: not alive(task), what="the supervisor task's Python worker", timeout=60)
    assert f"stopping {name}: SIGTERM" in out, out[-3000:]


def test_spark_storm_kill_from_outside_ends_the_job(tmp_path: Path) -> None:
    name = "jobkill"
    job = _job(_topology(tmp_path, name), submit=True)
    try:
        zookeeper, procs = _deployed(job, name)
        killed = cli("kill", name, "--wait", "0", "--zookeeper", zookeeper)
        assert killed.returncode == 0, killed.stderr
        out = _rest(job)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate(timeout=30)
    assert job.returncode == 0, out[-3000:]
    assert f"stopping {name}: the deployment ended" in out, out[-3000:]
    assert f"stopped {name} (stopped)" in out, out[-3000:]
    wait_all_gone(procs, "after spark-storm kill")


def test_a_sigkilled_driver_leaves_nothing_running(tmp_path: Path) -> None:
    name = "jobsigkill"
    job = _job(_topology(tmp_path, name), submit=False)
    try:
        _, procs = _deployed(job, name)
        os.kill(job.pid, signal.SIGKILL)  # the driver only: its JVM, ZooKeeper and tasks must follow
        _rest(job, 60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
        if job.stdout is not None:
            job.stdout.close()
    wait_all_gone(procs, "after the driver was SIGKILLed", timeout=120)
    (task,) = procs.supervisors.values()
    wait_until(lambda: not alive(task), what="the supervisor task's Python worker", timeout=60)
    assert not list(Path("/tmp").glob(f"spark-storm-zk-{name}-*")), "the ZooKeeper directory is left"
