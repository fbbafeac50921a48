"""The cluster tier's helpers: nimbus and supervisor daemons as real processes, heartbeats, the CLI, the UI's REST API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import pytest
from kazoo.client import KazooClient

from spark_storm.cluster.records import HeartbeatZnode
from spark_storm.cluster.state import ClusterState
from spark_storm.reports import WorkerHeartbeat, WorkerMetrics, read_worker_metrics
from spark_storm.topology import Slot
from tests.support import ROOT, wait_until

#: Short timeouts so failures are noticed in seconds (the defaults are Storm's).
FAST: dict[str, Any] = {
    "storm.zookeeper.session.timeout": 2000,
    "storm.zookeeper.connection.timeout": 5000,
    "storm.zookeeper.retry.times": 3,
    "storm.zookeeper.retry.interval": 100,
    "storm.zookeeper.retry.intervalceiling.millis": 500,
    "nimbus.task.timeout.secs": 4,
    "nimbus.task.launch.secs": 30,
    "nimbus.monitor.freq.secs": 1,
    "supervisor.monitor.frequency.secs": 1,
    "supervisor.worker.shutdown.sleep.secs": 20,
    "topology.message.timeout.secs": 1,  # also `kill`'s default wait; tuple trees need >= 1
    "topology.worker.shutdown.timeout.ms": 10000,
}


def sets(conf: dict[str, Any]) -> list[str]:
    """``conf`` as ``--set key=<json>`` arguments of the CLI."""
    out = []
    for key, value in conf.items():
        out += ["--set", f"{key}={json.dumps(value)}"]
    return out


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its parent counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_storm.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


class Daemon:
    """A ``spark-storm nimbus|supervisor`` process with its output in a log file."""

    def __init__(self, log: Path, args: list[str]) -> None:
        self.log = log
        self.args = args
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "spark_storm.cli", "--log-level", "INFO", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.proc.poll() is not None:
                pytest.fail(
                    f"{self.args[0]} exited with {self.proc.returncode} before {text!r}:\n{self.output()[-3000:]}"
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"gave up after {timeout}s waiting for {text!r} from {self.args[0]}:\n{self.output()[-3000:]}"
                )
            time.sleep(0.05)

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def stop(self, timeout: float = 60.0) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            pytest.fail(f"{self.args[0]} ignored SIGTERM for {timeout}s:\n{self.output()[-3000:]}")


class Daemons:
    """Start nimbus and supervisor processes for one test; all stopped (by PID) at its end."""

    def __init__(self, tmp: Path, zk: str) -> None:
        self.tmp = tmp
        self.zk = zk
        self.started: list[Daemon] = []
        self.worker_pids: set[int] = set()

    def track(self, pids: Iterable[int]) -> None:
        """Remember worker pids: any still alive when the test ends is killed (a failed test leaves none)."""
        self.worker_pids.update(pids)

    def nimbus(self, **conf: Any) -> Daemon:
        log = self.tmp / f"nimbus-{len(self.started)}.log"
        daemon = Daemon(log, ["nimbus", "--zookeeper", self.zk, *sets({**FAST, **conf})])
        self.started.append(daemon)
        return daemon

    def supervisor(self, slots: list[int], host: str = "127.0.0.1", sid: str | None = None, **conf: Any) -> Daemon:
        sid = sid or f"sup{len(self.started)}"
        args = ["supervisor", "--zookeeper", self.zk, "--host", host, "--slots", ",".join(map(str, slots))]
        args += ["--id", sid, "--local-dir", str(self.tmp / "local"), *sets({**FAST, **conf})]
        daemon = Daemon(self.tmp / f"supervisor-{sid}.log", args)
        self.started.append(daemon)
        return daemon

    def close(self) -> None:
        for daemon in self.started:
            if daemon.proc.poll() is None:
                daemon.signal(signal.SIGTERM)
        for daemon in self.started:
            try:
                daemon.proc.wait(60)
            except subprocess.TimeoutExpired:
                daemon.proc.kill()
                daemon.proc.wait(10)
        for pid in self.worker_pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def wait_gone(pids: list[int], what: str, timeout: float = 30.0) -> None:
    wait_until(lambda: not any(alive(p) for p in pids), what=what, timeout=timeout)


def worker_pids(state: ClusterState, topology: str) -> dict[str, int]:
    return {str(slot): hb.record["pid"] for slot, hb in state.read_heartbeats(topology).items()}


def heartbeat_record(topology: str, slot: Slot, **changes: Any) -> WorkerHeartbeat:
    """A worker's heartbeat record, as ``Worker.heartbeat_record()`` builds it, with ``changes``."""
    record: WorkerHeartbeat = {
        "topology": topology,
        "worker": str(slot),
        "pid": 1,
        "status": "running",
        "time": time.time(),
        "uptime_s": 1.0,
        "executors": [],
        "received": 0,
        "metrics_port": None,
        "metrics_host": None,
    }
    return cast(WorkerHeartbeat, {**record, **changes})


