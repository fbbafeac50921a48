"""LocalCluster: N worker processes on loopback (Storm's LocalCluster).

Each worker is a real ``spark-storm worker`` process.  The cluster picks free ports,
starts the workers with the full slot list (so every process computes the same plan),
waits for each worker's heartbeat to say "running", and stops them with SIGTERM (the
ordered shutdown), killing only what does not exit in time.

Workers run in process groups of their own, so a Ctrl-C in the terminal reaches only the
cluster's process, which then stops each worker once, in order (a worker that got the
terminal's SIGINT *and* the cluster's SIGTERM would take the second signal as "exit now").
They are started through ``spark_storm.cluster.launch`` with the parent-death signal, so
they still go down (ordered) if the cluster's process is killed outright; the thread that
calls :meth:`LocalCluster.start` must therefore live as long as the workers should.
"""

from __future__ import annotations

import logging
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from spark_storm.cluster.launch import launch_worker, stop_workers, worker_command
from spark_storm.errors import SavepointError, StormError
from spark_storm.netutil import free_ports
from spark_storm.reports import (
    WorkerHeartbeat,
    WorkerMetrics,
    heartbeat_file_name,
    metrics_endpoint,
    read_heartbeat_file,
    read_worker_metrics,
    request_savepoint,
)
from spark_storm.topology.assignment import Slot, plan
from spark_storm.topology.loader import load_topology

__all__ = ["LocalCluster"]

logger = logging.getLogger(__name__)


