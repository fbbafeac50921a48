"""The UI's source for a local cluster: workers found through their heartbeat files.

Every worker writes its heartbeat file (``<topology>-<port>.json``, a
:class:`~spark_storm.reports.WorkerHeartbeat`) into ``worker.heartbeat.dir`` once per
``worker.heartbeat.frequency.secs``: its topology, slot, pid, status, uptime, executors and
``metrics_port`` (its HTTP endpoint).  ``spark-storm local-cluster`` gives its workers a
fresh directory and prints it; standalone ``spark-storm worker`` processes use the system
temp directory unless told otherwise.

Actions: activate / deactivate are ``POST /activate`` / ``POST /deactivate`` on every live
worker of the topology; kill is the ordered stop of its workers (SIGTERM, the same as
Ctrl-C on ``local-cluster``) after the wait; rebalance needs cluster mode (a local
cluster's slots and plan are fixed when it starts).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_storm.errors import ActionNotSupportedError, SavepointError, TopologyActionError, UnknownTopologyError
from spark_storm.reports import HEARTBEAT_FILE_NAME, metrics_endpoint, read_heartbeat_file, request_savepoint
from spark_storm.ui.source import ClusterView, SupervisorView, TopologyRef, WorkerRef

__all__ = ["LocalClusterSource"]

logger = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _cmdline(pid: int) -> list[str] | None:
    """Return the process's argv from /proc: None if it is gone, [] where there is no /proc."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return [] if not Path("/proc/self").exists() else None
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _is_worker(pid: int, port: int) -> bool:
    """Whether ``pid`` is still the ``spark-storm worker --port <port>`` that wrote the heartbeat."""
    args = _cmdline(pid)
    if args is None:  # no such process
        return False
    if not args:  # no /proc on this system: liveness is all we can check
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    joined = " ".join(args)
    return ("spark_storm" in joined or "spark-storm" in joined) and "worker" in args and str(port) in args


