"""The UI's source for cluster mode: the cluster's state in ZooKeeper.

One reading (about once a second) lists what nimbus and the workers keep there:

* ``/topologies/<name>``: status (``active`` / ``inactive`` / ``killed``), submit time
  (the topology's uptime), the number of workers asked for;
* ``/assignments/<name>``: the version, the slots and the executors on each;
* ``/heartbeats/<name>/<host:port>``: each worker's record (pid, status, uptime, executors,
  ``metrics_port``: its HTTP endpoint, read like a local cluster's workers);
* ``/supervisors/<id>``: hosts and their slots (used = named by an assignment);
* ``/nimbus``: the election, leader first.

The UI shows what nimbus judges: a slot's owner and whether it is used, and a worker's
liveness, come from :mod:`spark_storm.cluster.liveness` with nimbus's timeouts
(``nimbus.task.timeout.secs``, ``nimbus.task.launch.secs``), measured on this process's
clock (hosts' clocks may differ): a worker is ``starting`` until its first heartbeat and
``dead`` when nimbus would reassign its slot.  Everything is read through
:class:`~spark_storm.cluster.state.ClusterState` (its retries, its records).

Actions are :mod:`spark_storm.cluster.admin`'s, the functions behind ``spark-storm
activate | deactivate | rebalance | kill``: status changes that every worker follows, a
new worker count nimbus reassigns, a kill nimbus completes after its wait.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from spark_storm.cluster import admin
from spark_storm.cluster.liveness import DEAD, STARTING, WorkerLiveness, slot_owners
from spark_storm.cluster.records import KILLED, Assignment, HeartbeatZnode
from spark_storm.cluster.state import ClusterState
from spark_storm.config import Config
from spark_storm.errors import (
    ActionNotSupportedError,
    CheckpointError,
    ClusterError,
    ConfigError,
    SavepointError,
    StormError,
    TopologyActionError,
    UnknownTopologyError,
    ZooKeeperUnavailableError,
)
from spark_storm.reports import metrics_endpoint
from spark_storm.topology.assignment import Slot
from spark_storm.ui.source import ClusterView, NimbusInfo, SupervisorView, TopologyRef, WorkerRef

__all__ = ["ZooKeeperSource"]

logger = logging.getLogger(__name__)

_REBALANCE_KEYS: Final = frozenset({"numWorkers", "executors"})


class ZooKeeperSource:
    """Topologies, workers, supervisors and nimbus of a cluster whose state is in ZooKeeper.

    Parameters
    ----------
    state : spark_storm.cluster.state.ClusterState
        A started session on the cluster's ZooKeeper (and root).  A nimbus serving the UI
        passes its own; :meth:`connect` opens one.
    liveness : WorkerLiveness, optional
        Judges workers alive, starting or dead; default nimbus's rules with the timeouts of
        ``state.conf`` (``nimbus.task.timeout.secs``, ``nimbus.task.launch.secs``).
    close_state : bool
        Close ``state`` in :meth:`close` (True when this source opened it).
    """

    kind = "cluster"

    def __init__(
        self, state: ClusterState, liveness: WorkerLiveness | None = None, *, close_state: bool = False
    ) -> None:
        self.zk = state
        self.liveness = liveness or WorkerLiveness.from_conf(state.conf)
        self._close_state = close_state
        self._lock = threading.Lock()
        self._last: ClusterView | None = None
        self._outage_since: float | None = None
        self._rebalances: dict[str, threading.Timer] = {}

    @classmethod
    def connect(cls, zookeeper: str | None, conf: Config) -> ZooKeeperSource:
        """Open a session on ``zookeeper`` (``HOST:PORT[/chroot]``; None: ``storm.zookeeper.*``).

        Raises
        ------
        ZooKeeperUnavailableError
            ZooKeeper did not answer within ``storm.zookeeper.connection.timeout``.
        ConfigError
            The address is not of that form.
        """
        return cls(ClusterState(zookeeper, conf).start(), close_state=True)

    @property
    def description(self) -> str:
        """Where the cluster's state is read from."""
        return f"cluster: ZooKeeper {self.zk.address}"

    # ------------------------------------------------------------------ reading
    def state(self) -> ClusterView:
        """Read the cluster; while ZooKeeper is unreachable, the last reading (the description says so)."""
        try:
            reading = self._read()
        except ZooKeeperUnavailableError as exc:
            with self._lock:
                if self._outage_since is None:
                    self._outage_since = time.time()
                    logger.warning("UI: %s; showing the last reading until it answers", exc)
                since = time.strftime("%H:%M:%S", time.localtime(self._outage_since))
                last = self._last
            note = f"ZooKeeper {self.zk.address} unreachable since {since}: showing its last reading"
            if last is None:
                return ClusterView(self.kind, f"{self.description} ({note})", (), rebalance_supported=True)
            return dataclasses.replace(last, description=f"{last.description} ({note})")
        with self._lock:
            if self._outage_since is not None:
                logger.info("UI: ZooKeeper %s answers again", self.zk.address)
            self._outage_since = None
            self._last = reading
        return reading

    def _read(self) -> ClusterView:
        now = time.time()
        supervisors = self.zk.supervisors()
        owner, _conflicts = slot_owners(supervisors)  # nimbus logs the conflicts
        used: set[Slot] = set()
        seen: set[tuple[str, Slot]] = set()
        topologies = []
        for name in self.zk.topology_names():
            record = self.zk.find_topology(name)
            if record is None:
                continue  # removed since the listing
            try:
                assignment = self.zk.read_assignment(name)
            except ClusterError as exc:  # not an assignment spark-storm wrote: show the heartbeats alone
                logger.warning("UI: %s", exc)
                assignment = None
            heartbeats = self.zk.read_heartbeats(name)
            slots = list(assignment.slots) if assignment is not None else []
            slots += sorted(s for s in heartbeats if s not in slots)  # a worker leaving a rebalance
            if assignment is not None:
                used.update(assignment.slots)
            workers = []
            for slot in slots:
                seen.add((name, slot))
                workers.append(self._worker(name, slot, assignment, heartbeats.get(slot), owner))
            topologies.append(
                TopologyRef(
                    name,
                    name,
                    tuple(workers),
                    self._status(name, record.status),
                    max(0.0, now - record.submitted) if record.submitted else None,
                    assignment.version if assignment is not None else None,
                    record.workers,
                )
            )
        self.liveness.retain(seen)
        sups = tuple(
            SupervisorView(
                sid,
                info.host,
                len(info.ports),
                sum(1 for s in info.slots if s in used and owner.get(s) == sid),
                max(0.0, now - info.started) if info.started else None,
                tuple(info.ports),
            )
            for sid, info in sorted(supervisors.items())
        )
        return ClusterView(
            kind=self.kind,
            description=self.description,
            topologies=tuple(topologies),
            supervisors=sups,
            nimbus=self._nimbuses(now),
            rebalance_supported=True,
        )

    def _status(self, name: str, status: str) -> str:
        with self._lock:
            timer = self._rebalances.get(name)
        if status != KILLED and timer is not None and timer.is_alive():
            return "REBALANCING"
        return status.upper()

    def _worker(
        self,
        topology: str,
        slot: Slot,
        assignment: Assignment | None,
        heartbeat: HeartbeatZnode | None,
        owner: Mapping[Slot, str],
    ) -> WorkerRef:
        executors: tuple[str, ...] = ()
        if assignment is not None and slot in assignment.slots:
            executors = tuple(str(e) for e in assignment.executors_of(slot))
        verdict = self.liveness.judge(topology, slot, heartbeat, owner)
        if heartbeat is None:  # assigned; its supervisor has not started it yet, or it never came
            status = DEAD if verdict.dead else STARTING
            return WorkerRef(topology, slot.host, slot.port, status, owner.get(slot, ""), executors=executors)
        record = heartbeat.record
        status = record["status"]
        if verdict.dead and status != "stopped":  # a stopped worker's last record says so: it ended in order
            status = DEAD
        endpoint = metrics_endpoint(record, slot.host)
        return WorkerRef(
            topology=topology,
            host=slot.host,
            port=slot.port,
            status=status,
            supervisor=owner.get(slot, ""),
            heartbeat_time=heartbeat.modified or None,
            uptime_s=float(record["uptime_s"]),
            pid=record["pid"],
            metrics_host=endpoint[0] if endpoint else slot.host,
            metrics_port=endpoint[1] if endpoint else None,
            executors=executors or tuple(record["executors"]),
        )

    def _nimbuses(self, now: float) -> tuple[NimbusInfo, ...]:
        """Return the election's contenders, leader first, with their uptime in the election."""
        out = []
        for i, contender in enumerate(self.zk.nimbus_contenders()):
            host, _, pid_text = contender.id.rpartition(":")
            out.append(
                NimbusInfo(
                    host=host or contender.id,
                    port=None,
                    status="Leader" if i == 0 else "Not a Leader",
                    uptime_s=max(0.0, now - contender.since),
                    id=contender.id,
                    pid=int(pid_text) if pid_text.isdigit() else None,
                )
            )
        return tuple(out)

    # ------------------------------------------------------------------ actions
    def _act(self, topology_id: str, what: str, action: Callable[[], object]) -> None:
        """Run an admin function; errors become the protocol's classes, with the cause's message."""
        try:
            action()
        except (UnknownTopologyError, ConfigError, ActionNotSupportedError):
            raise
        except ClusterError as exc:  # no nimbus, ZooKeeper away, a topology being killed
            msg = f"{what} of {topology_id!r} failed: {exc}"
            raise TopologyActionError(msg) from exc
        logger.info("UI: %s of %s written to ZooKeeper %s", what, topology_id, self.zk.address)

    def activate(self, topology_id: str) -> None:
        """Set the topology active (``spark-storm activate``); every worker follows the status."""
        self._act(topology_id, "activate", lambda: admin.activate(self.zk, topology_id))

    def deactivate(self, topology_id: str) -> None:
        """Set the topology inactive (``spark-storm deactivate``): executors pause, workers stay up."""
        self._act(topology_id, "deactivate", lambda: admin.deactivate(self.zk, topology_id))

    def rebalance(self, topology_id: str, wait_secs: int, options: Mapping[str, Any]) -> None:
        """Ask for ``rebalanceOptions.numWorkers`` workers (``spark-storm rebalance``), after ``wait_secs``.

        Checked now (the topology, nimbus, the options); written now for a wait of 0, else
        by a timer in this process (the topology shows ``REBALANCING`` meanwhile).  The
        workers move executors in place, so nothing is paused during the wait.
        """
        workers = _num_workers(topology_id, options)
        executors = _executors(topology_id, options)
        if wait_secs < 0:
            msg = f"rebalance wait time must be >= 0 seconds, got {wait_secs}"
            raise ConfigError(msg)

        def check() -> None:
            record = self.zk.read_topology(topology_id)
            if record.status == KILLED:
                msg = f"topology {topology_id!r} is being killed; it cannot be rebalanced"
                raise ClusterError(msg)
            admin.require_nimbus(self.zk)

        self._act(topology_id, "rebalance", check)
        if wait_secs == 0:
            self._act(topology_id, "rebalance", lambda: admin.rebalance(self.zk, topology_id, workers, executors))
            return

        def later() -> None:
            try:
                self._act(topology_id, "rebalance", lambda: admin.rebalance(self.zk, topology_id, workers, executors))
            except StormError as exc:
                logger.error("UI: delayed rebalance of %s (workers %s) failed: %s", topology_id, workers, exc)
            finally:
                with self._lock:
                    if self._rebalances.get(topology_id) is timer:
                        del self._rebalances[topology_id]

        timer = threading.Timer(wait_secs, later)
        timer.daemon = True
        timer.name = f"spark-storm-ui-rebalance-{topology_id}"
        with self._lock:
            previous = self._rebalances.pop(topology_id, None)
            self._rebalances[topology_id] = timer
        if previous is not None:
            previous.cancel()  # the newer request wins, as a second `spark-storm rebalance` would
        timer.start()
        logger.info("UI: rebalance of %s to %d workers in %ds", topology_id, workers, wait_secs)

    def kill(self, topology_id: str, wait_secs: int) -> None:
        """Kill the topology (``spark-storm kill --wait``): workers stop now, nimbus removes it after the wait."""
        if wait_secs < 0:
            msg = f"kill wait time must be >= 0 seconds, got {wait_secs}"
            raise ConfigError(msg)
        with self._lock:
            pending = self._rebalances.pop(topology_id, None)
        if pending is not None:
            pending.cancel()
        self._act(topology_id, "kill", lambda: admin.kill(self.zk, topology_id, float(wait_secs)))

    def savepoint(self, topology_id: str, directory: str) -> dict[str, Any]:
        """Write a savepoint (``spark-storm savepoint``): a running worker of the topology coordinates it."""
        self.zk.read_topology(topology_id)  # UnknownTopologyError first
        try:
            return admin.savepoint(self.zk, topology_id, directory)
        except (SavepointError, CheckpointError) as exc:
            msg = f"savepoint of {topology_id!r} failed: {exc}"
            raise TopologyActionError(msg) from exc

    def close(self) -> None:
        """Cancel delayed rebalances; close the ZooKeeper session if this source opened it."""
        with self._lock:
            timers, self._rebalances = list(self._rebalances.values()), {}
        for t in timers:
            t.cancel()
        if self._close_state:
            self.zk.close()


