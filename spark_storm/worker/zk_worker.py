"""The worker in cluster mode: its assignment, status and heartbeats in ZooKeeper (JStorm's worker).

``spark-storm worker --zookeeper ZK --topology-id NAME --port P --host H`` (what a
supervisor launches) runs a :class:`~spark_storm.worker.worker.Worker` whose plan comes
from ZooKeeper instead of a slot list:

* start: read the topology (``/topologies/<name>``), wait up to
  ``worker.assignment.timeout.secs`` for an assignment that includes ``H:P``, build the
  worker from that plan;
* :meth:`~ZooKeeperWorker.refresh_connections` (Storm's RefreshConnections): a watch on
  ``/assignments/<name>``; for each newer version the refresh thread calls
  :meth:`Worker.refresh` (new connections first, an atomic swap, executors moved) — or, if
  the new version leaves this slot out, runs the worker's ordered shutdown;
* :meth:`~ZooKeeperWorker.refresh_active` (Storm's RefreshActive): a watch on the topology's
  status: ``active`` → executors consume, ``inactive`` → they pause, ``killed`` or removed →
  ordered shutdown;
* heartbeats: a timer duty writes the worker's heartbeat record
  (:class:`~spark_storm.reports.WorkerHeartbeat`: the same as its local file, plus the
  assignment version it runs) to ``/heartbeats/<name>/<H:P>`` every
  ``worker.heartbeat.frequency.secs``, without waiting for ZooKeeper.

Watch callbacks only store the newest value and wake the refresh thread; nothing here
calls ZooKeeper synchronously once the worker runs, so a ZooKeeper outage or a lost
session (reconnected by :class:`~spark_storm.cluster.session.ZooKeeperSession`, watches re-armed)
never stops the bolts: the worker keeps running its last plan and heartbeats resume
when the session is back.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Final

from spark_storm.cluster.records import ACTIVE, INACTIVE, KILLED, Assignment, check_topology_name
from spark_storm.cluster.session import Watch, ZooKeeperAddress
from spark_storm.cluster.state import ClusterState
from spark_storm.config import Config
from spark_storm.errors import ClusterError, StormError
from spark_storm.topology.assignment import Slot
from spark_storm.topology.model import Topology
from spark_storm.worker.worker import Worker

__all__ = ["ZooKeeperWorker"]

logger = logging.getLogger(__name__)


class _Unset:
    """Nothing heard from a watch yet (None means: the znode is gone)."""


_UNSET: Final = _Unset()


class ZooKeeperWorker:
    """One worker process of a topology submitted to the cluster.

    Parameters
    ----------
    zookeeper : str or ZooKeeperAddress, optional
        ``HOST:PORT[/chroot]``; default from ``conf`` (``storm.zookeeper.*``).
    topology_id : str
        The submitted topology's name.
    slot : Slot
        This worker's slot exactly as assignments name it (the supervisor's ``--host`` and a port).
    conf : Mapping
        The process configuration (the topology's own ``conf`` is merged by the worker).
    tune_process : bool
        Call :meth:`Worker.tune_process` once the worker is built (for a worker *process*).

    The lifecycle is the worker's: :meth:`start`, :attr:`stopping`, :meth:`request_stop`,
    :meth:`stop`; :attr:`worker` is the running :class:`Worker` once :meth:`start` returned.
    """

    def __init__(
        self,
        zookeeper: str | ZooKeeperAddress | None,
        topology_id: str,
        slot: Slot,
        conf: Config,
        *,
        tune_process: bool = False,
    ) -> None:
        self.conf = conf
        self.topology_id = check_topology_name(topology_id)
        self.slot = slot
        self._beat_lock = threading.Lock()
        self.assignment_timeout = conf.get_float("worker.assignment.timeout.secs", minimum=0.0)
        self.state = ClusterState(zookeeper, conf)
        self.worker: Worker | None = None
        self.topology: Topology | None = None
        self.assignment: Assignment | None = None
        self.counters = {"refreshes": 0, "activations": 0, "deactivations": 0}
        self._tune_process = tune_process
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop_early = threading.Event()
        self._early_failure = False
        self._latest_assignment: Assignment | _Unset | None = _UNSET
        self._latest_status: str | _Unset | None = _UNSET
        self._paused = False
        self._watches: list[Watch] = []
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the worker's lifecycle
    @property
    def stopping(self) -> threading.Event:
        """Set once a stop was asked for (before the worker exists, or by the worker itself)."""
        return self.worker.stopping if self.worker is not None else self._stop_early

    @property
    def failed(self) -> bool:
        """Whether the stop was caused by a failure (the process then exits non-zero)."""
        return self.worker.failed if self.worker is not None else self._early_failure

    @property
    def version(self) -> int:
        """The assignment version the worker runs (0 before it started)."""
        return self.assignment.version if self.assignment is not None else 0

    def request_stop(self, reason: str, *, failure: bool = True) -> None:
        """Ask for the ordered shutdown, from any thread (also while still waiting for an assignment)."""
        worker = self.worker
        if worker is not None:
            worker.request_stop(reason, failure=failure)
            return
        if not self._stop_early.is_set():
            self._early_failure = failure
            logger.info("worker %s of %s: stopping before it started: %s", self.slot, self.topology_id, reason)
            self._stop_early.set()
        self._wake.set()

    def start(self) -> None:
        """Connect, wait for an assignment that includes this slot, start the worker and its refresh thread.

        Returns without starting a worker when a stop was asked for while waiting.

        Raises
        ------
        ZooKeeperUnavailableError
            ZooKeeper did not answer.
        UnknownTopologyError
            No topology of that name is submitted.
        ClusterError
            No assignment with this slot within ``worker.assignment.timeout.secs``, the topology
            is being killed, or the assignment does not fit the topology.
        """
        self.state.start()
        record = self.state.read_topology(self.topology_id)
        self.topology = record.topology()
        self._watches.append(self.state.watch_status(self.topology_id, self._on_status))
        self._watches.append(self.state.watch_assignment(self.topology_id, self._on_assignment))
        assignment = self._wait_for_assignment()
        if assignment is None:
            return
        plan = assignment.plan(self.topology)
        worker = Worker(plan, self.slot, self.conf)
        worker.timer.every("zookeeper-heartbeat", worker.settings.heartbeat_every_s, self._beat)
        if self._tune_process:
            worker.tune_process()
        self.assignment = assignment
        self.worker = worker
        if self._stop_early.is_set():  # a signal came while the worker was being built
            worker.request_stop("stop requested while starting", failure=self._early_failure)
            return
        worker.start()
        self._thread = threading.Thread(target=self._run, name=f"spark-storm-refresh-{self.slot.port}", daemon=True)
        self._thread.start()
        logger.info(
            "worker %s of %s runs assignment v%d from ZooKeeper %s",
            self.slot,
            self.topology_id,
            assignment.version,
            self.state.address,
        )

    def stop(self, timeout: float | None = None) -> bool:
        """Ordered shutdown of the worker (if it started), then leave ZooKeeper; False if the deadline cut it short.

        No last heartbeat is written: nimbus may already have removed this slot's znode
        (the slot was reassigned) and must not see it again.
        """
        for watch in self._watches:
            watch.cancel()
        self._wake.set()
        clean = True
        if self.worker is not None:
            clean = self.worker.stop(timeout)
        if self._thread is not None:
            self._thread.join(5.0)
        self.state.close()
        return clean

    # ------------------------------------------------------------------ watches (ZooKeeper's event thread)
    def _on_assignment(self, assignment: Assignment | None) -> None:
        with self._lock:
            self._latest_assignment = assignment
        self._wake.set()

    def _on_status(self, status: str | None) -> None:
        with self._lock:
            self._latest_status = status
        self._wake.set()

    # ------------------------------------------------------------------ start-up
    def _wait_for_assignment(self) -> Assignment | None:
        deadline = time.monotonic() + self.assignment_timeout
        while True:
            with self._lock:
                latest, status = self._latest_assignment, self._latest_status
            if self._stop_early.is_set():
                return None
            if status is None or status == KILLED:
                what = "removed" if status is None else "being killed"
                msg = f"topology {self.topology_id!r} is {what}; worker {self.slot} does not start"
                raise ClusterError(msg)
            if isinstance(latest, Assignment) and self.slot in latest.slots:
                return latest
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ClusterError(self._no_assignment_message(latest))
            self._wake.wait(min(remaining, 1.0))
            self._wake.clear()

    def _no_assignment_message(self, latest: Assignment | _Unset | None) -> str:
        if isinstance(latest, Assignment):
            now = f"assignment v{latest.version} has slots {', '.join(map(str, latest.slots))}"
        else:
            now = "it has no assignment (is a nimbus running? `spark-storm list` shows the leader)"
        return (
            f"worker {self.slot}: no assignment of topology {self.topology_id!r} in ZooKeeper {self.state.address} "
            f"included this slot within worker.assignment.timeout.secs={self.assignment_timeout:g}; {now}. "
            f"--host must be the name the supervisor registered ({self.slot.host!r} here)"
        )

    # ------------------------------------------------------------------ the refresh thread
    def _run(self) -> None:
        """Run the refresh thread: follow the newest status and assignment the watches heard of."""
        worker = self.worker
        assert worker is not None
        while not worker.stopping.is_set():
            # Polls a little while the worker is not yet active: it activates on its own once
            # its connections are ready, and an inactive topology must pause it right after.
            self._wake.wait(0.5 if worker.active else 0.05)
            self._wake.clear()
            if worker.stopping.is_set():
                break
            try:
                self.refresh_active()
                if not worker.stopping.is_set():
                    self.refresh_connections()
            except StormError as exc:
                worker.request_stop(f"cannot follow ZooKeeper: {exc}")

    def refresh_active(self) -> None:
        """Storm's RefreshActive: pause, resume or stop the worker as the topology's newest status says.

        The refresh thread calls it whenever the status watch fires; nothing to do before the worker runs.
        """
        with self._lock:
            status = self._latest_status
        worker = self.worker
        if isinstance(status, _Unset) or worker is None:
            return
        if status is None:
            worker.request_stop(f"topology {self.topology_id} was removed from ZooKeeper", failure=False)
        elif status == KILLED:
            worker.request_stop(f"topology {self.topology_id} was killed", failure=False)
        elif status == INACTIVE:
            if worker.active:
                worker.deactivate()
                self.counters["deactivations"] += 1
            self._paused = True
        elif status == ACTIVE and self._paused:
            self._paused = False
            worker.activate()
            self.counters["activations"] += 1

    def refresh_connections(self) -> None:
        """Storm's RefreshConnections: move the worker to the newest assignment (or stop it when it left the slot).

        New connections first, then an atomic swap and the executors moved
        (:meth:`Worker.refresh`); a new version that places nothing differently only updates
        the version the heartbeats report.  The refresh thread calls it whenever the
        assignment watch fires; nothing to do before the worker runs.
        """
        with self._lock:
            latest = self._latest_assignment
        current = self.assignment
        worker = self.worker
        if isinstance(latest, _Unset) or current is None or worker is None:
            return
        if latest is None:
            worker.request_stop(f"the assignment of {self.topology_id} was removed", failure=False)
            return
        if latest.version <= current.version:
            return
        if self.slot not in latest.slots:
            worker.request_stop(
                f"assignment v{latest.version} of {self.topology_id} no longer includes {self.slot}", failure=False
            )
            return
        if latest.same_placement(current):
            self.assignment = latest
            self._beat()
            return
        assert self.topology is not None
        started = time.monotonic()
        worker.refresh(latest.plan(self.topology))
        self.assignment = latest  # the version is reported (heartbeats) once it runs
        self._beat()  # at once: Spark writers wait for every worker to run a new version
        self.counters["refreshes"] += 1
        logger.info(
            "worker %s followed assignment v%d of %s in %.2fs",
            self.slot,
            latest.version,
            self.topology_id,
            time.monotonic() - started,
        )

    # ------------------------------------------------------------------ timer duty
    def _beat(self) -> None:
        worker = self.worker
        if worker is None:
            return
        with self._beat_lock:  # the timer and the refresh thread: a record is sent before a newer one is built
            record = worker.heartbeat_record()
            record["assignment_version"] = self.version
            self.state.send_heartbeat(self.topology_id, self.slot, record)