def _rss_bytes(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
        return int(fields[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def _started_after(w: WorkerRef, when: float) -> bool:
    return w.heartbeat_time is not None and w.uptime_s is not None and w.heartbeat_time - w.uptime_s > when


class LocalClusterSource:
    """Workers of every topology whose heartbeat files are in ``heartbeat_dir``.

    Parameters
    ----------
    heartbeat_dir : str or Path
        The workers' ``worker.heartbeat.dir``.
    worker_timeout_s : float
        A heartbeat older than this marks its worker ``dead`` (``ui.worker.timeout.secs``).
    http_timeout_s : float
        Timeout of each request to a worker's endpoint (``ui.http.timeout.ms``).
    """

    kind = "local-cluster"

    def __init__(self, heartbeat_dir: str | Path, worker_timeout_s: float = 10.0, http_timeout_s: float = 2.0) -> None:
        self.heartbeat_dir = Path(heartbeat_dir)
        self.worker_timeout_s = worker_timeout_s
        self.http_timeout_s = http_timeout_s
        #: How long a savepoint may take (the coordinating worker answers once it is written).
        self.savepoint_timeout_s = 120.0
        self._lock = threading.Lock()
        self._killed: dict[str, float] = {}
        self._timers: list[threading.Timer] = []

    # ------------------------------------------------------------------ reading
    def _workers(self) -> list[WorkerRef]:
        now = time.time()
        out = []
        try:
            files = sorted(p for p in self.heartbeat_dir.glob("*-*.json") if HEARTBEAT_FILE_NAME.match(p.name))
        except OSError as exc:
            logger.warning("cannot list heartbeat dir %s: %s", self.heartbeat_dir, exc)
            return []
        for path in files:
            hb = read_heartbeat_file(path)
            if hb is None:
                continue  # not a heartbeat (another program's JSON in the temp dir): not ours to judge
            host, _, port_text = hb["worker"].rpartition(":")
            port = int(port_text)
            status = hb["status"]
            if status != "stopped":
                stale = now - hb["time"] > self.worker_timeout_s
                if stale or not _is_worker(hb["pid"], port):
                    status = "dead"
            endpoint = metrics_endpoint(hb, host)
            out.append(
                WorkerRef(
                    topology=hb["topology"],
                    host=host,
                    port=port,
                    status=status,
                    supervisor="local",
                    heartbeat_time=float(hb["time"]),
                    uptime_s=float(hb["uptime_s"]),
                    pid=hb["pid"],
                    metrics_host=endpoint[0] if endpoint else host,
                    metrics_port=endpoint[1] if endpoint else None,
                    executors=tuple(hb["executors"]),
                    rss_bytes=_rss_bytes(hb["pid"]) if status != "dead" else None,
                )
            )
        return out

    def state(self) -> ClusterView:
        """Topologies with at least one live worker (dead and stopped workers are listed with them)."""
        by_topology: dict[str, list[WorkerRef]] = {}
        for w in self._workers():
            by_topology.setdefault(w.topology, []).append(w)
        topologies = []
        with self._lock:
            for name, workers in sorted(by_topology.items()):
                alive = [w for w in workers if w.alive]
                if not alive:
                    self._killed.pop(name, None)
                    continue
                killed_at = self._killed.get(name)
                if killed_at is not None and all(_started_after(w, killed_at) for w in alive):
                    del self._killed[name]  # workers started after the kill: a new run of the topology
                    killed_at = None
                status = "KILLED" if killed_at is not None else None
                topologies.append(TopologyRef(name, name, tuple(sorted(workers, key=lambda w: w.id)), status))
        live = [w for t in topologies for w in t.workers if w.alive]
        supervisors: tuple[SupervisorView, ...] = ()
        if live:
            uptimes = [w.uptime_s for w in live if w.uptime_s is not None]
            supervisors = (SupervisorView("local", live[0].host, len(live), len(live), max(uptimes, default=None)),)
        return ClusterView(
            kind=self.kind,
            description=f"local cluster: worker heartbeats in {self.heartbeat_dir}",
            topologies=tuple(topologies),
            supervisors=supervisors,
            rebalance_supported=False,
        )

    def _live(self, topology_id: str) -> list[WorkerRef]:
        topo = self.state().topology(topology_id)
        if topo is None:
            msg = f"no running topology {topology_id!r} in {self.heartbeat_dir} (see /api/v1/topology/summary)"
            raise UnknownTopologyError(msg)
        return [w for w in topo.workers if w.alive]

    # ------------------------------------------------------------------ actions
    def _post_all(self, topology_id: str, path: str) -> None:
        failures = []
        for w in self._live(topology_id):
            if w.endpoint is None:
                failures.append(f"{w.id}: no HTTP endpoint (topology.worker.metrics.port is -1)")
                continue
            req = urllib.request.Request(f"{w.endpoint}{path}", method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.http_timeout_s) as r:
                    r.read()
            except (OSError, urllib.error.URLError) as exc:
                failures.append(f"{w.id}: {exc}")
        if failures:
            msg = f"{path.strip('/')} of {topology_id!r} failed on {len(failures)} worker(s): " + "; ".join(failures)
            raise TopologyActionError(msg)
        logger.info("%s: %s sent to its workers", topology_id, path.strip("/"))

    def activate(self, topology_id: str) -> None:
        self._post_all(topology_id, "/activate")

    def deactivate(self, topology_id: str) -> None:
        self._post_all(topology_id, "/deactivate")

    def savepoint(self, topology_id: str, directory: str) -> dict[str, Any]:
        """Write a savepoint: the first live worker with an endpoint coordinates it (``POST /savepoint``)."""
        failures = []
        for w in self._live(topology_id):
            if w.metrics_port is None:
                failures.append(f"{w.id}: no HTTP endpoint")
                continue
            try:
                return request_savepoint(w.metrics_host, w.metrics_port, directory, timeout=self.savepoint_timeout_s)
            except SavepointError as exc:
                failures.append(f"{w.id}: {exc}")
                if "did not answer" not in str(exc):
                    break
        msg = f"savepoint of {topology_id!r} failed: " + "; ".join(failures)
        raise TopologyActionError(msg)

    def rebalance(self, topology_id: str, wait_secs: int, options: Mapping[str, Any]) -> None:
        self._live(topology_id)
        msg = (
            f"rebalance of {topology_id!r} needs cluster mode (nimbus reassigns slots); a local cluster's "
            "workers and plan are fixed when it starts: stop it and start `spark-storm local-cluster` "
            "with another --workers"
        )
        raise ActionNotSupportedError(msg)

    def kill(self, topology_id: str, wait_secs: int) -> None:
        workers = self._live(topology_id)
        if wait_secs < 0:
            msg = f"kill wait time must be >= 0 seconds, got {wait_secs}"
            raise TopologyActionError(msg)
        with self._lock:
            self._killed[topology_id] = time.time()
        timer = threading.Timer(wait_secs, self._terminate, args=(topology_id, workers))
        timer.daemon = True
        timer.name = f"spark-storm-ui-kill-{topology_id}"
        with self._lock:
            self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()
        logger.info("%s: killing its %d workers in %ds (ordered stop)", topology_id, len(workers), wait_secs)

    def _terminate(self, topology_id: str, workers: list[WorkerRef]) -> None:
        for w in workers:
            if w.pid is None or not _is_worker(w.pid, w.port):
                logger.warning("%s: worker %s (pid %s) is gone already", topology_id, w.id, w.pid)
                continue
            try:
                os.kill(w.pid, signal.SIGTERM)
                logger.info("%s: SIGTERM to worker %s (pid %d)", topology_id, w.id, w.pid)
            except OSError as exc:
                logger.error("%s: cannot stop worker %s (pid %d): %s", topology_id, w.id, w.pid, exc)

    def close(self) -> None:
        with self._lock:
            timers, self._timers = self._timers, []
        for t in timers:
            t.cancel()