def _executors(topology_id: str, options: Mapping[str, Any]) -> dict[str, int]:
    """Storm's ``rebalanceOptions.executors``: ``{component: executors}`` (checked by the rebalance itself)."""
    raw = options.get("executors") or {}
    if not isinstance(raw, Mapping) or not all(isinstance(n, int) and not isinstance(n, bool) for n in raw.values()):
        msg = f'rebalance of {topology_id!r}: "executors" must map component ids to whole numbers, got {raw!r}'
        raise ConfigError(msg)
    return {str(c): int(n) for c, n in raw.items()}


def _num_workers(topology_id: str, options: Mapping[str, Any]) -> int | None:
    unknown = sorted(set(options) - _REBALANCE_KEYS)
    if unknown:
        msg = (
            f"rebalance of {topology_id!r}: unknown rebalanceOptions {', '.join(map(repr, unknown))}; "
            'give {"rebalanceOptions": {"numWorkers": N}}'
        )
        raise ConfigError(msg)
    workers = options.get("numWorkers")
    if workers is None and options.get("executors"):
        return None
    if workers is None:
        msg = (
            f'rebalance of {topology_id!r} needs {{"rebalanceOptions": {{"numWorkers": N}}}}: the new number of '
            "workers (nimbus already spreads the workers over the supervisors evenly)"
        )
        raise ConfigError(msg)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        msg = f"rebalance of {topology_id!r}: numWorkers must be a whole number >= 1, got {workers!r}"
        raise ConfigError(msg)
    return workers
