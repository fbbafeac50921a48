"""A worker with a bad setting refuses to start with one ``spark-storm:`` line naming the key;
a worker whose thread dies stops, instead of running half-way and looking healthy."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.config import load_config
from spark_storm.netutil import free_ports
from spark_storm.topology import Slot, plan, topology_from_dict
from spark_storm.worker.settings import SWITCH_INTERVAL_ENV
from spark_storm.worker.worker import Worker
from tests.support import wait_until

pytestmark = pytest.mark.integration

TOPOLOGY = """
name: config
components:
  - {id: in, source: true, fields: [x]}
  - {id: out, bolt: "spark_storm.examples.noop:NoopBolt", inputs: [{from: in}]}
"""


def _worker(
    tmp_path: Path, *sets: str, bolt: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY.replace("spark_storm.examples.noop:NoopBolt", bolt) if bolt else TOPOLOGY)
    port = free_ports(1)[0]
    cmd = [sys.executable, "-m", "spark_storm.cli", "worker", "--topology", str(topo), "--port", str(port)]
    cmd += ["--workers", f"127.0.0.1:{port}", "--set", f"worker.heartbeat.dir={tmp_path}"]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("topology.worker.connections.ready.timeout.ms=-5", "topology.worker.connections.ready.timeout.ms"),
        ("topology.receiver.buffer.size=0", "topology.receiver.buffer.size"),
        ("worker.heartbeat.frequency.secs=0", "worker.heartbeat.frequency.secs"),
        ("topology.worker.shutdown.timeout.ms=soon", "topology.worker.shutdown.timeout.ms"),
        ("topology.worker.metrics.port=99999", "topology.worker.metrics.port"),
        ("topology.backpressure.high.watermark=high", "topology.backpressure.high.watermark"),
        ("topology.backpressure.low.watermark=.nan", "topology.backpressure.low.watermark"),
        ("topology.tick.tuple.freq.secs=often", "topology.tick.tuple.freq.secs"),
        ("topology.tick.tuple.freq.secs=-1", "topology.tick.tuple.freq.secs"),
        ("storm.messaging.tcp.min_wait_ms=5000", "storm.messaging.tcp.max_wait_ms"),
        ("topology.message.timeout.secs=0", "topology.message.timeout.secs"),
        ("topology.worker.cpu.affinity=fast", "topology.worker.cpu.affinity"),
        ("topology.worker.cpu.affinity=[-1]", "topology.worker.cpu.affinity"),
        ("topology.worker.cpu.affinity=[4095]", "CPUs [4095] are not available to this worker"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_key(tmp_path: Path, setting: str, named: str) -> None:
    out = _worker(tmp_path, setting)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("spark-storm: "), out.stderr
    assert named in out.stderr
    assert "Traceback" not in out.stderr


def test_a_worker_port_in_use_is_one_line_and_the_worker_stops_in_order(tmp_path: Path) -> None:
    """bench.chaos seed 1000 #35: the failed start's stop joined executor threads never started (a RuntimeError)."""
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY)
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        cmd = [sys.executable, "-m", "spark_storm.cli", "worker", "--topology", str(topo), "--port", str(port)]
        cmd += ["--workers", f"127.0.0.1:{port}", "--set", f"worker.heartbeat.dir={tmp_path}"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith(f"spark-storm: cannot bind config to 127.0.0.1:{port}"), out.stderr
    assert "Traceback" not in out.stderr, out.stderr


def test_free_ports_come_from_below_the_kernels_ephemeral_range() -> None:
    """An outgoing connection never takes them between the pick and the listener's bind (seed 1000 #35)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = free_ports(8)
    assert len(set(ports)) == 8
    assert all(p < low for p in ports), (ports, low)


def test_a_metrics_port_in_use_and_a_broken_bolt_module_are_one_line_too(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        out = _worker(tmp_path, f"topology.worker.metrics.port={busy.getsockname()[1]}")
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("spark-storm: topology.worker.metrics.port")
    assert "Traceback" not in out.stderr
    (tmp_path / "broken_bolts.py").write_text("class Oops(:\n    pass\n")
    out = _worker(tmp_path, bolt="broken_bolts:Oops", env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 2, out.stderr
    assert "syntax error" in out.stderr
    assert "broken_bolts.py:1" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the point of the test
def test_a_worker_thread_that_dies_stops_the_worker_with_the_error(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    slot = Slot("127.0.0.1", port)
    conf = load_config(None, {"topology.worker.metrics.port": -1, "worker.heartbeat.dir": str(tmp_path)})
    worker = Worker(
        plan(
            topology_from_dict({"name": "dies", "components": [{"id": "in", "source": True, "fields": ["x"]}]}), [slot]
        ),
        slot,
        conf,
    )
    calls = []

    def breaks_on_second_call() -> None:
        calls.append(1)
        if len(calls) == 2:
            msg = "disk on fire"
            raise OSError(msg)

    worker.timer.every("test-duty", 0.05, breaks_on_second_call)  # runs on the worker's timer thread
    worker.start()
    try:
        wait_until(worker.stopping.is_set, what="the worker to stop when its timer thread died")
        assert worker.failed
        assert worker.stop_reason is not None
        assert "spark-storm-timer" in worker.stop_reason
        assert "disk on fire" in worker.stop_reason
    finally:
        assert worker.stop(10)


def test_the_race_tiers_switch_interval_reaches_a_worker_process_and_a_bad_one_is_named(tmp_path: Path) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY)
    port = free_ports(1)[0]
    cmd = [sys.executable, "-m", "spark_storm.cli", "--log-level", "INFO", "worker", "--topology", str(topo)]
    cmd += ["--port", str(port), "--workers", f"127.0.0.1:{port}", "--set", f"worker.heartbeat.dir={tmp_path}"]
    cmd += ["--set", "topology.worker.metrics.port=-1", "--set", "topology.worker.switch.interval.ms=2"]
    log = tmp_path / "worker.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, SWITCH_INTERVAL_ENV: "1"}
        )
    try:
        wait_until(lambda: "GIL switch interval" in log.read_text(), what="the worker to tune itself", interval=0.05)
        assert f"worker 127.0.0.1:{port}: GIL switch interval 1e-06 s" in log.read_text()  # the environment wins
    finally:
        proc.terminate()
        assert proc.wait(30) == 0, log.read_text()
    out = _worker(tmp_path, env={SWITCH_INTERVAL_ENV: "0"})
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"spark-storm: {SWITCH_INTERVAL_ENV}='0'"), out.stderr


def _cpus_allowed(pid: int) -> set[str]:
    """The ``Cpus_allowed_list`` of every thread of process ``pid``."""
    lists: set[str] = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            lists.update(
                line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list")
            )
    return lists


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux only")
def test_slot_affinity_pins_each_worker_with_all_its_threads_to_its_own_cpu(tmp_path: Path) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY)
    cpus = sorted(os.sched_getaffinity(0))
    cluster = LocalCluster(str(topo), 2, overrides={"topology.worker.cpu.affinity": "slot"}, work_dir=tmp_path)
    with cluster:
        for i, slot in enumerate(sorted(cluster.slots, key=lambda s: s.port)):
            pid = cluster.health(slot)["pid"]
            assert _cpus_allowed(pid) == {str(cpus[i % len(cpus)])}, (slot, cluster.log_tail(slot))
            assert f"worker {slot}: pinned to CPUs [{cpus[i % len(cpus)]}]" in cluster.log_tail(slot, 200)