class LocalCluster:
    """Start ``n`` worker processes of a topology on 127.0.0.1.

    Parameters
    ----------
    topology_path : str
        Topology YAML.
    n : int
        Number of worker processes.
    conf_path : str, optional
        A storm.yaml for every worker.
    overrides : dict, optional
        ``--set key=value`` pairs for every worker.
    work_dir : str or Path, optional
        Where the heartbeats and the workers' logs (``worker-<port>.log``) go; a new
        temporary folder when None.  Nothing in it is deleted on stop.
    """

    def __init__(
        self,
        topology_path: str,
        n: int,
        conf_path: str | None = None,
        overrides: dict[str, Any] | None = None,
        host: str = "127.0.0.1",
        properties: str | None = None,
        *,
        work_dir: str | Path | None = None,
    ) -> None:
        if n < 1:
            msg = f"a local cluster needs at least 1 worker, got {n}"
            raise StormError(msg)
        self.topology_path = str(topology_path)
        self.properties = properties
        self.topology = load_topology(self.topology_path, properties)
        self.host = host
        self.ports = free_ports(n, host)
        self.slots = [Slot(host, p) for p in self.ports]
        self.workers_arg = ",".join(str(s) for s in self.slots)
        self.plan = plan(self.topology, self.slots)
        if work_dir is None:
            work_dir = tempfile.mkdtemp(prefix="spark-storm-cluster-")
        self.heartbeat_dir = Path(work_dir)
        self.heartbeat_dir.mkdir(parents=True, exist_ok=True)
        self.overrides = {"worker.heartbeat.dir": str(self.heartbeat_dir), **(overrides or {})}
        self.conf_path = conf_path
        self.procs: dict[Slot, subprocess.Popen[bytes]] = {}
        self.logs: dict[Slot, Path] = {}

    def _command(self, slot: Slot) -> list[str]:
        args = ["--topology", self.topology_path, "--host", slot.host, "--port", str(slot.port)]
        args += ["--workers", self.workers_arg]
        if self.properties:
            args += ["--filter", self.properties]
        return worker_command(args, self.overrides, self.conf_path)

    def start(self, timeout: float = 60.0) -> LocalCluster:
        """Start every worker and wait until each heartbeat says it is running.

        If one does not come up, every worker started is stopped before the error goes on:
        a ``with`` block whose start failed runs no ``__exit__``, and nothing may be left running.
        """
        try:
            for slot in self.slots:
                self.start_worker(slot)
            self.wait_running(timeout)
        except BaseException:
            self.stop(10.0)
            raise
        return self

    def start_worker(self, slot: Slot) -> None:
        """(Re)start the worker of ``slot``."""
        log = self.heartbeat_dir / f"worker-{slot.port}.log"
        self.logs[slot] = log
        self.procs[slot] = launch_worker(self._command(slot), log)

    def heartbeat(self, slot: Slot) -> WorkerHeartbeat | None:
        """Return the last heartbeat of the worker of ``slot``, or None before its first."""
        return read_heartbeat_file(self.heartbeat_dir / heartbeat_file_name(self.topology.name, slot.port))

    def health(self, slot: Slot, timeout: float = 10.0) -> WorkerMetrics:
        """Return the worker's metrics, read from its ``GET /health``.

        Raises
        ------
        StormError
            The worker wrote no heartbeat yet or serves no HTTP endpoint
            (``topology.worker.metrics.port`` -1), or its answer is not a ``/health``.
        OSError
            Its endpoint did not answer within ``timeout`` seconds.
        """
        hb = self.heartbeat(slot)
        endpoint = None if hb is None else metrics_endpoint(hb, slot.host)
        if endpoint is None:
            what = "no heartbeat yet" if hb is None else "no HTTP endpoint (topology.worker.metrics.port is -1)"
            msg = f"worker {slot} of {self.topology.name}: {what}; its /health cannot be read"
            raise StormError(msg)
        return read_worker_metrics(endpoint[0], endpoint[1], timeout)

    def savepoint(self, parent: str | Path, *, commit_first: bool = False, timeout: float = 120.0) -> dict[str, Any]:
        """Write a savepoint of the topology under ``parent`` (coordinated by the first worker that answers).

        Returns the worker's answer (``path``, ``epoch``, ...).  See ``spark-storm savepoint``.
        """
        errors = []
        for slot in self.slots:
            hb = self.heartbeat(slot)
            endpoint = None if hb is None else metrics_endpoint(hb, slot.host)
            if endpoint is None:
                errors.append(f"{slot}: no HTTP endpoint")
                continue
            try:
                return request_savepoint(
                    endpoint[0], endpoint[1], str(parent), commit_first=commit_first, timeout=timeout
                )
            except SavepointError as exc:
                if "did not answer" not in str(exc):
                    raise
                errors.append(str(exc))
        msg = f"no worker of {self.topology.name} could take the savepoint: {'; '.join(errors)}"
        raise SavepointError(msg)

    def wait_running(self, timeout: float = 60.0, slots: list[Slot] | None = None) -> None:
        """Wait for "running" heartbeats; raise with the worker's log tail if one dies."""
        deadline = time.monotonic() + timeout
        pending = list(slots or self.slots)
        while pending:
            for slot in list(pending):
                proc = self.procs[slot]
                if proc.poll() is not None:
                    msg = f"worker {slot} exited with {proc.returncode}:\n{self.log_tail(slot)}"
                    raise StormError(msg)
                hb = self.heartbeat(slot)
                if hb is not None and hb["status"] == "running" and hb["pid"] == proc.pid:
                    pending.remove(slot)
            if pending and time.monotonic() > deadline:
                msg = f"workers {', '.join(map(str, pending))} not running after {timeout}s:\n" + "\n".join(
                    self.log_tail(s) for s in pending
                )
                raise StormError(msg)
            time.sleep(0.05)

    def log_tail(self, slot: Slot, lines: int = 30) -> str:
        """Return the last ``lines`` lines of the worker's log."""
        try:
            return "\n".join(self.logs[slot].read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self, slot: Slot) -> None:
        """SIGKILL one worker (for failure tests)."""
        proc = self.procs[slot]
        proc.kill()
        proc.wait(10)

    def stop(self, timeout: float = 60.0) -> dict[Slot, int]:
        """SIGTERM every worker (ordered shutdown), wait, SIGKILL stragglers; return exit codes."""
        codes, _killed = stop_workers(self.procs, timeout)
        return codes

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
