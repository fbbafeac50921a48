"""Several hosts on one machine: network namespaces joined by a bridge, each running its daemons.

The module's network: a switch namespace holding a bridge, and one namespace per host
(``ctl`` for ZooKeeper, nimbus and the Spark driver; ``h1``..``h3`` for supervisors and
their workers), each with a veth pair into the bridge and an address of a private /24
chosen at random.  Nothing touches the root namespace's interfaces, so all traffic stays
inside these namespaces.  A host's link is cut by taking its bridge port down (both
directions drop, no reset: a real partition).  Every namespace is deleted afterwards,
after every process started in it was stopped by PID.  Where namespaces cannot be made
(no CAP_SYS_ADMIN / CAP_NET_ADMIN, no ``ip``), the tests skip saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import sets

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ("h1", "h2", "h3")
SLOTS = (6700, 6701)

#: Timeouts short enough to see a failure handled in seconds (Storm's defaults are minutes).
CLUSTER_CONF: dict[str, Any] = {
    "storm.zookeeper.session.timeout": 4000,
    "storm.zookeeper.connection.timeout": 15000,
    "storm.zookeeper.retry.times": 3,
    "storm.zookeeper.retry.interval": 200,
    "storm.zookeeper.retry.intervalceiling.millis": 1000,
    "nimbus.task.timeout.secs": 10,
    "nimbus.task.launch.secs": 60,
    "nimbus.monitor.freq.secs": 1,
    "supervisor.monitor.frequency.secs": 1,
    "supervisor.worker.shutdown.sleep.secs": 15,
    "topology.message.timeout.secs": 5,  # trees not acked by then fail (the writer retries at once)
    "topology.worker.shutdown.timeout.ms": 8000,
    "topology.worker.connections.ready.timeout.ms": 5000,
    "storm.messaging.tcp.flush.timeout.ms": 2000,
    "storm.messaging.tcp.min_wait_ms": 20,
    "storm.messaging.tcp.max_wait_ms": 500,
}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class Network:
    """The namespaces, the bridge and each host's address; :meth:`cut` / :meth:`restore` a host's link."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.prefix = f"sst{tag}"
        net = f"10.{random.randint(64, 250)}.{random.randint(1, 250)}"
        self.switch = f"{self.prefix}-sw"
        self.names = ("ctl", *HOSTS)
        self.ns = {name: f"{self.prefix}-{name}" for name in self.names}
        self.addr = {name: f"{net}.{i + 1}" for i, name in enumerate(self.names)}
        self.port = {name: f"p{tag}{i}" for i, name in enumerate(self.names)}  # bridge-side veth (<= 15 chars)
        self.created: list[str] = []

    def create(self) -> None:
        _ip("netns", "add", self.switch)
        self.created.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for name in self.names:
            ns = self.ns[name]
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("-n", self.switch, "link", "add", self.port[name], "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.switch, "link", "set", self.port[name], "master", "br0")
            _ip("-n", self.switch, "link", "set", self.port[name], "up")
            _ip("-n", ns, "addr", "add", f"{self.addr[name]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def cut(self, name: str) -> None:
        """Take ``name``'s bridge port down: nothing goes in or out of that host any more."""
        _ip("-n", self.switch, "link", "set", self.port[name], "down")

    def restore(self, name: str) -> None:
        _ip("-n", self.switch, "link", "set", self.port[name], "up")

    def pids(self) -> list[int]:
        """Every process still running in one of our namespaces (all started by this test module)."""
        out: list[int] = []
        for ns in self.created:
            got = _ip("netns", "pids", ns, check=False)
            out += [int(p) for p in got.stdout.split() if p.strip().isdigit()]
        return out

    def delete(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for ns in reversed(self.created):
            _ip("netns", "del", ns, check=False)
        self.created.clear()


class NsProcess:
    """A ``python -m ...`` process inside a namespace, output to a log file; stopped by PID."""

    def __init__(self, network: Network, host: str, log: Path, module: str, *args: str, stdin: bool = False) -> None:
        self.host = host
        self.log = log
        self.args = args
        command = ["ip", "netns", "exec", network.ns[host], sys.executable, "-m", module, *args]
        with log.open("wb") as out:
            # `ip netns exec` execs the command: the pid is the python process's own.
            self.proc = subprocess.Popen(
                command,
                stdout=out if not stdin else subprocess.PIPE,
                stderr=out,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                cwd=ROOT,
                text=stdin,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.proc.poll() is not None:
                pytest.fail(f"{self.args[:2]} on {self.host} exited ({self.proc.returncode}):\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(
                    f"gave up after {timeout}s waiting for {text!r} from {self.args[:2]}:\n{self.output()[-3000:]}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Probe:
    """Reads the cluster state from inside ``ctl`` (the test process is outside every namespace)."""

    def __init__(self, network: Network, zk: str, log: Path) -> None:
        self.process = NsProcess(network, "ctl", log, "tests.multihost.probe", zk, *sets(CLUSTER_CONF), stdin=True)
        assert self.ask("ping") == "pong", self.process.output()

    def ask(self, op: str, *args: Any) -> Any:
        proc = self.process.proc
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(json.dumps([op, *args]) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"the ZooKeeper probe exited:\n{self.process.output()[-3000:]}")
        reply = json.loads(line)
        if "error" in reply:
            pytest.fail(f"probe {op}{args}: {reply['error']}")
        return reply["ok"]

    def close(self) -> None:
        proc = self.process.proc
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        self.process.stop(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _namespaces_work() -> str | None:
    """Return why namespaces cannot be used here, or None when they can."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to create network namespaces"
    name = f"sstprobe{uuid.uuid4().hex[:6]}"
    got = _ip("netns", "add", name, check=False)
    if got.returncode != 0:
        return f"cannot create a network namespace (`ip netns add` says: {got.stderr.strip()}); needs root or CAP_SYS_ADMIN"
    _ip("netns", "del", name, check=False)
    return None


@pytest.fixture(scope="module")
def network(zookeeper_jars: Path) -> Iterator[Network]:
    why = _namespaces_work()
    if why:
        pytest.skip(why)
    net = Network()
    try:
        net.create()
        yield net
    finally:
        net.delete()


@pytest.fixture(scope="module")
def zk_server(network: Network, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """ZooKeeper in ``ctl`` on its network address (every host reaches it); yields ``addr:2181``."""
    from spark_storm.tools.zookeeper_server import ZooKeeperServer

    directory = tmp_path_factory.mktemp("zookeeper-ns")
    out = subprocess.run(
        [
            *("ip", "netns", "exec", network.ns["ctl"], sys.executable, "-m", "spark_storm.cli"),
            *("zookeeper", "start", "--dir", str(directory), "--port", "2181", "--host", network.addr["ctl"]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        yield f"{network.addr['ctl']}:2181"
    finally:
        ZooKeeperServer(directory).stop()
