"""The UI's source for cluster mode: the cluster's state in ZooKeeper.

One reading (about once a second) lists what nimbus and the workers keep there:

* ``/topologies/<name>``: status (``active`` / ``inactive`` / ``killed``), submit time
  (the topology's uptime), the number of workers asked for;
* ``/assignments/<name>``: the version, the slots and the executors on each;
* ``/heartbeats/<name>/<host:port>``: each worker's record (pid, status, uptime, executors,
  ``metrics_port``: its HTTP endpoint, read like a local cluster's workers);
* ``/supervisors/<id>``: hosts and their slots (used = named by an assignment);
* ``/nimbus``: the election, leader first.

A worker's liveness is judged as nimbus judges it, on this process's clock: a heartbeat
znode whose version has not changed for ``ui.worker.timeout.secs`` is ``dead`` (hosts'
clocks may differ).  Actions are :mod:`spark_storm.cluster.admin`'s, the functions behind
``spark-storm activate | deactivate | rebalance | kill``: status changes that every worker
follows, a new worker count nimbus reassigns, a kill nimbus completes after its wait.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from spark_storm.cluster import admin
from spark_storm.cluster import state as zk
from spark_storm.config import Config
from spark_storm.errors import (
    ActionNotSupportedError,
    ClusterError,
    ConfigError,
    StormError,
    TopologyActionError,
    UnknownTopologyError,
    ZooKeeperUnavailableError,
)
from spark_storm.topology.assignment import Slot
from spark_storm.ui.source import ClusterState, NimbusInfo, SupervisorInfo, TopologyRef, WorkerRef

__all__ = ["ZooKeeperSource"]

logger = logging.getLogger(__name__)

#: kazoo's Election is a lock recipe: one ``...__lock__<10-digit sequence>`` node per contender.
_CONTENDER: Final = re.compile(r"__lock__(\d{10})$")
_WILDCARD_HOSTS: Final = frozenset({"", "0.0.0.0", "::", "[::]"})
_REBALANCE_KEYS: Final = frozenset({"numWorkers", "executors"})


class ZooKeeperSource:
    """Topologies, workers, supervisors and nimbus of a cluster whose state is in ZooKeeper.

    Parameters
    ----------
    state : spark_storm.cluster.state.ClusterState
        A started session on the cluster's ZooKeeper (and root).  A nimbus serving the UI
        passes its own; :meth:`connect` opens one.
    worker_timeout_s : float
        A heartbeat znode unchanged this long (on this process's clock) marks its worker
        ``dead`` (``ui.worker.timeout.secs``).
    close_state : bool
        Close ``state`` in :meth:`close` (True when this source opened it).
    """

    kind = "cluster"

    def __init__(self, state: zk.ClusterState, worker_timeout_s: float = 10.0, *, close_state: bool = False) -> None:
        self.zk = state
        self.worker_timeout_s = worker_timeout_s
        self._close_state = close_state
        self._read_timeout_s = state.conf.get_int("storm.zookeeper.session.timeout", minimum=1) / 1000
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, Slot], tuple[int, float]] = {}  # heartbeat version, when it last changed
        self._last: ClusterState | None = None
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
        state = zk.ClusterState(zookeeper, conf).start()
        return cls(state, float(conf.get_int("ui.worker.timeout.secs", minimum=1)), close_state=True)

    @property
    def description(self) -> str:
        """Where the cluster's state is read from."""
        return f"cluster: ZooKeeper {self.zk.address}"

    # ------------------------------------------------------------------ reading
    def state(self) -> ClusterState:
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
                return ClusterState(self.kind, f"{self.description} ({note})", (), rebalance_supported=True)
            return dataclasses.replace(last, description=f"{last.description} ({note})")
        with self._lock:
            if self._outage_since is not None:
                logger.info("UI: ZooKeeper %s answers again", self.zk.address)
            self._outage_since = None
            self._last = reading
        return reading

    def _read(self) -> ClusterState:
        now = time.time()
        supervisors = self.zk.supervisors()
        owner: dict[Slot, str] = {}
        for sid, info in sorted(supervisors.items()):
            for slot in info.slots:
                owner.setdefault(slot, sid)  # a slot offered twice: the first, as nimbus does
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
        with self._lock:
            for key in set(self._seen) - seen:
                del self._seen[key]
        sups = tuple(
            SupervisorInfo(
                sid,
                info.host,
                len(info.ports),
                sum(1 for s in info.slots if s in used and owner.get(s) == sid),
                max(0.0, now - info.started) if info.started else None,
                tuple(info.ports),
            )
            for sid, info in sorted(supervisors.items())
        )
        return ClusterState(
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
        if status != zk.KILLED and timer is not None and timer.is_alive():
            return "REBALANCING"
        return status.upper()

    def _worker(
        self,
        topology: str,
        slot: Slot,
        assignment: zk.Assignment | None,
        heartbeat: zk.Heartbeat | None,
        owner: Mapping[Slot, str],
    ) -> WorkerRef:
        executors: tuple[str, ...] = ()
        if assignment is not None and slot in assignment.slots:
            executors = tuple(str(e) for e in assignment.executors_of(slot))
        if heartbeat is None:  # assigned, its supervisor has not started it yet
            return WorkerRef(topology, slot.host, slot.port, "starting", owner.get(slot, ""), executors=executors)
        record = heartbeat.record
        status = str(record.get("status", "running"))
        mono = time.monotonic()
        with self._lock:
            version, since = self._seen.get((topology, slot), (None, mono))
            if version != heartbeat.version:
                since = mono
                self._seen[(topology, slot)] = (heartbeat.version, mono)
        if status != "stopped" and mono - since > self.worker_timeout_s:
            status = "dead"
        mhost = record.get("metrics_host")
        mport = record.get("metrics_port")
        pid = record.get("pid")
        uptime = record.get("uptime_s")
        return WorkerRef(
            topology=topology,
            host=slot.host,
            port=slot.port,
            status=status,
            supervisor=owner.get(slot, ""),
            heartbeat_time=heartbeat.modified or None,
            uptime_s=float(uptime) if isinstance(uptime, int | float) else None,
            pid=pid if isinstance(pid, int) else None,
            # a worker's endpoint on its metrics host when it names one, else on its slot's host
            metrics_host=mhost if isinstance(mhost, str) and mhost not in _WILDCARD_HOSTS else slot.host,
            metrics_port=mport if isinstance(mport, int) and not isinstance(mport, bool) else None,
            executors=executors or tuple(str(e) for e in record.get("executors") or ()),
        )

    def _nimbuses(self, now: float) -> tuple[NimbusInfo, ...]:
        """Return the election's contenders, leader first (the lowest sequence holds kazoo's lock).

        Read here rather than with ``ClusterState.nimbus_contenders()`` because the UI also
        wants each contender node's creation time (the nimbus's uptime in the election).
        """
        base = f"{self.zk.root}/nimbus"
        nodes = sorted(
            ((m.group(1), child) for child in self._zk("list", base) or () if (m := _CONTENDER.search(child))),
        )
        out = []
        for i, (_seq, child) in enumerate(nodes):
            got = self._zk("get", f"{base}/{child}")
            if got is None:
                continue  # that nimbus left meanwhile
            identifier = got[0].decode("utf-8", "replace")
            host, _, pid_text = identifier.rpartition(":")
            out.append(
                NimbusInfo(
                    host=host or identifier,
                    port=None,
                    status="Leader" if i == 0 else "Not a Leader",
                    uptime_s=max(0.0, now - got[1].ctime / 1000),
                    id=identifier,
                    pid=int(pid_text) if pid_text.isdigit() else None,
                )
            )
        if out and out[0].status != "Leader":  # the leader's node vanished between the list and the read
            out[0] = dataclasses.replace(out[0], status="Leader")
        return tuple(out)

    def _zk(self, op: str, path: str) -> Any:
        """One read on the session (``list`` or ``get``); None if the node is gone.

        Never waits on a disconnected session (kazoo would queue the request until it
        reconnects): the reading is skipped with ZooKeeperUnavailableError instead.
        """
        client = self.zk.client
        if not client.connected:
            msg = f"ZooKeeper at {self.zk.address} is not connected (reading {path})"
            raise ZooKeeperUnavailableError(msg)
        call = client.get_children_async if op == "list" else client.get_async
        try:
            return call(path).get(timeout=self._read_timeout_s)
        except NoNodeError:
            return None
        except (KazooException, KazooTimeoutError) as exc:
            msg = f"ZooKeeper at {self.zk.address} did not answer (reading {path}: {type(exc).__name__})"
            raise ZooKeeperUnavailableError(msg) from exc

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
        if wait_secs < 0:
            msg = f"rebalance wait time must be >= 0 seconds, got {wait_secs}"
            raise ConfigError(msg)

        def check() -> None:
            record = self.zk.read_topology(topology_id)
            if record.status == zk.KILLED:
                msg = f"topology {topology_id!r} is being killed; it cannot be rebalanced"
                raise ClusterError(msg)
            admin.require_nimbus(self.zk)

        self._act(topology_id, "rebalance", check)
        if wait_secs == 0:
            self._act(topology_id, "rebalance", lambda: admin.rebalance(self.zk, topology_id, workers))
            return

        def later() -> None:
            try:
                self._act(topology_id, "rebalance", lambda: admin.rebalance(self.zk, topology_id, workers))
            except StormError as exc:
                logger.error("UI: delayed rebalance of %s to %d workers failed: %s", topology_id, workers, exc)
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

    def close(self) -> None:
        """Cancel delayed rebalances; close the ZooKeeper session if this source opened it."""
        with self._lock:
            timers, self._rebalances = list(self._rebalances.values()), {}
        for t in timers:
            t.cancel()
        if self._close_state:
            self.zk.close()


def _num_workers(topology_id: str, options: Mapping[str, Any]) -> int:
    unknown = sorted(set(options) - _REBALANCE_KEYS)
    if unknown:
        msg = (
            f"rebalance of {topology_id!r}: unknown rebalanceOptions {', '.join(map(repr, unknown))}; "
            'give {"rebalanceOptions": {"numWorkers": N}}'
        )
        raise ConfigError(msg)
    if options.get("executors"):
        msg = (
            f"rebalance of {topology_id!r}: changing a component's executors is not possible in spark-storm "
            "(parallelism and tasks are fixed in the topology file: kill it and submit the changed file); "
            "rebalance changes numWorkers"
        )
        raise ActionNotSupportedError(msg)
    workers = options.get("numWorkers")
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
