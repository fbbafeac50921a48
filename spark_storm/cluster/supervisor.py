"""Supervisor: runs the workers that nimbus assigned to this host's slots.

``spark-storm supervisor --zookeeper ZK --host H --slots 6700,6701`` registers
``/supervisors/<id>`` (ephemeral: host and ports) and keeps one ``spark-storm worker``
process per assigned slot of ``H``, comparing the assignments with its processes whenever
an assignment changes and every ``supervisor.monitor.frequency.secs``:

* an assigned slot without a process gets one (a process that exited is started again,
  with its exit code and log tail logged);
* a process whose slot is no longer assigned (rebalanced away, topology killed) or whose
  topology was submitted anew is stopped: SIGTERM to its process group (the ordered shutdown),
  SIGKILL to the group after ``supervisor.worker.shutdown.sleep.secs``;
* when the supervisor stops (``stop()``, SIGTERM, SIGINT) it stops every worker the same
  way before it exits; if it is SIGKILLed, Linux sends each worker SIGTERM
  (``spark_storm.cluster.launch``), so no worker outlives it.

Every process is started and stopped by one thread, the supervisor thread.

Workers run in cluster form, ``spark-storm worker --zookeeper ZK --topology-id NAME --port P
--host H`` (:mod:`spark_storm.worker.zk_worker`): each reads its plan and the topology's
status from ZooKeeper, follows new assignment versions itself (a rebalance that keeps its
slot does not restart it), pauses and resumes on deactivate/activate, stops on kill, and
writes its own heartbeats for nimbus.  So the supervisor restarts a worker only when it
died or its topology was submitted anew (another source under the same name), and stops
the workers of a killed topology at once (the workers do the same on their own).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_storm.cluster.launch import launch_worker, stop_workers, worker_command
from spark_storm.cluster.records import KILLED, SupervisorInfo, TopologyRecord
from spark_storm.cluster.session import Watch, ZooKeeperAddress
from spark_storm.cluster.state import ClusterState
from spark_storm.errors import ClusterError, ConfigError, ZooKeeperUnavailableError
from spark_storm.topology.assignment import Slot

__all__ = ["LaunchSpec", "Supervisor"]

logger = logging.getLogger(__name__)

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class LaunchSpec:
    """What one worker process runs: a topology's slot on this host (under assignment ``version``)."""

    topology: str
    port: int
    digest: str
    version: int

    def key(self) -> tuple[Any, ...]:
        """Two specs with the same key run the same process (a change of key restarts the worker).

        A worker follows new assignment versions itself, so only the topology's identity counts.
        """
        return (self.topology, self.port, self.digest)


@dataclass
class _Worker:
    spec: LaunchSpec
    proc: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)


