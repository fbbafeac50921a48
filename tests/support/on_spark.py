"""Helpers of the tests of topologies hosted by Spark (``spark_storm.spark.deploy``): the processes a deployment
started, found by PID, and the counts of what its workers accepted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_storm.cluster.hosted import parse_supervisor_id
from spark_storm.cluster.state import ClusterState
from spark_storm.spark.deployment import Deployment
from tests.support import ROOT, wait_until
from tests.support.cluster import alive, health

#: Short timeouts so that losses are noticed in seconds (the defaults are Storm's).
FAST_DEPLOY: dict[str, Any] = {
    "storm.zookeeper.session.timeout": 4000,
    "storm.zookeeper.connection.timeout": 5000,
    "storm.zookeeper.retry.times": 3,
    "storm.zookeeper.retry.interval": 100,
    "storm.zookeeper.retry.intervalceiling.millis": 500,
    "nimbus.monitor.freq.secs": 1,
    "nimbus.task.timeout.secs": 10,
    "supervisor.monitor.frequency.secs": 1,
    "supervisor.worker.shutdown.sleep.secs": 20,
    "topology.worker.shutdown.timeout.ms": 10000,
    "storm.spark.deploy.driver.timeout.secs": 5,
    "storm.spark.deploy.monitor.ms": 200,
    "storm.spark.deploy.timeout.secs": 240,
}


@dataclass(frozen=True)
class Processes:
    """What a deployment runs, by PID: its ZooKeeper server (None: the user's), supervisor tasks and workers.

    A supervisor task runs in one of Spark's Python workers: when the task ends by itself that
    process stays, idle, for Spark to reuse (Spark ends idle ones after a minute); when Spark
    kills the task it goes.  So :meth:`all` counts the server and the workers, and a test that
    expects the task's process killed checks :attr:`supervisors` itself.
    """

    zookeeper: int | None
    supervisors: dict[str, int]
    workers: dict[str, int]

    def all(self) -> list[int]:
        return [p for p in [self.zookeeper, *self.workers.values()] if p is not None]

    def to_json(self) -> str:
        return json.dumps({"zookeeper": self.zookeeper, "supervisors": self.supervisors, "workers": self.workers})

    @classmethod
    def from_json(cls, text: str) -> Processes:
        raw = json.loads(text)
        return cls(raw["zookeeper"], raw["supervisors"], raw["workers"])


def processes(topo: Deployment) -> Processes:
    """The PIDs of what ``topo`` runs now (read from ZooKeeper: supervisor and worker records)."""
    with ClusterState(topo.zookeeper, topo.settings) as state:
        supervisors = {
            sid: info.pid
            for sid, info in state.supervisors().items()
            if parse_supervisor_id(sid, topo.name) is not None
        }
        workers = {str(slot): int(hb.record["pid"]) for slot, hb in state.read_heartbeats(topo.name).items()}
    server = topo._zk_server.pid() if topo._zk_server is not None else None
    return Processes(server, supervisors, workers)


def wait_all_gone(procs: Processes, what: str, timeout: float = 90.0) -> None:
    """Wait until none of ``procs`` runs (a zombie waiting for its parent counts as gone)."""
    wait_until(
        lambda: not [p for p in procs.all() if alive(p)],
        what=f"{what}: processes {[p for p in procs.all() if alive(p)]} of {procs.to_json()} to end",
        timeout=timeout,
        interval=0.2,
    )


def accepted(topo: Deployment) -> int:
    """Rows the workers' source tasks accepted from Spark so far (every worker's /health)."""
    with ClusterState(topo.zookeeper, topo.settings) as state:
        return sum(
            int(health(state, topo.name, slot)["counters"]["source_tuples_in"])
            for slot in state.read_heartbeats(topo.name)
        )


def kill(pid: int) -> None:
    """SIGKILL ``pid`` (gone already is fine)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def executor_of(pid: int) -> int:
    """The Spark executor JVM that ``pid`` descends from (its nearest ``java`` ancestor)."""
    current = pid
    while current > 1:
        stat = Path(f"/proc/{current}/stat").read_text()
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        comm = Path(f"/proc/{parent}/comm").read_text().strip()
        if comm == "java":
            return parent
        current = parent
    msg = f"process {pid} does not descend from a java process"
    raise AssertionError(msg)


def run_driver(script: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start a driver script (a separate Python process) whose stdout the test reads line by line."""
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})},
    )


def read_until(proc: subprocess.Popen[str], prefix: str, timeout: float = 300.0) -> tuple[str, str]:
    """Read ``proc``'s output until a line starting with ``prefix``; that line's rest, and all output so far."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if line.startswith(prefix):
            return line[len(prefix) :].strip(), "".join(seen)
    msg = f"no line {prefix!r} from the driver (exit {proc.poll()}):\n{''.join(seen)[-4000:]}"
    raise AssertionError(msg)
