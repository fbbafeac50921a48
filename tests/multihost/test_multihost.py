"""Three hosts (network namespaces), a supervisor on each, nimbus and ZooKeeper beside them, a Spark
stream into the topology at delivery=processed: a host cut off, a rebalance and a nimbus failover
mid-stream, and no event lost.

Each test prints what it measured (time from the cut to the stream flowing again, rows lost and
duplicated); ``pytest -s tests/multihost`` shows it.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.conftest import sets
from tests.integration.bolts import read_event_logs
from tests.multihost.conftest import CLUSTER_CONF, HOSTS, ROOT, SLOTS, Network, NsProcess, Probe
from tests.spark.conftest import write_json_rows

pytestmark = [pytest.mark.multihost, pytest.mark.cluster, pytest.mark.spark]

BOLT = "tests.integration.bolts:EventLogBolt"
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
        out = subprocess.run(
            [
                *("ip", "netns", "exec", self.network.ns["ctl"], sys.executable, "-m", "spark_storm.cli"),
                *args,
                *("--zookeeper", self.zk),
                *sets(CLUSTER_CONF),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

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
                {"id": "in", "source": True, "fields": ["key", "n"], "parallelism": 3, "bolt": BOLT},
                {"id": "out", "bolt": BOLT, "parallelism": 3, "inputs": [{"from": "in", "grouping": "shuffle"}]},
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

        wait_until(ready, what=f"{workers} workers of {name} running its newest assignment", timeout=timeout)
        assignment: dict[str, Any] = self.ask("assignment", name)
        return assignment

    def host_of(self, slot: str) -> str:
        address = slot.rpartition(":")[0]
        return next(h for h in HOSTS if self.network.addr[h] == address)

    def stream(self, name: str, files: int) -> NsProcess:
        src = self.tmp / "src"
        rows = [{"key": f"k{i % 23}", "n": i} for i in range(files * ROWS_PER_FILE)]
        write_json_rows(src, rows, files=files, prefix="f")
        args = ["--zookeeper", self.zk, "--topology", name, "--src", str(src)]
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


@pytest.fixture
def cluster(network: Network, zk_server: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(network, zk_server, tmp_path)
    try:
        yield c
    finally:
        c.close()


def wait_until(pred: Callable[[], object], *, what: str, timeout: float) -> None:
    """Poll ``pred`` every 0.2 s (each poll asks ZooKeeper or reads logs: not every 5 ms on 2 cores)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout}s waiting for {what}")
        time.sleep(0.2)


def _recovery(batches: list[dict[str, Any]], cut_at: float) -> tuple[float, float]:
    """(seconds from the cut until the stream flows again, the longest stall) from the micro-batches' end times.

    The stream stalls when the cut hits: the longest gap between consecutive micro-batch ends
    that closes after the cut; it flows again when that gap closes.
    """
    ends = sorted(b["end"] for b in batches if "batch" in b)
    gaps = [(b - a, b) for a, b in itertools.pairwise(ends) if b > cut_at]
    assert gaps, "no micro-batch completed after the cut"
    stall, resumed = max(gaps)
    return round(resumed - cut_at, 2), round(stall, 2)


def _report(name: str, figures: dict[str, Any]) -> None:
    print(f"\nMEASURED {name}: {json.dumps(figures)}")


def test_a_host_cut_off_mid_stream_is_replaced_and_no_event_is_lost(cluster: Cluster, network: Network) -> None:
    files = 40
    cluster.start()
    cluster.submit("cut", 3)
    v1 = cluster.running("cut", 3)
    assert {cluster.host_of(s) for s in v1["slots"]} == set(HOSTS)  # one worker per host
    cluster.stream("cut", files)
    cluster.wait_batches(8)
    victim = cluster.host_of(sorted(v1["slots"])[0])
    cut_at = time.time()
    network.cut(victim)
    v2 = cluster.running("cut", 3, timeout=120, newer_than=v1["version"])
    assert v2["version"] > v1["version"]
    assert victim not in {cluster.host_of(s) for s in v2["slots"]}
    done = cluster.finish()
    figures = cluster.events(files * ROWS_PER_FILE)
    flowing, stall = _recovery(cluster.batches(), cut_at)
    figures.update(
        reassigned_after_s=round(v2["time"] - cut_at, 2),
        flowing_again_after_s=flowing,
        longest_stall_s=stall,
        batches=done["batches"],
    )
    _report("host cut", figures)
    assert figures["lost"] == 0, figures


def test_a_rebalance_from_two_to_three_workers_mid_stream_loses_nothing(cluster: Cluster) -> None:
    files = 30
    cluster.start()
    cluster.submit("grow", 2)
    v1 = cluster.running("grow", 2)
    cluster.stream("grow", files)
    cluster.wait_batches(6)
    started = time.time()
    cluster.cli("rebalance", "grow", "--workers", "3")
    v2 = cluster.running("grow", 3, timeout=120, newer_than=v1["version"])
    assert v2["version"] > v1["version"]
    assert set(v1["slots"]) < set(v2["slots"])  # the two workers stay, a third joins
    done = cluster.finish()
    figures = cluster.events(files * ROWS_PER_FILE)
    _, stall = _recovery(cluster.batches(), started)
    figures.update(
        new_assignment_after_s=round(v2["time"] - started, 2), longest_stall_s=stall, batches=done["batches"]
    )
    _report("rebalance 2->3", figures)
    assert figures["lost"] == 0, figures


def test_the_leader_nimbus_killed_the_other_takes_over_and_still_handles_a_cut(
    cluster: Cluster, network: Network
) -> None:
    files = 40
    cluster.start(nimbuses=2)
    cluster.submit("failover", 3)
    v1 = cluster.running("failover", 3)
    cluster.stream("failover", files)
    cluster.wait_batches(5)
    leader = cluster.ask("leader")
    assert leader is not None
    old = next(n for n in cluster.nimbuses if leader.endswith(f":{n.pid}"))
    other = next(n for n in cluster.nimbuses if n is not old)
    killed_at = time.time()
    old.kill()
    wait_until(
        lambda: cluster.ask("leader") == leader.rpartition(":")[0] + f":{other.pid}",
        what="the other nimbus leading",
        timeout=60,
    )
    took_over = round(time.time() - killed_at, 2)
    other.wait_for("is the leader")
    cluster.wait_batches(8)
    victim = cluster.host_of(sorted(v1["slots"])[-1])
    cut_at = time.time()
    network.cut(victim)
    v2 = cluster.running("failover", 3, timeout=120, newer_than=v1["version"])
    assert v2["version"] > v1["version"]
    assert victim not in {cluster.host_of(s) for s in v2["slots"]}
    assert "assigned failover v" in other.output()  # the new leader made it
    done = cluster.finish()
    figures = cluster.events(files * ROWS_PER_FILE)
    flowing, stall = _recovery(cluster.batches(), cut_at)
    figures.update(
        nimbus_took_over_after_s=took_over,
        reassigned_after_s=round(v2["time"] - cut_at, 2),
        flowing_again_after_s=flowing,
        longest_stall_s=stall,
        batches=done["batches"],
    )
    _report("nimbus failover + host cut", figures)
    assert figures["lost"] == 0, figures