class Supervisor:
    """One supervisor process: register slots, run assigned workers, never leave one behind.

    Parameters
    ----------
    zookeeper : str or ZooKeeperAddress, optional
        ``HOST:PORT[/chroot]``; default from ``conf``.
    host : str
        The host name workers of this supervisor listen on, exactly as it appears in assignments
        (other hosts' workers connect to it).
    ports : sequence of int, optional
        Slots offered; default ``supervisor.slots.ports``.
    conf : Mapping, optional
        Configuration; also handed to every worker (as ``--conf`` and ``--set``).  When
        ``storm.messaging.bind.host`` is loopback and ``host`` is not, workers bind ``host``.
    conf_path : str, optional
        A storm.yaml handed to every worker.
    overrides : Mapping, optional
        ``--set key=value`` pairs handed to every worker.
    supervisor_id : str, optional
        The znode name; default ``<host>-<random>``.
    local_dir : str, optional
        Worker logs and heartbeat files; default ``storm.local.dir`` or a temp dir.
    dedicated : str, optional
        The topology this supervisor's slots are for (nimbus gives them to no other); default any.
    """

    def __init__(
        self,
        zookeeper: str | ZooKeeperAddress | None = None,
        host: str = "127.0.0.1",
        ports: Sequence[int] | None = None,
        conf: Mapping[str, Any] | None = None,
        *,
        conf_path: str | None = None,
        overrides: Mapping[str, Any] | None = None,
        supervisor_id: str | None = None,
        local_dir: str | Path | None = None,
        dedicated: str | None = None,
    ) -> None:
        self.state = ClusterState(zookeeper, conf)
        self.conf = self.state.conf
        self.host = host
        raw_ports = list(ports) if ports is not None else self.conf["supervisor.slots.ports"]
        if not isinstance(raw_ports, list) or not raw_ports:
            msg = f"supervisor slots {raw_ports!r}: give worker ports, e.g. --slots 6700,6701"
            raise ConfigError(msg)
        for port in raw_ports:
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= 65535:
                msg = f"supervisor slot port {port!r} is not a port in 1..65535 (e.g. --slots 6700,6701)"
                raise ConfigError(msg)
        if len(set(raw_ports)) != len(raw_ports):
            msg = f"supervisor slot ports repeat: {raw_ports}"
            raise ConfigError(msg)
        self.ports = tuple(sorted(raw_ports))
        self.id = supervisor_id or f"{host}-{uuid.uuid4().hex[:8]}"
        self.dedicated = dedicated
        configured = self.conf.get_optional_str("storm.local.dir")
        base = Path(local_dir or configured or tempfile.mkdtemp(prefix="spark-storm-supervisor-"))
        self.local_dir = base.resolve() / f"supervisor-{self.id}"
        self.conf_path = conf_path
        self.overrides = dict(overrides or {})
        # Workers listen where assignments say they are: a loopback bind (the single-machine
        # default) on a host other hosts reach by name would refuse them all.
        if self.conf["storm.messaging.bind.host"] in _LOOPBACK and host not in _LOOPBACK:
            self.overrides.setdefault("storm.messaging.bind.host", host)
        self.monitor_every = self.conf.get_int("supervisor.monitor.frequency.secs", minimum=1)
        self.shutdown_wait = self.conf.get_int("supervisor.worker.shutdown.sleep.secs", minimum=0)
        self.workers: dict[int, _Worker] = {}
        self.counters = {"launched": 0, "restarted": 0, "stopped": 0, "killed": 0}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._watches: dict[str, Watch] = {}
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def slots(self) -> tuple[Slot, ...]:
        """The slots this supervisor offers."""
        return tuple(Slot(self.host, p) for p in self.ports)

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> Supervisor:
        """Connect, register the slots, and start the supervisor thread."""
        for sub in ("logs", "heartbeats"):
            (self.local_dir / sub).mkdir(parents=True, exist_ok=True)
        self.state.session.add_state_listener(lambda _change: self._wake.set())
        self.state.start()
        self.state.register_supervisor(
            SupervisorInfo(self.id, self.host, self.ports, time.time(), os.getpid(), self.dedicated)
        )
        self._watches["/"] = self.state.watch_assignments(lambda _names: self._wake.set())
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=False)
        self._thread.start()
        logger.info(
            "supervisor %s: slots %s registered in ZooKeeper %s; local dir %s",
            self.id,
            ", ".join(map(str, self.slots)),
            self.state.address,
            self.local_dir,
        )
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop every worker (SIGTERM, then SIGKILL), unregister and disconnect."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            wait = None if timeout is None else timeout
            self._thread.join(wait)
        for watch in list(self._watches.values()):  # the supervisor thread may outlive the join's timeout
            watch.cancel()
        with contextlib.suppress(ZooKeeperUnavailableError, ClusterError):
            self.state.unregister_supervisor(self.id)
        self.state.close()
        logger.info("supervisor %s stopped", self.id)

    def kill_now(self) -> None:
        """SIGKILL every worker's process group at once (a second Ctrl-C)."""
        with self._lock:
            workers = list(self.workers.values())
        for worker in workers:
            _signal_group(worker.proc, signal.SIGKILL)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._wake.clear()
                if self.state.session.connected:
                    try:
                        self.sync()
                    except (ZooKeeperUnavailableError, ClusterError) as exc:
                        logger.warning("supervisor %s: sync failed (%s); workers keep running", self.id, exc)
                    except Exception:  # logged with its traceback; the loop goes on
                        logger.exception("supervisor %s: sync failed; workers keep running", self.id)
                self._wake.wait(self.monitor_every)
        finally:
            # Stopped here, on the thread that started them (their parent-death signal is bound to it).
            self._stop_workers(list(self.workers))

    # -- the comparison -------------------------------------------------------------
    def wanted(self) -> dict[int, LaunchSpec]:
        """Read the assignments: which of this supervisor's ports run what (killed topologies run nothing)."""
        mine = set(self.slots)
        out: dict[int, LaunchSpec] = {}
        records: dict[str, TopologyRecord | None] = {}
        names = self.state.assignment_names()
        for name in names:
            if name not in self._watches:
                self._watches[name] = self.state.watch_assignment(name, lambda _a: self._wake.set())
            if f"status:{name}" not in self._watches:
                self._watches[f"status:{name}"] = self.state.watch_status(name, lambda _s: self._wake.set())
            assignment = self.state.read_assignment(name)
            if assignment is None:
                continue
            for slot in assignment.slots:
                if slot not in mine:
                    continue
                if name not in records:
                    records[name] = self.state.find_topology(name)
                record = records[name]
                if record is None or record.status == KILLED:
                    continue
                out[slot.port] = LaunchSpec(name, slot.port, record.digest, assignment.version)
        for key in [k for k in self._watches if k != "/" and k.removeprefix("status:") not in names]:
            self._watches.pop(key).cancel()
        return out

    def sync(self) -> None:
        """Make the running workers match the assignments once (the supervisor thread calls it)."""
        wanted = self.wanted()
        stale = [
            port
            for port, worker in self.workers.items()
            if port not in wanted or wanted[port].key() != worker.spec.key()
        ]
        if stale:
            self._stop_workers(stale)
        for port, spec in sorted(wanted.items()):
            worker = self.workers.get(port)
            if worker is not None and worker.proc.poll() is not None:
                logger.warning(
                    "supervisor %s: worker %s of %s (pid %d) exited with %s; restarting it. Log tail:\n%s",
                    self.id,
                    Slot(self.host, port),
                    spec.topology,
                    worker.proc.pid,
                    worker.proc.returncode,
                    _tail(worker.log),
                )
                self.counters["restarted"] += 1
                worker = None
            if worker is None and not self._stop.is_set():
                self._launch(spec)

    # -- processes ------------------------------------------------------------------
    def worker_command(self, spec: LaunchSpec) -> list[str]:
        """Return the command line of the worker for ``spec``: the cluster form, plan and status from ZooKeeper."""
        args = ["--zookeeper", self.state.address.spec, "--topology-id", spec.topology]
        args += ["--host", self.host, "--port", str(spec.port)]
        # the ports this supervisor offers (its --slots may differ from its conf's): a worker's
        # index among them picks its CPU under topology.worker.cpu.affinity "slot"
        overrides = {
            **self.overrides,
            "worker.heartbeat.dir": str(self.local_dir / "heartbeats"),
            "supervisor.slots.ports": list(self.ports),
        }
        return worker_command(args, overrides, self.conf_path)

    def _launch(self, spec: LaunchSpec) -> None:
        log = self.local_dir / "logs" / f"{spec.topology}-{spec.port}.log"
        proc = launch_worker(self.worker_command(spec), log)
        with self._lock:
            self.workers[spec.port] = _Worker(spec, proc, log)
        self.counters["launched"] += 1
        logger.info(
            "supervisor %s: started worker %s of %s v%d (pid %d, log %s)",
            self.id,
            Slot(self.host, spec.port),
            spec.topology,
            spec.version,
            proc.pid,
            log,
        )

    def _stop_workers(self, ports: list[int]) -> None:
        with self._lock:
            stopping = [self.workers.pop(p) for p in ports if p in self.workers]
        codes, killed = stop_workers({w.spec.port: w.proc for w in stopping}, self.shutdown_wait)
        self.counters["killed"] += len(killed)
        for worker in stopping:
            self.counters["stopped"] += 1
            logger.info(
                "supervisor %s: stopped worker %s of %s (exit %s)",
                self.id,
                Slot(self.host, worker.spec.port),
                worker.spec.topology,
                codes.get(worker.spec.port),
            )


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    """Send ``signum`` to the worker's process group (its pid: it leads its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
