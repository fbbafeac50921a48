"""``deploy(spark, topology, workers=N)``: a topology's workers run inside the Spark application itself.

One call on the driver, and Spark is the topology's resource manager: no second cluster to
provision.  The shape is Ray on Spark's (``ray.util.spark.setup_ray_cluster``: a background
Spark job whose tasks each run a Ray worker node, the head on the driver) and storm-yarn's
(nimbus in the application master, supervisors in YARN containers), over the cluster mode
that already exists (docs/design/on-spark.md has the design and its reasons):

* **ZooKeeper** is the user's (``zookeeper="host:port[/chroot]"``) or, by default, one this
  call starts on the driver from the ZooKeeper jars Spark itself ships, bound to the address
  the executors reach the driver by (``spark.driver.host``; loopback in local mode) and tied
  to this process (:mod:`spark_storm.tools.lifeline`): it ends with the driver, however the
  driver ends.
* **Nimbus** runs in this process (a thread), unless one already leads for that ZooKeeper.
  The driver is the deployment's single point anyway: when it dies, Spark ends the
  application and its executors.
* **Supervisors** run as long-running Spark tasks, one per worker: one background job per
  worker slot (job group ``spark-storm-<name>``, a description naming the topology, a job tag
  per slot), each a single plain task (:mod:`spark_storm.cluster.hosted`) offering one slot
  that nimbus gives to this topology only.  Plain tasks, not a barrier stage: a barrier stage
  restarts every task when one fails (every worker and its state would move), and waits for
  all its slots at once.  A failed task (its executor lost) is run again by Spark; the new
  attempt removes the dead one's registration, so nimbus reassigns at once.  A job Spark gives
  up on (``spark.task.maxFailures``) is submitted again, ``storm.spark.deploy.resubmits``
  times, then the deployment fails loudly and stops.
* **No orphans.** :meth:`Deployment.stop` kills the topology (the workers' ordered shutdown),
  waits for the tasks to end, cancels what is left, stops nimbus and the ZooKeeper it started
  and removes its znodes.  A cancelled job (Spark's UI, a notebook detach) ends the deployment
  the same way.  If the driver dies, its lease znode goes with its ZooKeeper session and every
  supervisor task stops its worker and ends (``storm.spark.deploy.driver.timeout.secs``); a
  killed task's worker gets SIGTERM from Linux (``PR_SET_PDEATHSIG``).

Everything else is cluster mode as it is: ``format("storm").option("zookeeper",
topo.zookeeper)`` feeds it, ``spark-storm list|rebalance|kill --zookeeper topo.zookeeper`` and
the UI see it, and stateful bolts restore from their backend wherever Spark moves a task.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import re
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from spark_storm.cluster import admin
from spark_storm.cluster.hosted import (
    HostedSupervisorSpec,
    deployment_path,
    lease_path,
    parse_supervisor_id,
    run_hosted_supervisor,
    task_path,
)
from spark_storm.cluster.nimbus import Nimbus
from spark_storm.cluster.records import KILLED, SUPERVISORS, HostedDeployment, check_topology_name
from spark_storm.cluster.session import ZooKeeperAddress
from spark_storm.cluster.state import ClusterState
from spark_storm.config import Config
from spark_storm.errors import (
    ClusterError,
    ConfigError,
    DeployError,
    StormError,
    ZooKeeperUnavailableError,
)
from spark_storm.reports import WorkerMetrics, metrics_endpoint, read_worker_metrics
from spark_storm.spark.connect import is_connect
from spark_storm.topology import Plan, Slot, Topology, load_topology, plan
from spark_storm.topology.model import resolve_class

__all__ = ["Deployment", "DeploymentStatus", "deploy"]

logger = logging.getLogger(__name__)

_LOCAL = re.compile(r"^local(?:\[(\d+|\*)(?:\s*,\s*(\d+))?\])?$")
_LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")

STARTING = "starting"
RUNNING = "running"
STOPPING = "stopping"
STOPPED = "stopped"
FAILED = "failed"


@dataclass(frozen=True)
class DeploymentStatus:
    """What :meth:`Deployment.status` reports: ``spark-storm list``'s line plus the Spark side.

    Attributes
    ----------
    name : str
    state : str
        The deployment: ``starting``, ``running``, ``stopping``, ``stopped`` or ``failed``.
    status : str
        The topology's (``active``, ``inactive``, ``killed``), ``""`` once it is removed.
    workers, requested, version : int
        Assigned and requested workers, and the assignment's version (as ``spark-storm list``).
    uptime_s : float
    slots : tuple[str, ...]
        ``host:port`` of each assigned worker.
    tasks : int
        Supervisor tasks running now (one Spark task each).
    task_retries : int
        Attempts Spark ran again after one failed (an executor lost, a process killed).
    resubmits : int
        Jobs submitted again after Spark gave up on one (``spark.task.maxFailures``).
    error : str or None
        Why the deployment failed.
    """

    name: str
    state: str
    status: str
    workers: int
    requested: int
    version: int
    uptime_s: float
    slots: tuple[str, ...]
    tasks: int
    task_retries: int
    resubmits: int
    error: str | None = None


# ------------------------------------------------------------------ the task (runs on executors)
def _supervisor_task(spec: HostedSupervisorSpec, batches: Iterator[Any]) -> Iterator[Any]:
    """Run one supervisor task (the function of ``mapInArrow``) and yield why it ended."""
    import pyarrow as pa
    from pyspark import TaskContext

    for _ in batches:  # the one input row; reading it lets Spark's writer side finish
        pass
    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    # The worker is a child process: give it this task's import path (a --py-files or shipped copy too).
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or tempfile.gettempdir()
    work = Path(local) / f"spark-storm-{spec.name}-{spec.index}-{spec.generation}-{attempt}"
    reason = run_hosted_supervisor(spec, attempt, local_dir=work)
    yield pa.RecordBatch.from_pylist([{"reason": reason}])


# ------------------------------------------------------------------ launching jobs (driver)
class _Launcher:
    """Runs one supervisor task as a background Spark job and cancels it: classic SparkContext or Spark Connect."""

    def __init__(self, spark: Any, name: str, profile: Any) -> None:
        self.spark = spark
        self.group = f"spark-storm-{name}"
        self.name = name
        self.profile = profile
        self.connect = is_connect(spark)

    def tag(self, index: int) -> str:
        return f"{self.group}-{index}"

    def run(self, spec: HostedSupervisorSpec, of: int) -> list[str]:
        """Run the job of ``spec`` in this thread until its task ends; the reasons its task gave."""
        task = functools.partial(_supervisor_task, spec)
        frame = self.spark.range(1, numPartitions=1)
        kwargs = {"profile": self.profile} if self.profile is not None else {}
        if self.connect:
            self.spark.addTag(self.group)
            self.spark.addTag(self.tag(spec.index))
            try:
                rows = frame.mapInArrow(task, "reason string", **kwargs).collect()
            finally:
                self.spark.clearTags()
        else:
            sc = self.spark.sparkContext
            what = (
                f"spark-storm {self.name}: supervisor task {spec.index + 1} of {of} (one worker slot; "
                f"job {spec.generation + 1}); ends with topo.stop() or `spark-storm kill {self.name}`"
            )
            sc.setJobGroup(self.group, what, interruptOnCancel=True)
            sc.addJobTag(self.tag(spec.index))
            try:
                rows = frame.mapInArrow(task, "reason string", **kwargs).collect()
            finally:
                sc.clearJobTags()
                sc.setLocalProperty("spark.jobGroup.id", None)
                sc.setLocalProperty("spark.job.description", None)
        return [str(r[0]) for r in rows]

    def cancel(self, index: int | None = None) -> None:
        """Cancel the job of ``index`` (None: every job of the deployment); a job not started yet is not seen."""
        tag = self.group if index is None else self.tag(index)
        with contextlib.suppress(Exception):  # a stopped SparkContext or Connect session: nothing left to cancel
            if self.connect:
                self.spark.interruptTag(tag)
            elif index is None:
                self.spark.sparkContext.cancelJobGroup(tag)
            else:
                self.spark.sparkContext.cancelJobsWithTag(tag)


class _Job:
    """One supervisor index's current Spark job: its thread and how it ended."""

    def __init__(self, spec: HostedSupervisorSpec) -> None:
        self.spec = spec
        self.thread: threading.Thread | None = None
        self.outcome: str | None = None  # done | cancelled | failed
        self.detail = ""
        self.handled = False

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


