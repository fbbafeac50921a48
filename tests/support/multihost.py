"""The multihost tier's helpers: network namespaces as hosts joined by a bridge (tests/multihost/conftest.py
describes the network, tests/support/netns.py makes it), processes in them, a ZooKeeper probe inside ``ctl``,
and one test's daemons on that network (:class:`Cluster`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.bolts import read_event_logs
from tests.support import ROOT, wait_until
from tests.support.cluster import sets
from tests.support.netns import HOSTS, Network
from tests.support.spark import write_json_rows

SLOTS = (6700, 6701)
#: How often waits poll here: each poll asks ZooKeeper (through the probe) or reads logs, not every 5 ms on 2 cores.
POLL = 0.2

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


def ns_cli(network: Network, host: str, *args: str) -> str:
    """Run ``spark-storm ARGS`` in ``host``'s namespace; return its stdout (it must succeed)."""
    out = subprocess.run(
        [*("ip", "netns", "exec", network.ns[host], sys.executable, "-m", "spark_storm.cli"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


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


EVENT_LOG_BOLT = "tests.integration.bolts:EventLogBolt"
ROWS_PER_FILE = 100


class Cluster:
    """One test's daemons on the module's network, under a ZooKeeper chroot of its own."""

    def __init__(self, network: Network, zk_server: str, tmp: Path) -> None:
        self.network = network
        self.tmp = tmp
        self.zk = f"{zk_server}/t{uuid.uuid4().hex[:10]}"
        self.records = tmp / "records"
        self.records.mkdir()
        self.processes: list[NsProcess] = []
        self.nimbuses: list[NsProcess] = []
        self.probe: Probe | None = None
        self.job: NsProcess | None = None

    def start(self, nimbuses: int = 1) -> Cluster:
        for i in range(nimbuses):
            self.nimbuses.append(self._daemon("ctl", f"nimbus-{i}", "nimbus", "--zookeeper", self.zk))
        for host in HOSTS:
            args = ["supervisor", "--zookeeper", self.zk, "--host", self.network.addr[host], "--id", host]
            args += ["--slots", ",".join(map(str, SLOTS)), "--local-dir", str(self.tmp / f"local-{host}")]
            self._daemon(host, f"supervisor-{host}", *args)
        for proc in self.processes:
            proc.wait_for("offering" if "supervisor" in proc.args else "contending")
        self.probe = Probe(self.network, self.zk, self.tmp / "probe.log")
        return self

    def _daemon(self, host: str, name: str, *args: str) -> NsProcess:
        proc = NsProcess(
            self.network,
            host,
            self.tmp / f"{name}.log",
            "spark_storm.cli",
            "--log-level",
            "INFO",
            *args,
            *sets(CLUSTER_CONF),
        )
        self.processes.append(proc)
        return proc

    def cli(self, *args: str) -> str:
        return ns_cli(self.network, "ctl", *args, "--zookeeper", self.zk, *sets(CLUSTER_CONF))

    def ask(self, op: str, *args: Any) -> Any:
        assert self.probe is not None
        return self.probe.ask(op, *args)

    def submit(self, name: str, workers: int) -> None:
        topo = {
            "name": name,
            "conf": {
                "record.dir": str(self.records),
                # a replayed group whose first delivery went through a lost worker is delivered again after this
                "storm.messaging.server.ledger.redeliver.after.ms": 3000,
            },
            "components": [
                {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": 3, "bolt": EVENT_LOG_BOLT},
                {
                    "id": "out",
                    "bolt": EVENT_LOG_BOLT,
                    "parallelism": 3,
                    "inputs": [{"from": "in", "grouping": "shuffle"}],
                },
            ],
        }
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(topo))
        self.cli("submit", str(path), "--workers", str(workers))

    def running(self, name: str, workers: int, timeout: float = 90.0, newer_than: int = 0) -> dict[str, Any]:
        """Wait until ``workers`` workers run the newest assignment, past version ``newer_than``; return it."""

        def ready() -> bool:
            a = self.ask("assignment", name)
            if a is None or len(a["slots"]) != workers or a["version"] <= newer_than:
                return False
            hbs = self.ask("heartbeats", name)
            return set(hbs) == set(a["slots"]) and all(
                hb.get("status") == "running" and hb.get("assignment_version") == a["version"] for hb in hbs.values()
            )

        wait_until(
            ready, what=f"{workers} workers of {name} running its newest assignment", timeout=timeout, interval=POLL
        )
        assignment: dict[str, Any] = self.ask("assignment", name)
        return assignment

    def host_of(self, slot: str) -> str:
        address = slot.rpartition(":")[0]
        return next(h for h in HOSTS if self.network.addr[h] == address)

    def stream(self, name: str, files: int, seconds: int | None = None) -> NsProcess:
        """Start the Spark job (``stream_job``) over ``files`` files of ``ROWS_PER_FILE`` rows each into ``name``.

        ``seconds``: the job's own deadline, when it should be longer than its default.
        """
        src = self.tmp / "src"
        rows = [{"key": f"k{i % 23}", "n": i} for i in range(files * ROWS_PER_FILE)]
        write_json_rows(src, rows, files=files, prefix="f")
        args = ["--zookeeper", self.zk, "--topology", name, "--src", str(src)]
        if seconds is not None:
            args += ["--seconds", str(seconds)]
        args += ["--checkpoint", str(self.tmp / "ck"), "--expect", str(len(rows))]
        self.job = NsProcess(self.network, "ctl", self.tmp / "job.log", "tests.multihost.stream_job", *args)
        self.processes.append(self.job)
        return self.job

    def batches(self) -> list[dict[str, Any]]:
        assert self.job is not None
        out = []
        for line in self.job.output().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def wait_batches(self, n: int, timeout: float = 120.0) -> None:
        wait_until(
            lambda: sum(1 for b in self.batches() if "batch" in b) >= n or self._job_ended(),
            what=f"{n} micro-batches",
            timeout=timeout,
            interval=POLL,
        )
        assert not self._job_ended(), self.job_tail()

    def _job_ended(self) -> bool:
        return self.job is not None and self.job.proc.poll() is not None

    def job_tail(self) -> str:
        return self.job.output()[-4000:] if self.job else ""

    def finish(self, timeout: float = 240.0) -> dict[str, Any]:
        """Wait for the stream to go through every row; the query must not have failed."""
        assert self.job is not None
        try:
            code = self.job.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the stream did not finish within {timeout}s:\n{self.job_tail()}")
        last = self.batches()[-1]
        assert code == 0, self.job_tail()
        assert last.get("done"), self.job_tail()
        return last

    def events(self, total: int) -> dict[str, Any]:
        seen = read_event_logs(self.records, "out")
        lost = sorted(set(range(total)) - set(seen))
        return {"rows": total, "lost": len(lost), "first_lost": lost[:10], "duplicated": sum(seen.values()) - len(seen)}

    def close(self) -> None:
        for host in self.network.names:
            self.network.restore(host)
        if self.probe is not None:
            self.probe.close()
        for proc in reversed(self.processes):
            proc.stop(60)


def recovery(batches: list[dict[str, Any]], cut_at: float) -> tuple[float, float]:
    """(seconds from the cut until the stream flows again, the longest stall) from the micro-batches' end times.

    The stream stalls when the cut hits: the longest gap between consecutive micro-batch ends
    that closes after the cut; it flows again when that gap closes.
    """
    ends = sorted(b["end"] for b in batches if "batch" in b)
    gaps = [(b - a, b) for a, b in itertools.pairwise(ends) if b > cut_at]
    assert gaps, "no micro-batch completed after the cut"
    stall, resumed = max(gaps)
    return round(resumed - cut_at, 2), round(stall, 2)


def report(name: str, figures: dict[str, Any]) -> None:
    """Print what a test measured (``pytest -s`` shows it)."""
    print(f"\nMEASURED {name}: {json.dumps(figures)}")
