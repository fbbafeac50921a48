"""A supervisor hosted by a Spark task: one worker slot, run for as long as the deployment wants it.

``spark_storm.spark.deploy`` runs one of these in each long-running task of its background
Spark jobs (:func:`run_hosted_supervisor`; nothing here imports pyspark).  It is the ordinary
:class:`~spark_storm.cluster.supervisor.Supervisor` with one slot, dedicated to its topology
(nimbus gives the slot to no other), plus what hosting needs:

* **Address.** The slot is advertised as the host the other processes reach this executor by:
  ``SPARK_LOCAL_IP`` when Spark was given one, else the source address of this host's route to
  ZooKeeper (the interface the driver and the other executors share with it); the port is a
  free one on that address.
* **Replacing an earlier attempt.** Spark runs a failed task again, usually on another
  executor, while the dead attempt's registration lingers in ZooKeeper until its session
  expires.  Each attempt registers as ``<topology>.<index>.<generation>.<attempt>`` and deletes
  the registrations of earlier attempts of its index, so nimbus moves the dead slot's executors
  to the new slot at once instead of after ``storm.zookeeper.session.timeout``.  An attempt
  whose own registration was deleted that way (it was presumed dead) ends.
* **Which executor.** Each task also registers ``/spark/<name>/tasks/<id>`` (ephemeral) naming
  the Spark executor it runs in (``--executor-id`` of its nearest ``java`` ancestor): the driver
  knows at once when an executor is lost and releases the slots of the tasks it held
  (``spark_storm.spark.deploy``), so nimbus reassigns before the rerun or the session timeout.
* **Ending.** The task returns (its worker stopped by the supervisor's ordered shutdown) when the
  topology is killed, or removed once it was there (deploy() submits it when its tasks have
  registered, so that nimbus's first assignment spreads over all of them), when the deployment
  retires its index (a rebalance to fewer workers) or is removed, or when the driver is gone:
  its lease ``/spark/<name>/driver`` is missing, or (a ZooKeeper ``deploy()`` started, which
  ends with the driver) ZooKeeper cannot be reached, for ``storm.spark.deploy.driver.timeout.secs``.
  If the task's process is killed instead (Spark cancels the job, the executor dies), Linux sends
  the worker SIGTERM (:mod:`spark_storm.cluster.launch`), so no worker outlives its task either way.

Secrets stay off command lines: the configuration travels inside the task and reaches the
worker as a ``--conf`` file readable by its owner only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spark_storm.cluster.records import KILLED, SPARK, SUPERVISORS, HostedDeployment
from spark_storm.cluster.session import ZooKeeperAddress
from spark_storm.cluster.supervisor import Supervisor
from spark_storm.config import Config
from spark_storm.errors import ClusterError, ZooKeeperUnavailableError

__all__ = [
    "HostedSupervisorSpec",
    "advertised_host",
    "deployment_path",
    "executor_id",
    "lease_path",
    "parse_supervisor_id",
    "run_hosted_supervisor",
    "supervisor_id",
    "task_path",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostedSupervisorSpec:
    """What one supervisor task runs (picklable: it travels inside the Spark task).

    Attributes
    ----------
    name : str
        The topology.
    zookeeper : str
        ``HOST:PORT[,...]/root`` of the deployment's ZooKeeper.
    index : int
        Which of the deployment's supervisor tasks this is (0, 1, ...).
    generation : int
        How many times the driver submitted a job for this index before (a job that exhausted
        ``spark.task.maxFailures`` is submitted again).
    conf : Mapping
        storm.yaml settings for the supervisor and its worker (the auth secret among them).
    """

    name: str
    zookeeper: str
    index: int
    generation: int = 0
    conf: Mapping[str, Any] = field(default_factory=dict)


def supervisor_id(name: str, index: int, generation: int, attempt: int) -> str:
    """Return the registration name of one attempt of one supervisor task."""
    return f"{name}.{index}.{generation}.{attempt}"


def parse_supervisor_id(sid: str, name: str) -> tuple[int, int, int] | None:
    """Return ``(index, generation, attempt)`` of a registration of ``name``'s supervisor tasks, else None."""
    if not sid.startswith(f"{name}."):
        return None
    parts = sid[len(name) + 1 :].split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def deployment_path(name: str) -> str:
    """``/spark/<name>`` (under the root): the deployment's record."""
    return f"{SPARK}/{name}"