def send_heartbeat(state: ClusterState, topology: str, slot: Slot, **changes: Any) -> HeartbeatZnode:
    """Write a heartbeat through the workers' own writer (``send_heartbeat``); return it once it is in ZooKeeper."""
    record = heartbeat_record(topology, slot, **changes)
    assert state.send_heartbeat(topology, slot, record)

    def landed() -> HeartbeatZnode | None:
        got = state.read_heartbeats(topology).get(slot)
        return got if got is not None and got.record == record else None

    wait_until(lambda: landed() is not None, what=f"the heartbeat of {topology}/{slot} in ZooKeeper")
    got = landed()
    assert got is not None
    return got


def running_workers(daemons: Daemons, state: ClusterState, topology: str, slots: int) -> dict[str, int]:
    """Wait until ``slots`` workers of ``topology`` heartbeat "running" into ZooKeeper; their pids."""

    def ready() -> bool:
        hbs = state.read_heartbeats(topology)
        a = state.read_assignment(topology)
        return (
            a is not None
            and len(hbs) == slots
            and set(hbs) == set(a.slots)
            and all(hb.record["status"] == "running" and alive(hb.record["pid"]) for hb in hbs.values())
        )

    wait_until(ready, what=f"{slots} running workers of {topology}", timeout=90)
    pids = worker_pids(state, topology)
    daemons.track(pids.values())
    return pids


def submit(zk: str, path: Path, workers: int) -> None:
    out = cli("submit", str(path), "--workers", str(workers), "--zookeeper", zk, *sets(FAST))
    assert out.returncode == 0, out.stderr


def health(state: ClusterState, topology: str, slot: Slot) -> WorkerMetrics:
    port = state.read_heartbeats(topology)[slot].record["metrics_port"]
    assert port is not None, f"worker {slot} serves no /health"
    return read_worker_metrics("127.0.0.1", port, 10)


def checkpoints(state: ClusterState, topology: str) -> dict[str, dict[str, Any]]:
    """Each worker's checkpoint view (``checkpoint`` in its /health; empty while it cannot answer)."""
    out = {}
    for slot in state.read_heartbeats(topology):
        try:
            out[str(slot)] = dict(health(state, topology, slot).get("checkpoint") or {})
        except (OSError, KeyError, AssertionError):
            out[str(slot)] = {}
    return out


def ports(n: int) -> list[int]:
    from spark_storm.netutil import free_ports

    return free_ports(n)


def expire_session(state: ClusterState, hosts: str) -> None:
    """Expire ``state``'s session the way ZooKeeper does: another client takes it over and closes it."""
    handle = state.session.session_handle()
    assert handle is not None
    session_id, password = handle
    thief = KazooClient(hosts=hosts, client_id=(session_id, password))
    thief.start(timeout=10)
    thief.stop()
    thief.close()


#: The UI reads the cluster four times a second here (so the test waits less).
UI_FAST = {**FAST, "ui.sample.interval.ms": 250}


class Api:
    """A plain HTTP client for one UI's /api/v1/."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.base}/api/v1/{path}", timeout=10) as r:
            return json.loads(r.read())

    def post(self, path: str, body: Any = None) -> tuple[int, Any]:
        data = b"" if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base}/api/v1/{path}", data=data, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def components(self, topology: str) -> dict[str, dict[str, Any]]:
        topo = self.get(f"topology/{topology}")
        return {c["componentId"]: c for c in topo["spouts"] + topo["bolts"]}

    def topology_row(self, topology: str) -> dict[str, Any] | None:
        rows = [t for t in self.get("topology/summary")["topologies"] if t["id"] == topology]
        return rows[0] if rows else None

    def status(self, topology: str) -> str:
        row = self.topology_row(topology)
        assert row is not None, f"{topology} is not listed"
        return str(row["status"])


def nimbus_with_ui(daemons: Daemons) -> tuple[Daemon, Api]:
    """Start a nimbus serving the UI on a free port (``--ui-port 0``); the daemon and a client of its UI."""
    n = len(daemons.started)
    daemon = Daemon(
        daemons.tmp / f"nimbus-ui-{n}.log", ["nimbus", "--zookeeper", daemons.zk, "--ui-port", "0", *sets(UI_FAST)]
    )
    daemons.started.append(daemon)
    daemon.wait_for(": UI on http://")
    line = next(x for x in daemon.output().splitlines() if x.startswith("nimbus ") and ": UI on http://" in x)
    return daemon, Api(line.split(": UI on ")[1].split()[0])
