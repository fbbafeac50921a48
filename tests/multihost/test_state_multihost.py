"""Exact state across hosts: a keyed ledger with Redis state, one host cut off mid-stream.

Three hosts (network namespaces) run a worker each; Redis runs in ``ctl`` beside ZooKeeper
and nimbus, where every host reaches it.  A Spark stream (``stream_job``) feeds the
ledger through ZooKeeper at delivery=processed; the host running a source task and a
stateful executor is cut off, nimbus reassigns its executors to the other hosts, and the
moved tasks restore their state and replay their input logs from Redis.  The worker on the
cut host runs on meanwhile (a zombie, with the default interval checkpoints on); the cut
then heals while the stream still runs, and the zombie must learn it was replaced and stop
without touching the state.  Every key's committed [count, sum] must equal the answer
computed from the files; the test prints the rollbacks and replays it took (``pytest -s``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_storm.topology import plan
from spark_storm.topology.loader import load_topology
from tests.support import wait_until
from tests.support.cluster import alive
from tests.support.ledger import ledger_topology
from tests.support.multihost import POLL, ROWS_PER_FILE, Cluster, recovery, report
from tests.support.netns import Network

pytestmark = [pytest.mark.multihost, pytest.mark.cluster, pytest.mark.spark, pytest.mark.timeout(900)]

REDIS_PORT = 6379


@pytest.fixture(scope="module")
def redis_url(network: Network, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Redis in ``ctl`` on its network address (every host reaches it), started by the project's tool."""
    from spark_storm.tools.redis_server import RedisServer

    directory = tmp_path_factory.mktemp("redis-ns")
    code = (
        "import sys; from spark_storm.tools.redis_server import RedisServer; "
        "print(RedisServer(sys.argv[1]).start(host=sys.argv[2], port=int(sys.argv[3])))"
    )
    command = ["ip", "netns", "exec", network.ns["ctl"], sys.executable, "-c", code]
    out = subprocess.run(
        [*command, str(directory), network.addr["ctl"], str(REDIS_PORT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    server = RedisServer(directory)
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        yield f"redis://{network.addr['ctl']}:{REDIS_PORT}/0"
    finally:
        server.stop()  # by the PID it recorded


def test_a_host_cut_off_mid_stream_keeps_the_redis_ledger_exact(
    cluster: Cluster, network: Network, redis_url: str, tmp_path: Path
) -> None:
    files = 30
    name = "cutledger"
    path = ledger_topology(
        tmp_path,
        name=name,
        sources=3,
        conf={
            "topology.state.provider": "redis",
            "topology.state.provider.config": {"url": redis_url},
            "topology.worker.metrics.host": "0.0.0.0",  # the probe in ctl reads each worker's /health
            "storm.messaging.server.ledger.redeliver.after.ms": 3000,
            "topology.state.checkpoint.interval.ms": 1000,  # the default: the zombie's interval rounds too
        },
    )
    cluster.start()
    cluster.cli("submit", str(path), "--workers", "3")
    v1 = cluster.running(name, 3)
    assert {cluster.host_of(s) for s in v1["slots"]} == {"h1", "h2", "h3"}  # one worker per host
    cluster.stream(name, files, seconds=480)  # a cut, a reassignment and rollbacks on 2 cores
    cluster.wait_batches(6, timeout=300)  # Spark's start alone takes a minute on a loaded 2-core machine
    # the first slot runs source task 1 and the first ledger executor (plan(): executors round-robin)
    victim = cluster.host_of(sorted(v1["slots"])[0])
    zombie = int(cluster.ask("heartbeats", name)[sorted(v1["slots"])[0]]["pid"])
    cut_at = time.time()
    network.cut(victim)
    v2 = cluster.running(name, 3, timeout=120, newer_than=v1["version"])
    assert victim not in {cluster.host_of(s) for s in v2["slots"]}
    # the cut heals while the stream runs: the zombie worker there learns it was replaced and stops
    seen = sum(1 for b in cluster.batches() if "batch" in b)
    cluster.wait_batches(seen + 3, timeout=300)
    network.restore(victim)
    wait_until(
        lambda: not alive(zombie),
        what=f"the zombie worker on {victim} (pid {zombie}) stopping",
        timeout=120,
        interval=POLL,
    )
    done = cluster.finish(timeout=420)
    checkpoints: dict[str, dict[str, Any]] = cluster.ask("checkpoints", name)
    topology = load_topology(str(path))
    tasks = list(plan(topology, "127.0.0.1:1").component_tasks["ledger"])
    got = cluster.ask("redis_state", redis_url, name, tasks)
    want: dict[str, list[int]] = {}
    for i in range(files * ROWS_PER_FILE):  # the rows Cluster.stream wrote
        entry = want.setdefault(f"k{i % 23}", [0, 0])
        entry[0] += 1
        entry[1] += i
    flowing, stall = recovery(cluster.batches(), cut_at)
    figures = {
        "rollbacks": max((c.get("rollbacks", 0) for c in checkpoints.values()), default=0),
        "replayed_records": sum(c.get("replayed_records", 0) for c in checkpoints.values()),
        "committed_epoch": max((c.get("committed", 0) for c in checkpoints.values()), default=0),
        "reassigned_after_s": round(v2["time"] - cut_at, 2),
        "flowing_again_after_s": flowing,
        "longest_stall_s": stall,
        "batches": done["batches"],
        "wrong_keys": sum(1 for k, v in want.items() if got.get(k) != v),
    }
    report("host cut, Redis ledger", figures)
    wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    assert not wrong, f"{len(wrong)} of {len(want)} keys wrong (got, want): {dict(list(wrong.items())[:5])}"
    assert set(got) == set(want)