def task_path(name: str, sid: str = "") -> str:
    """``/spark/<name>/tasks[/<supervisor id>]``: the supervisor tasks and the executors they run in."""
    return f"{SPARK}/{name}/tasks" + (f"/{sid}" if sid else "")


def executor_id(pid: int | None = None) -> str | None:
    """Return the Spark executor id this process runs under: its nearest ``java`` ancestor's ``--executor-id``.

    ``"driver"`` when that ancestor is not an executor (local mode: the driver runs the tasks);
    None when it cannot be told (no ``/proc``, no java ancestor).
    """
    current = os.getpid() if pid is None else pid
    try:
        while current > 1:
            stat = Path(f"/proc/{current}/stat").read_text()
            current = int(stat.rsplit(")", 1)[1].split()[1])
            args = Path(f"/proc/{current}/cmdline").read_bytes().split(b"\0")
            if args and Path(args[0].decode(errors="replace")).name == "java":
                if b"--executor-id" in args:
                    at = args.index(b"--executor-id")
                    return args[at + 1].decode() if at + 1 < len(args) else None
                return "driver"
    except (OSError, ValueError, IndexError):
        return None
    return None


def lease_path(name: str) -> str:
    """``/spark/<name>/driver``: the driver's ephemeral lease."""
    return f"{SPARK}/{name}/driver"


def advertised_host(address: ZooKeeperAddress) -> str:
    """Return the address others reach this host by: ``SPARK_LOCAL_IP``, else this host's route to ZooKeeper."""
    given = os.environ.get("SPARK_LOCAL_IP", "").strip()
    if given:
        return given
    first = address.hosts.split(",")[0]
    host, _, port = first.rpartition(":")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)
        family, _, _, _, target = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(target)  # a UDP connect sends nothing: it only picks the route
            return str(probe.getsockname()[0])
    except OSError as exc:
        msg = f"cannot find this host's address towards ZooKeeper {first} ({exc}); set SPARK_LOCAL_IP on the executors"
        raise ClusterError(msg) from exc


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _write_conf(directory: Path, conf: Mapping[str, Any]) -> Path:
    """Write the worker's ``--conf`` file, readable by its owner only (it may hold the auth secret)."""
    path = directory / "storm.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        yaml.safe_dump(dict(conf), out)
    return path


class _Hosting:
    """The checks that end a supervisor task, on its supervisor's ZooKeeper session."""

    def __init__(self, spec: HostedSupervisorSpec, supervisor: Supervisor, conf: Config) -> None:
        self.spec = spec
        self.supervisor = supervisor
        self.session = supervisor.state.session
        self.driver_timeout = conf.get_float("storm.spark.deploy.driver.timeout.secs", minimum=0.0)
        self.own_zookeeper = False
        self._topology_seen = False  # deploy() submits the topology once its supervisor tasks registered
        self._driver_seen = time.monotonic()
        self._connected_seen = time.monotonic()

    def remove_earlier_attempts(self) -> list[str]:
        """Delete the registrations of this index's earlier attempts (dead or presumed dead); their ids."""
        removed = []
        for sid in self.session.children(self.session.path(SUPERVISORS)):
            parsed = parse_supervisor_id(sid, self.spec.name)
            if parsed is not None and parsed[0] == self.spec.index and sid != self.supervisor.id:
                self.session.delete_tree(self.session.path(SUPERVISORS, sid))
                removed.append(sid)
        return removed

    def reason_to_end(self) -> str | None:
        """Why this task should end now, or None to keep running."""
        now = time.monotonic()
        if not self.session.connected:
            if self.own_zookeeper and self.driver_timeout and now - self._connected_seen > self.driver_timeout:
                return f"ZooKeeper {self.session.address} unreachable for {self.driver_timeout:g}s (the driver is gone)"
            return None
        self._connected_seen = now
        try:
            record = self._deployment()
            if record is None:
                return "the deployment was removed"
            self.own_zookeeper = record.own_zookeeper
            if self.spec.index in record.retired:
                return "retired (the deployment has fewer workers now)"
            if self.session.read(self.session.path(SUPERVISORS, self.supervisor.id)) is None:
                return "replaced: a newer attempt of this task removed this one's registration"
            topology = self.supervisor.state.find_topology(self.spec.name)
            if topology is not None and topology.status == KILLED:
                return f"topology {self.spec.name} killed"
            if topology is None and self._topology_seen:
                return f"topology {self.spec.name} removed"
            self._topology_seen = self._topology_seen or topology is not None
            if self.session.read(self.session.path(lease_path(self.spec.name))) is not None:
                self._driver_seen = now
            elif self.driver_timeout and now - self._driver_seen > self.driver_timeout:
                return f"the driver's lease has been gone for {self.driver_timeout:g}s (the driver is gone)"
        except (ZooKeeperUnavailableError, ClusterError) as exc:
            logger.warning("hosted supervisor %s: check failed (%s); running on", self.supervisor.id, exc)
        return None

    def _deployment(self) -> HostedDeployment | None:
        path = self.session.path(deployment_path(self.spec.name))
        got = self.session.read(path)
        return None if got is None else HostedDeployment.from_json(got.data, path)