def _classify(exc: BaseException) -> tuple[str, str]:
    """Return ``("cancelled" | "failed", first line)`` of a background job's error (classic or Connect)."""
    text = str(exc)
    java = getattr(exc, "java_exception", None)
    if java is not None:
        with contextlib.suppress(Exception):
            text = str(java.getMessage())
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    cancelled = "cancel" in first.lower() and "aborted due to stage failure" not in first
    return ("cancelled" if cancelled else "failed"), first[:500]


# ------------------------------------------------------------------ the handle
class Deployment:
    """A topology hosted by a Spark application: what :func:`deploy` returns.

    Use it as a context manager (leaving the block stops it) or call :meth:`stop`.  Its
    methods are safe to call from any thread.

    Attributes
    ----------
    name : str
        The topology's name (``option("topology", topo.name)``).
    zookeeper : str
        ``host:port/root`` of its ZooKeeper (``option("zookeeper", topo.zookeeper)``, and
        ``--zookeeper`` of every ``spark-storm`` command).
    ui_url : str or None
        The Storm UI this process serves (``deploy(..., ui_port=...)``).
    """

    def __init__(
        self,
        spark: Any,
        name: str,
        settings: dict[str, Any],
        workers: int,
        profile: Any,
    ) -> None:
        self.spark = spark
        self.name = name
        self.settings = settings
        self.conf = Config.of(settings)
        self.zookeeper = ""
        self.ui_url: str | None = None
        self._wanted = workers
        self._launcher = _Launcher(spark, name, profile)
        self._cpus: int | None = None  # CPUs each worker's task reserves (deploy(cpus_per_worker=...))
        #: deploy(from_savepoint=...): what the submit adds to the topology's conf (checked first).
        self._restore: Callable[[Topology], dict[str, Any]] | None = None
        self._jobs: dict[int, _Job] = {}
        self._generations: dict[int, int] = {}
        self._retired: set[int] = set()
        self._lock = threading.RLock()
        self._state_name = STARTING
        self._error: str | None = None
        self._ending = threading.Event()
        self._ended = threading.Event()
        self._monitor: threading.Thread | None = None
        self._cluster: ClusterState | None = None
        self._nimbus: Nimbus | None = None
        self._zk_server: Any = None
        self._ui: Any = None
        self._started = time.time()
        self._attempts: dict[tuple[int, int], int] = {}
        self._owner = False  # /spark/<name> is this deployment's: ending it removes the topology and znodes
        self.resubmits = 0
        self._every = self.conf.get_int("storm.spark.deploy.monitor.ms", minimum=10) / 1000

    # -- what a user calls ------------------------------------------------------------
    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Deployment({self.name!r}, zookeeper={self.zookeeper!r}, state={self._state_name!r})"

    @property
    def state(self) -> str:
        """``starting``, ``running``, ``stopping``, ``stopped`` or ``failed``."""
        return self._state_name

    @property
    def error(self) -> str | None:
        """Why the deployment failed (its supervisor tasks could not be kept running), or None."""
        return self._error

    def workers(self) -> list[str]:
        """``host:port`` of each worker in the current assignment."""
        assignment = self._state().read_assignment(self.name)
        return [str(s) for s in assignment.slots] if assignment else []

    def plan(self) -> Plan | None:
        """Return the current assignment's plan (tasks and executors per worker slot), None before the first one."""
        state = self._state()
        record = state.find_topology(self.name)
        assignment = state.read_assignment(self.name)
        if record is None or assignment is None:
            return None
        return assignment.plan(record.topology())

    def worker_metrics(self, timeout: float = 5.0) -> dict[str, WorkerMetrics]:
        """Return each worker's ``/health`` (counters, executors, queues) by ``host:port``; silent ones are left out."""
        out: dict[str, WorkerMetrics] = {}
        for slot, heartbeat in self._state().read_heartbeats(self.name).items():
            endpoint = metrics_endpoint(heartbeat.record, slot.host)
            if endpoint is None:
                continue
            with contextlib.suppress(OSError, StormError):
                out[str(slot)] = read_worker_metrics(endpoint[0], endpoint[1], timeout)
        return out

    def status(self) -> DeploymentStatus:
        """Return the topology as ``spark-storm list`` shows it, with the Spark side (tasks, retries)."""
        summary = next((t for t in admin.list_topologies(self._state()) if t.name == self.name), None)
        with self._lock:
            tasks = sum(1 for j in self._jobs.values() if j.running)
            retries = sum(self._attempts.values())
        return DeploymentStatus(
            self.name,
            self._state_name,
            summary.status if summary else "",
            summary.workers if summary else 0,
            summary.requested if summary else 0,
            summary.version if summary else 0,
            time.time() - self._started,
            summary.slots if summary else (),
            tasks,
            retries,
            self.resubmits,
            self._error,
        )

    def wait_running(self, timeout: float | None = None) -> bool:
        """Wait until every requested worker runs the current assignment; True then.

        Raises
        ------
        DeployError
            The deployment failed or stopped, or ``timeout`` s (default
            ``storm.spark.deploy.timeout.secs``) passed: the message says what is missing.
        """
        wait = self._timeout(timeout)
        return self._await_running(time.monotonic() + wait, wait)

    def _timeout(self, timeout: float | None) -> float:
        return self.conf.get_float("storm.spark.deploy.timeout.secs", minimum=1.0) if timeout is None else timeout

    def _await_running(self, deadline: float, wait: float) -> bool:
        while True:
            if self._error is not None:
                raise DeployError(self._error)
            if self._ending.is_set():
                msg = f"deployment of {self.name} is {self._state_name}"
                raise DeployError(msg)
            missing = self._not_running()
            if not missing:
                return True
            if time.monotonic() > deadline:
                msg = f"deployment of {self.name}: not running after {wait:g}s: {missing}"
                raise DeployError(msg)
            time.sleep(min(self._every, 0.2))

    def savepoint(self, parent: str | Path) -> dict[str, Any]:
        """Write a savepoint of the topology's state under ``parent`` (``spark-storm savepoint``); return where.

        ``parent`` must be storage every executor writes to (each worker copies its own tasks).
        """
        if self._cluster is None:
            msg = f"deployment of {self.name} has no cluster state yet: it cannot take a savepoint"
            raise DeployError(msg)
        return admin.savepoint(self._cluster, self.name, parent)

    def rebalance(self, workers: int, *, wait: bool = True, timeout: float | None = None) -> None:
        """Run ``workers`` workers (``spark-storm rebalance``): start or retire supervisor tasks, then reassign.

        Raises
        ------
        ConfigError
            ``workers`` is not a positive integer.
        DeployError
            Too few task slots, or (``wait``) the new workers did not run within ``timeout``.
        """
        _check_workers(workers)
        with self._lock:
            if self._ending.is_set():
                msg = f"deployment of {self.name} is {self._state_name}: it cannot be rebalanced"
                raise DeployError(msg)
            running = sorted(i for i in self._jobs if i not in self._retired)
            if workers > len(running):
                _check_slots(self.spark, workers, self.conf, self._cpus)
                first = max(self._jobs, default=-1) + 1
                for index in range(first, first + workers - len(running)):
                    self._launch(index)
            self._wanted = workers
            self._write_record()
        self._wait_registered(time.monotonic() + self._timeout(timeout))  # new tasks first: one new assignment
        admin.rebalance(self._state(), self.name, workers)
        if workers < len(running):
            # The slots nimbus no longer uses: their tasks end once the smaller assignment is written.
            self._retire_unused(workers, timeout)
        if wait:
            self.wait_running(timeout)

    def stop(self, wait: float = 0.0, timeout: float | None = None) -> None:
        """Stop the topology and everything :func:`deploy` started; returns once all of it ended.

        Parameters
        ----------
        wait : float
            Seconds the topology stays deactivated before its workers stop (Storm's ``kill -w``:
            tuple trees in flight may finish); the workers' ordered shutdown drains what they
            accepted either way.
        timeout : float, optional
            How long the supervisor tasks get to end by themselves before their jobs are
            cancelled (default ``storm.spark.deploy.stop.timeout.secs``).
        """
        with self._lock:
            if self._ending.is_set():
                already = True
            else:
                already = False
                self._ending.set()
                self._state_name = STOPPING
        if already:
            self._ended.wait(timeout or 300)
            return
        self._end("stopped", wait=wait, timeout=timeout)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Wait until the deployment ended (stopped, killed from outside, or failed); whether it did."""
        return self._ended.wait(timeout)

    # -- start ----------------------------------------------------------------------
    def _state(self) -> ClusterState:
        if self._cluster is None:
            msg = f"deployment of {self.name} has no ZooKeeper session (it did not start, or it ended)"
            raise DeployError(msg)
        return self._cluster

    def _start(
        self, zookeeper: str | None, source: Path | None, timeout: float | None, ui_port: int | None, shared: bool
    ) -> None:
        address = self._zookeeper(zookeeper)
        self.zookeeper = address.spec
        state = ClusterState(address, self.settings)
        try:
            state.start()
        except ZooKeeperUnavailableError as exc:
            if zookeeper is None:
                raise
            wait = self.conf.get_int("storm.zookeeper.connection.timeout", minimum=1) / 1000
            msg = (
                f"deploy(zookeeper={zookeeper!r}): no ZooKeeper answered at {address.hosts} within {wait:g}s: give "
                "the address of a running ZooKeeper that the driver and every executor reach (host:port[/chroot]), "
                "or leave zookeeper unset to have deploy() start one"
            )
            raise DeployError(msg) from exc
        self._cluster = state
        wait = self._timeout(timeout)
        deadline = time.monotonic() + wait
        if source is not None and state.find_topology(self.name) is not None:
            admin.submit(state, source, self._wanted, restore=self._restore)  # TopologyExistsError, naming the fix
        self._claim(state)
        if state.nimbus_leader() is None:
            identifier = f"spark-driver:{socket.gethostname()}:{os.getpid()}"
            self._nimbus = Nimbus(address, self.settings, identifier=identifier)
            self._nimbus.start()
            if not self._nimbus.wait_leader(self.conf.get_int("storm.zookeeper.connection.timeout", minimum=1) / 1000):
                msg = f"deploy(): the nimbus started on the driver did not lead in ZooKeeper {address}"
                raise DeployError(msg)
        else:
            logger.info("deploy(): nimbus %s already leads in ZooKeeper %s; using it", state.nimbus_leader(), address)
        if source is None:
            record = state.read_topology(self.name)
            state_check(record.topology(), self.settings, _executor_hosts(self.spark), shared_state=shared)
        atexit.register(self._at_exit)
        with self._lock:
            for index in range(self._wanted):
                self._launch(index)
        # Submitted once every supervisor task registered its slot: nimbus's first assignment then
        # spreads over all of them at once (no version that crowds every executor onto the first).
        self._wait_registered(deadline)
        if source is not None:
            admin.submit(state, source, self._wanted, restore=self._restore)
        else:
            admin.rebalance(state, self.name, self._wanted)
        if ui_port is not None:
            from spark_storm.ui import zookeeper_ui

            self._ui = zookeeper_ui(state, self.conf, None, ui_port).start()
            self.ui_url = f"{self._ui.url}topology.html?id={self.name}"
        self._monitor = threading.Thread(target=self._watch, name=f"deploy-{self.name}", daemon=True)
        self._monitor.start()
        self._await_running(deadline, wait)
        with self._lock:
            if self._state_name == STARTING:
                self._state_name = RUNNING

    def _wait_registered(self, deadline: float) -> None:
        """Wait until every supervisor task registered its slot, or one failed, or ``deadline`` passed."""
        while time.monotonic() < deadline:
            with self._lock:
                live = {i: j for i, j in self._jobs.items() if i not in self._retired}
            failed = [j for j in live.values() if j.outcome is not None]
            wanted = set(live)
            if failed:
                job = failed[0]
                what = f"{job.outcome}: {job.detail}"
                msg = f"deploy(): supervisor task {job.spec.index} ended before it registered ({what})"
                raise DeployError(msg)
            if wanted <= {index for index, _, _ in self._registrations()}:
                return
            time.sleep(min(self._every, 0.1))

    def _zookeeper(self, given: str | None) -> ZooKeeperAddress:
        """Parse the user's ZooKeeper, or start one on the driver tied to this process."""
        if given is not None:
            try:
                return ZooKeeperAddress.parse(given, self.settings)
            except ConfigError as exc:
                msg = f"deploy(zookeeper={given!r}): {exc}"
                raise ConfigError(msg) from exc
        from spark_storm.tools.zookeeper_server import ZooKeeperServer, spark_classpath

        host, why = _zookeeper_host(self.spark)
        classpath = spark_classpath()
        server = ZooKeeperServer(Path(tempfile.mkdtemp(prefix=f"spark-storm-zk-{self.name}-")), classpath=classpath)
        self._zk_server = server
        hostport = server.start(host=host, lifeline=True)
        logger.info(
            "deploy(): started ZooKeeper %s for %s on the driver (%s); it ends with this process",
            hostport,
            self.name,
            why,
        )
        return ZooKeeperAddress.parse(hostport, self.settings)

    def _claim(self, state: ClusterState) -> None:
        """Write ``/spark/<name>`` and the driver's lease; clear what a dead driver of that name left."""
        session = state.session
        path = session.path(deployment_path(self.name))
        got = session.read(path)
        if got is not None:
            old = HostedDeployment.from_json(got.data, path)
            if session.read(session.path(lease_path(self.name))) is not None:
                msg = (
                    f"topology {self.name!r} is already deployed on Spark by {old.driver} (application {old.app}) "
                    f"in ZooKeeper {state.address}: stop it there, or `spark-storm kill {self.name} --zookeeper "
                    f"{state.address.spec}` once that driver is gone"
                )
                raise DeployError(msg)
            logger.warning(
                "deploy(): %s was left by a driver that is gone (%s, %s); removing it", self.name, old.driver, old.app
            )
            state.remove_topology(self.name)
            session.delete_tree(path)
            self._remove_registrations(state)
        app = ""
        with contextlib.suppress(Exception):
            app = str(self.spark.conf.get("spark.app.id", "")) or ""
        record = HostedDeployment(
            self.name,
            app,
            f"{socket.gethostname()}:{os.getpid()}",
            time.time(),
            self._zk_server is not None,
            self._wanted,
        )
        session.ensure_path(path.rsplit("/", 1)[0])
        session.call(f"create {path}", "create", path, record.to_json())
        self._owner = True
        session.register_ephemeral(session.path(lease_path(self.name)), record.to_json())

    def _write_record(self) -> None:
        state = self._state()
        path = state.session.path(deployment_path(self.name))
        got = state.session.read(path)
        if got is None:
            return
        old = HostedDeployment.from_json(got.data, path)
        record = HostedDeployment(
            old.name, old.app, old.driver, old.started, old.own_zookeeper, self._wanted, tuple(sorted(self._retired))
        )
        state.session.call(f"write {path}", "set", path, record.to_json())

    def _remove_registrations(self, state: ClusterState) -> None:
        for sid in state.session.children(state.session.path(SUPERVISORS)):
            if parse_supervisor_id(sid, self.name) is not None:
                state.session.delete_tree(state.session.path(SUPERVISORS, sid))

    def _registrations(self) -> list[tuple[int, int, int]]:
        """``(index, generation, attempt)`` of every supervisor task of this deployment registered now."""
        state = self._state()
        out = []
        for sid in state.session.children(state.session.path(SUPERVISORS)):
            parsed = parse_supervisor_id(sid, self.name)
            if parsed is not None:
                out.append(parsed)
        return out

    # -- jobs -----------------------------------------------------------------------
    def _launch(self, index: int) -> None:
        """Submit the job of supervisor ``index`` (its next generation); the caller holds the lock."""
        generation = self._generations.get(index, -1) + 1
        self._generations[index] = generation
        spec = HostedSupervisorSpec(self.name, self.zookeeper, index, generation, dict(self.settings))
        job = _Job(spec)
        of = self._wanted

        def run() -> None:
            try:
                reasons = self._launcher.run(spec, of)
                job.outcome, job.detail = "done", "; ".join(reasons)
            except Exception as exc:  # the job's end, whatever it was, is the monitor's to judge
                job.outcome, job.detail = _classify(exc)

        job.thread = threading.Thread(target=run, name=f"deploy-{self.name}-{index}", daemon=True)
        self._jobs[index] = job
        job.thread.start()

    def _watch(self) -> None:
        """Run the monitor: judge ended jobs, count retries, notice a kill from outside."""
        while not self._ending.wait(self._every):
            try:
                self._watch_once()
            except (ZooKeeperUnavailableError, ClusterError) as exc:
                logger.warning("deployment of %s: check failed (%s); checking again", self.name, exc)
            except Exception as exc:  # a bug in one check must not end the monitor: say it, check again
                logger.error(
                    "deployment of %s: check failed (%s: %s); checking again",
                    self.name,
                    type(exc).__name__,
                    exc,
                    exc_info=exc,
                )

    def _watch_once(self) -> None:
        state = self._state()
        self._release_lost_executors(state)
        for index, generation, attempt in self._registrations():
            with self._lock:
                self._attempts[(index, generation)] = max(self._attempts.get((index, generation), 0), attempt)
        record = state.find_topology(self.name)
        if record is None or record.status == KILLED:
            self._end_from_monitor(f"topology {self.name} was {'removed' if record is None else 'killed'} from outside")
            return
        with self._lock:
            ended = [j for j in self._jobs.values() if j.outcome is not None and not j.handled and not j.running]
        for job in ended:
            job.handled = True
            index = job.spec.index
            with self._lock:
                retired = index in self._retired
            if retired or self._ending.is_set():
                continue
            if job.outcome == "cancelled":
                self._end_from_monitor(f"its Spark job was cancelled ({job.detail})")
                return
            limit = self.conf.get_int("storm.spark.deploy.resubmits", minimum=0)
            if self.resubmits >= limit:
                self._error = (
                    f"deployment of {self.name}: supervisor task {index} ended ({job.outcome}: {job.detail}) and "
                    f"{self.resubmits} resubmits (storm.spark.deploy.resubmits={limit}) are used up; stopping it"
                )
                logger.error("%s", self._error)
                self._end_from_monitor(self._error, failed=True)
                return
            self.resubmits += 1
            logger.warning(
                "deployment of %s: supervisor task %d ended (%s: %s); submitting its job again (%d of %d)",
                self.name,
                index,
                job.outcome,
                job.detail,
                self.resubmits,
                limit,
            )
            with self._lock:
                self._launch(index)

    def _release_lost_executors(self, state: ClusterState) -> None:
        """Remove the registrations of supervisor tasks whose executor Spark lost: nimbus reassigns at once.

        The driver hears of a lost executor in about a second (standalone: from its worker); the
        dead task's ZooKeeper session would keep its slot for ``storm.zookeeper.session.timeout``.
        """
        if self._launcher.connect or _local_cores(_master(self.spark)) is not None:
            return  # a Connect client cannot list executors; local mode has none to lose
        ids = self.spark.sparkContext._jsc.sc().getExecutorIds()
        live = {str(ids.apply(i)) for i in range(ids.size())}
        base = state.session.path(task_path(self.name))
        for sid in state.session.children(base):
            got = state.session.read(f"{base}/{sid}")
            if got is None:
                continue
            try:
                executor = json.loads(got.data).get("executor")
            except ValueError:
                continue
            if executor is None or executor == "driver" or str(executor) in live:
                continue
            state.session.delete_tree(state.session.path(SUPERVISORS, sid))
            state.session.delete_tree(f"{base}/{sid}")
            logger.warning(
                "deployment of %s: Spark lost executor %s of supervisor task %s; its slot is released now",
                self.name,
                executor,
                sid,
            )

    def _retire_unused(self, workers: int, timeout: float | None) -> None:
        """After a rebalance to fewer workers: end the supervisor tasks whose slots nimbus no longer assigns."""
        state = self._state()
        wait = self._timeout(timeout)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            assignment = state.read_assignment(self.name)
            if assignment is not None and len(assignment.slots) <= workers:
                break
            time.sleep(self._every)
        assignment = state.read_assignment(self.name)
        used = {str(s) for s in assignment.slots} if assignment else set()
        supervisors = state.supervisors()
        with self._lock:
            for sid, info in supervisors.items():
                parsed = parse_supervisor_id(sid, self.name)
                if parsed is not None and info.topology == self.name and not {str(s) for s in info.slots} & used:
                    self._retired.add(parsed[0])
            self._write_record()

    def _not_running(self) -> str:
        """Return what keeps the deployment from running (empty when every requested worker runs)."""
        state = self._state()
        record = state.find_topology(self.name)
        if record is None:
            return "the topology is not submitted"
        assignment = state.read_assignment(self.name)
        started = {index for index, _, _ in self._registrations()}
        with self._lock:
            wanted = sorted(i for i in self._jobs if i not in self._retired)
        pending = [i for i in wanted if i not in started]
        if pending:
            return (
                f"Spark has not started supervisor task(s) {', '.join(map(str, pending))} of {len(wanted)} "
                "(no free task slot: other jobs hold them, or the executors are still starting)"
            )
        if assignment is None or len(assignment.slots) < record.workers:
            have = len(assignment.slots) if assignment else 0
            return f"nimbus assigned {have} of {record.workers} workers"
        heartbeats = state.read_heartbeats(self.name)
        behind = [
            str(slot)
            for slot in assignment.slots
            if slot not in heartbeats
            or heartbeats[slot].record.get("status") != "running"
            or int(heartbeats[slot].record.get("assignment_version") or 0) < assignment.version
        ]
        if behind:
            return f"workers {', '.join(behind)} do not run assignment v{assignment.version} yet"
        return ""

    # -- end --------------------------------------------------------------------------
    def _end_from_monitor(self, reason: str, *, failed: bool = False) -> None:
        with self._lock:
            if self._ending.is_set():
                return
            self._ending.set()
            self._state_name = STOPPING
        logger.warning("deployment of %s ends: %s", self.name, reason)
        threading.Thread(target=self._end, args=(reason,), kwargs={"failed": failed}, daemon=True).start()

    def _at_exit(self) -> None:
        if not self._ending.is_set():
            logger.warning("deployment of %s still running at exit; stopping it", self.name)
            with contextlib.suppress(Exception):
                self.stop(timeout=10.0)

    def _end(self, reason: str, *, wait: float = 0.0, timeout: float | None = None, failed: bool = False) -> None:
        """Kill the topology, let the tasks end, cancel the rest, remove what deploy() made; idempotent parts only."""
        try:
            self._end_topology(wait)
            grace = (
                self.conf.get_float("storm.spark.deploy.stop.timeout.secs", minimum=0.0) if timeout is None else timeout
            )
            self._wait_jobs(grace)
            deadline = time.monotonic() + 60.0
            while self._running_jobs() and time.monotonic() < deadline:
                self._launcher.cancel()  # repeated: a job submitted a moment ago is not active yet
                self._wait_jobs(1.0)
            left = self._running_jobs()
            if left:
                logger.error("deployment of %s: supervisor jobs %s did not end after cancelling", self.name, left)
            self._cleanup()
        finally:
            with self._lock:
                self._state_name = FAILED if failed or self._error else STOPPED
            with contextlib.suppress(Exception):
                atexit.unregister(self._at_exit)
            self._ended.set()
            logger.info("deployment of %s %s (%s)", self.name, self._state_name, reason)

    def _end_topology(self, wait: float) -> None:
        if self._cluster is None or not self._owner:
            return
        with contextlib.suppress(StormError):
            state = self._cluster
            record = state.find_topology(self.name)
            if record is not None and record.status != KILLED:
                if wait > 0:
                    admin.deactivate(state, self.name)
                    time.sleep(wait)
                state.set_status(self.name, KILLED, kill_at=time.time())

    def _running_jobs(self) -> list[int]:
        with self._lock:
            return sorted(i for i, j in self._jobs.items() if j.running)

    def _wait_jobs(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = [j.thread for j in self._jobs.values() if j.thread is not None]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _cleanup(self) -> None:
        if self._ui is not None:
            with contextlib.suppress(Exception):
                self._ui.close()
        if self._cluster is not None and self._owner:
            with contextlib.suppress(StormError):
                self._cluster.remove_topology(self.name)
                self._remove_registrations(self._cluster)
                self._cluster.session.delete_tree(self._cluster.session.path(deployment_path(self.name)))
        if self._nimbus is not None:
            self._nimbus.stop()
        if self._cluster is not None:
            self._cluster.close()
        if self.zookeeper:
            from spark_storm.spark.assignments import close_sessions

            close_sessions(self.zookeeper)  # this driver's writers' session to it
        if self._zk_server is not None:
            self._zk_server.stop()


# ------------------------------------------------------------------ checks (driver)
def _check_workers(workers: object) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        msg = f"deploy(workers={workers!r}): give the number of worker processes, an integer >= 1"
        raise ConfigError(msg)
    return workers


def _master(spark: Any) -> str:
    with contextlib.suppress(Exception):
        return str(spark.conf.get("spark.master", "") or "")
    return ""


def _local_cores(master: str) -> int | None:
    """Return the task slots of a ``local[N]`` master (``local[*]``: the CPUs here), None when not local."""
    match = _LOCAL.match(master.strip())
    if match is None:
        return None
    cores = match.group(1)
    if cores is None:
        return 1
    return os.cpu_count() or 1 if cores == "*" else int(cores)


def _check_slots(spark: Any, workers: int, conf: Config, cpus: int | None = None) -> None:
    """Refuse more supervisor tasks than the application has task slots for, with the stream's reserve.

    ``cpus``: CPUs each worker's task reserves (its resource profile), None for ``spark.task.cpus``.
    """
    reserve = conf.get_int("storm.spark.deploy.reserve.slots", minimum=0)
    need = workers + reserve
    master = _master(spark)
    cores = _local_cores(master)
    if cores is not None:
        if need > cores:
            msg = (
                f"deploy(workers={workers}): Spark runs {master} with {cores} task slot(s); the {workers} worker(s) "
                f"and the stream's tasks (storm.spark.deploy.reserve.slots={reserve}) need {need}: use local[{need}] "
                "or more, or ask for fewer workers"
            )
            raise DeployError(msg)
        return
    if is_connect(spark):
        return  # a Connect client cannot count the cluster's slots; wait_running names what did not start
    sc = spark.sparkContext
    if str(sc.getConf().get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        return  # executors come on demand: the slots are not known in advance
    jsc = sc._jsc.sc()
    default = jsc.resourceProfileManager().defaultResourceProfile()
    task_cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    if cpus is not None:
        executor_cores = int(sc.getConf().get("spark.executor.cores", "0") or 0)
        if executor_cores and cpus > executor_cores:
            msg = (
                f"deploy(cpus_per_worker={cpus}): an executor has {executor_cores} cores (spark.executor.cores), so no "
                "executor could run a worker's task: raise spark.executor.cores or lower cpus_per_worker"
            )
            raise DeployError(msg)
        # in task slots of the default profile (spark.task.cpus each), rounded up
        need = workers * -(-cpus // task_cpus) + reserve
    wait = conf.get_float("storm.spark.deploy.slots.wait.secs", minimum=0.0)
    deadline = time.monotonic() + wait
    while True:
        total = int(jsc.maxNumConcurrentTasks(default))
        if total >= need or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if total < need:
        executors = max(0, len(jsc.statusTracker().getExecutorInfos()) - 1)
        msg = (
            f"deploy(workers={workers}): this Spark application has {total} task slot(s) on {executors} executor(s); "
            f"the {workers} worker(s) and the stream's tasks (storm.spark.deploy.reserve.slots={reserve}) need {need}: "
            "give it more (spark.executor.instances or --total-executor-cores / spark.cores.max, spark.executor.cores) "
            "or ask for fewer workers"
        )
        raise DeployError(msg)


def _executor_hosts(spark: Any) -> set[str] | None:
    """Return the executors' hosts (the driver's in local mode); None when they cannot be known now."""
    master = _master(spark)
    if _local_cores(master) is not None:
        return {"localhost"}
    if is_connect(spark):
        return None
    sc = spark.sparkContext
    if str(sc.getConf().get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        return None
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    hosts = {str(info.host()) for info in infos}
    return hosts or None


def state_check(
    topology: Topology, settings: Mapping[str, Any], hosts: set[str] | None, *, shared_state: bool = False
) -> None:
    """Refuse a stateful topology whose state stays on one host's disk when Spark may move tasks between hosts.

    ``hosts``: the executors' hosts (None: unknown, e.g. dynamic allocation or a Connect client).

    Raises
    ------
    DeployError
        The embedded (or memory) provider with executors on several hosts, or where they run
        is unknown; the message names both fixes.
    """
    stateful = []
    from spark_storm.worker.stateful import is_stateful

    for component in topology.components.values():
        with contextlib.suppress(StormError, ImportError):
            if is_stateful(resolve_class(component.bolt, f"component {component.id!r}")):
                stateful.append(component.id)
    if not stateful or shared_state:
        return
    provider = str(
        topology.conf.get("topology.state.provider") or settings.get("topology.state.provider") or "embedded"
    )
    if provider not in ("embedded", "memory"):
        return
    if hosts is not None and len(hosts) <= 1:
        return
    where = f"on {len(hosts)} hosts ({', '.join(sorted(hosts))})" if hosts else "on hosts not known yet"
    msg = (
        f"deploy(): topology {topology.name!r} keeps state ({', '.join(stateful)}) in the {provider} provider, on the "
        f"disk of whichever executor runs the task, and this application's executors are {where}: a task Spark moves "
        "to another host could not restore it. Use topology.state.provider: redis (with "
        "topology.state.provider.config: {url: redis://host:6379/0}), or put topology.state.provider.config.dir "
        "on storage every executor mounts and pass deploy(..., shared_state=True)"
    )
    raise DeployError(msg)


def _zookeeper_host(spark: Any) -> tuple[str, str]:
    """Where deploy()'s own ZooKeeper binds (an address every executor reaches), and why."""
    master = _master(spark)
    local = _local_cores(master) is not None
    if is_connect(spark):
        server = str(getattr(spark.client, "host", "") or "")
        if local and server in _LOOPBACK:
            return "127.0.0.1", f"Spark Connect server on this machine, {master}"
        msg = (
            f"deploy() over Spark Connect (server {server or '?'}, master {master or '?'}) cannot start ZooKeeper "
            "for you: this client is not on the cluster's network, so its executors could not reach a server here. "
            "Give deploy(zookeeper='host:port') a ZooKeeper that this client and every executor reach"
        )
        raise DeployError(msg)
    if local:
        return "127.0.0.1", f"{master}: the executors are this process"
    host = str(spark.conf.get("spark.driver.host"))
    try:
        address = socket.gethostbyname(host)
    except OSError as exc:
        msg = (
            f"deploy(): the driver's host {host!r} (spark.driver.host) does not resolve ({exc}); set spark.driver.host"
        )
        raise DeployError(msg) from exc
    return address, f"spark.driver.host={host}, the address the executors reach the driver by"


def _resource_profile(spark: Any, cpus: int | None) -> Any:
    """Return a stage-level resource profile of ``cpus`` CPUs per supervisor task, where the manager allows it."""
    if cpus is None:
        return None
    if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
        msg = f"deploy(cpus_per_worker={cpus!r}): give an integer >= 1, or leave it unset (spark.task.cpus each)"
        raise ConfigError(msg)
    master = _master(spark)
    if _local_cores(master) is not None:
        msg = (
            f"deploy(cpus_per_worker={cpus}): Spark's stage-level scheduling (a task resource profile) needs a "
            f"standalone, YARN or Kubernetes master; {master} has none: leave cpus_per_worker unset "
            "(each worker task takes spark.task.cpus)"
        )
        raise DeployError(msg)
    if (
        not is_connect(spark)
        and str(spark.sparkContext.getConf().get("spark.dynamicAllocation.enabled", "false")) == "true"
    ):
        msg = (
            f"deploy(cpus_per_worker={cpus}): Spark admits a task-only resource profile with dynamic allocation "
            "off only; turn spark.dynamicAllocation.enabled off, or leave cpus_per_worker unset"
        )
        raise DeployError(msg)
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    return ResourceProfileBuilder().require(TaskResourceRequests().cpus(cpus)).build


def _settings(conf: Mapping[str, Any] | str | Path | None) -> dict[str, Any]:
    """Return the settings given, validated (not the defaults: a topology's own conf must still win over them)."""
    if conf is None:
        return {}
    if isinstance(conf, str | Path):
        try:
            loaded = yaml.safe_load(Path(conf).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            msg = f"deploy(conf={str(conf)!r}): cannot read it as a storm.yaml ({exc})"
            raise ConfigError(msg) from exc
        conf = loaded
    if not isinstance(conf, Mapping):
        msg = f"deploy(conf=...): give storm.yaml settings as a mapping or a storm.yaml path, got {type(conf).__name__}"
        raise ConfigError(msg)
    settings = {str(k): v for k, v in conf.items()}
    Config.of(settings)  # validates every key
    return settings


# ------------------------------------------------------------------ deploy()
def deploy(
    spark: Any,
    topology: str | Path,
    *,
    workers: int,
    zookeeper: str | None = None,
    conf: Mapping[str, Any] | str | Path | None = None,
    cpus_per_worker: int | None = None,
    timeout: float | None = None,
    shared_state: bool = False,
    ui_port: int | None = None,
    from_savepoint: str | Path | None = None,
    allow_unmatched_state: bool = False,
) -> Deployment:
    """Run a topology's workers as long-running tasks of this Spark application; return once they all run.

    Parameters
    ----------
    spark : SparkSession
        A classic session, or a Spark Connect one (where Connect allows it: docs/design/on-spark.md).
    topology : str or Path
        A topology YAML or Flux file (submitted here), or the name of a topology already
        submitted to ``zookeeper``.
    workers : int
        Worker processes, one Spark task each.
    zookeeper : str, optional
        ``host:port[,host:port][/chroot]`` of a ZooKeeper the driver and every executor reach;
        default: start one on the driver (from Spark's own ZooKeeper jars), ended with it.
    conf : mapping or path, optional
        storm.yaml settings for every process: nimbus, the supervisor tasks and the workers
        (the auth secret, TLS files, the state provider ...).  They travel inside the Spark
        tasks and reach the workers as an owner-only file, never on a command line.
    cpus_per_worker : int, optional
        CPUs each worker's task reserves (Spark's stage-level resource profile; standalone,
        YARN and Kubernetes with dynamic allocation off); default ``spark.task.cpus``.
    timeout : float, optional
        Seconds to wait for every worker to run (default ``storm.spark.deploy.timeout.secs``).
    shared_state : bool
        The embedded state provider's ``dir`` is on storage every executor host mounts, so a
        stateful topology may use it across hosts.
    ui_port : int, optional
        Serve the Storm UI of this topology from the driver on this port (0: any free one).
    from_savepoint : str or Path, optional
        Start from this savepoint (``spark-storm savepoint`` or ``Deployment.savepoint``
        wrote it; a directory every executor reads): state matched by component id, checked
        here before anything starts.  Needs a topology file, not a name.
    allow_unmatched_state : bool
        Drop the savepoint's state of components the topology no longer has (else refused).

    Returns
    -------
    Deployment
        The handle: ``name``, ``zookeeper``, ``workers()``, ``status()``, ``rebalance()``,
        ``stop()``, ``wait_running()``, ``plan()``, ``worker_metrics()``; a context manager that
        stops on exit.

    Raises
    ------
    ConfigError
        A bad argument (``workers=0``, an unreadable or unplannable topology, an unknown conf key).
    DeployError
        The application cannot host it (too few task slots, state other hosts cannot reach,
        Spark Connect without what it needs, a ZooKeeper that does not answer) or the workers did
        not run in time; nothing deploy() started is left running.
    """
    _check_workers(workers)
    settings = _settings(conf)
    source: Path | None = None
    text = str(topology)
    if text.endswith((".yaml", ".yml")) or "/" in text or Path(text).is_file():
        source = Path(text)
        loaded = load_topology(source)
        name = check_topology_name(loaded.name)
        try:
            plan(loaded, [Slot("127.0.0.1", 1 + i) for i in range(workers)])
        except ConfigError as exc:
            msg = f"deploy(): topology {name!r} cannot be planned on {workers} worker(s): {exc}"
            raise ConfigError(msg) from exc
        state_check(loaded, settings, _executor_hosts(spark), shared_state=shared_state)
    else:
        name = check_topology_name(text)
    restore = None
    if from_savepoint is not None:
        if source is None:
            msg = (
                f"deploy(from_savepoint=...) starts a topology from its file: pass the topology's YAML or Flux path, "
                f"not the name {name!r} of one already submitted"
            )
            raise ConfigError(msg)
        from spark_storm.worker.checkpoint.seed import restore_for  # the writer alone loads no worker machinery

        restore = restore_for(from_savepoint, allow_unmatched_state)
        restore(loaded)  # checked now: a savepoint that does not fit starts nothing
    profile = _resource_profile(spark, cpus_per_worker)
    _check_slots(spark, workers, Config.of(settings), cpus_per_worker)
    deployment = Deployment(spark, name, settings, workers, profile)
    deployment._cpus = cpus_per_worker
    deployment._restore = restore
    try:
        deployment._start(zookeeper, source, timeout, ui_port, shared_state)
    except BaseException as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        with deployment._lock:
            deployment._ending.set()
            deployment._state_name = STOPPING
        deployment._end(f"deploy() failed: {why}", timeout=10.0)
        raise
    return deployment