def run_hosted_supervisor(
    spec: HostedSupervisorSpec,
    attempt: int = 0,
    *,
    local_dir: str | Path | None = None,
    stop: threading.Event | None = None,
    on_started: Any = None,
) -> str:
    """Run one supervisor task: register a slot, run the worker nimbus assigns to it, return why it ended.

    Parameters
    ----------
    spec : HostedSupervisorSpec
    attempt : int
        Spark's attempt number of this task.
    local_dir : str or Path, optional
        Where the worker's log and heartbeat files go; default a new temporary directory.
    stop : threading.Event, optional
        Set to end the task from outside.
    on_started : callable, optional
        Called with the :class:`Supervisor` once it is registered.

    Raises
    ------
    ZooKeeperUnavailableError
        ZooKeeper did not answer at the start (Spark fails the task and runs it again).
    """
    conf = Config.of(spec.conf)
    address = ZooKeeperAddress.parse(spec.zookeeper, conf)
    host = advertised_host(address)
    base = Path(local_dir) if local_dir is not None else Path(tempfile.mkdtemp(prefix=f"spark-storm-{spec.name}-"))
    base.mkdir(parents=True, exist_ok=True)
    sid = supervisor_id(spec.name, spec.index, spec.generation, attempt)
    conf_path = _write_conf(base, spec.conf)
    supervisor = Supervisor(
        address,
        host,
        [_free_port(host)],
        spec.conf,
        conf_path=str(conf_path),
        supervisor_id=sid,
        local_dir=base,
        dedicated=spec.name,
    )
    hosting = _Hosting(spec, supervisor, conf)
    every = conf.get_int("storm.spark.deploy.monitor.ms", minimum=10) / 1000
    stop = stop or threading.Event()
    reason = "stopped"
    supervisor.start()
    try:
        task = {"executor": executor_id(), "host": host, "pid": os.getpid(), "attempt": attempt}
        path = supervisor.state.session.path(task_path(spec.name, sid))
        supervisor.state.session.register_ephemeral(path, json.dumps(task).encode())
        removed = hosting.remove_earlier_attempts()
        logger.info(
            "hosted supervisor %s: slot %s of topology %s%s",
            sid,
            supervisor.slots[0],
            spec.name,
            f" (replacing {', '.join(removed)})" if removed else "",
        )
        if on_started is not None:
            on_started(supervisor)
        while not stop.wait(every):
            why = hosting.reason_to_end()
            if why is not None:
                reason = why
                break
    finally:
        supervisor.stop()
        with contextlib.suppress(OSError):
            conf_path.unlink()
    logger.info("hosted supervisor %s ended: %s", sid, reason)
    return reason
