"""The cluster's state in ZooKeeper: typed operations on Storm's layout, watches and the nimbus election.

:class:`ClusterState` is what nimbus, supervisors, cluster-mode workers, the Spark driver,
``spark-storm submit | list | kill ...`` and the UI use: the records of
:mod:`spark_storm.cluster.records` read and written on one
:class:`~spark_storm.cluster.session.ZooKeeperSession` (its :attr:`ClusterState.session`:
connection state, retries, raw reads).  Reads and writes retry through a connection loss
and then raise :class:`~spark_storm.errors.ZooKeeperUnavailableError`, except
:meth:`ClusterState.send_heartbeat`, which never blocks nor raises, so a heartbeat thread
keeps running while ZooKeeper is away.

Watch callbacks run on the ZooKeeper client's event thread: keep them short (set an event,
hand work to a thread of your own) and do not block in them.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from spark_storm.cluster.records import (
    ASSIGNMENTS,
    HEARTBEATS,
    KILLED,
    LAYOUT,
    NIMBUS,
    STATUSES,
    SUPERVISORS,
    TOPOLOGIES,
    Assignment,
    HeartbeatZnode,
    NimbusContender,
    SupervisorInfo,
    TopologyRecord,
    check_topology_name,
    dumps,
    parse_slot,
    with_parallelism,
)
from spark_storm.cluster.session import Watch, ZooKeeperAddress, ZooKeeperSession
from spark_storm.errors import (
    ClusterError,
    ConfigError,
    ReportFormatError,
    TopologyExistsError,
    UnknownTopologyError,
)
from spark_storm.reports import WorkerHeartbeat, parse_heartbeat
from spark_storm.topology.assignment import Slot

__all__ = ["ClusterState"]

logger = logging.getLogger(__name__)

#: kazoo's Election is a lock recipe: one ``...__lock__<10-digit sequence>`` node per contender.
_CONTENDER: Final = re.compile(r"__lock__(\d{10})$")


class ClusterState:
    """The cluster-state operations, on one ZooKeeper session.

    Parameters
    ----------
    zookeeper : str or ZooKeeperAddress, optional
        ``HOST:PORT[,HOST:PORT][/chroot]``; default from ``conf`` (``storm.zookeeper.*``).
    conf : Mapping, optional
        Configuration (defaults fill the rest).

    Use as a context manager, or call :meth:`start` and :meth:`close`.  The session
    (:attr:`session`) answers for the connection: ``state.session.connected``,
    ``wait_connected``, ``add_state_listener``.
    """

    def __init__(self, zookeeper: str | ZooKeeperAddress | None = None, conf: Mapping[str, Any] | None = None) -> None:
        self.session = ZooKeeperSession(zookeeper, conf)
        self.conf = self.session.conf
        self.address = self.session.address
        self._heartbeat_failing = False

    # -- lifecycle ------------------------------------------------------------------
    def start(self, timeout: float | None = None) -> ClusterState:
        """Connect (within ``storm.zookeeper.connection.timeout`` unless ``timeout``) and create the layout.

        Raises
        ------
        ZooKeeperUnavailableError
            No ZooKeeper answered in time (the message names the address and the fix).
        """
        self.session.start(timeout)
        for path in LAYOUT:
            self.session.ensure_path(self.session.path(path))
        return self

    def close(self) -> None:
        """Delete this process's ephemeral nodes (by closing the session) and disconnect."""
        self.session.close()

    def __enter__(self) -> ClusterState:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- supervisors ----------------------------------------------------------------
    def register_supervisor(self, info: SupervisorInfo) -> None:
        """Create ``/supervisors/<id>`` (ephemeral; created again after a lost session)."""
        path = self.session.path(SUPERVISORS, info.id)
        data = info.to_json()
        self.session.register_ephemeral(path, data)

    def unregister_supervisor(self, supervisor_id: str) -> None:
        """Remove this process's supervisor registration."""
        path = self.session.path(SUPERVISORS, supervisor_id)
        self.session.unregister_ephemeral(path)

    def supervisors(self) -> dict[str, SupervisorInfo]:
        """Every registered (live) supervisor, by id."""
        out = {}
        for sid in self.session.children(self.session.path(SUPERVISORS)):
            path = self.session.path(SUPERVISORS, sid)
            got = self.session.read(path)
            if got is not None:
                try:
                    out[sid] = SupervisorInfo.from_json(got.data, path)
                except (ClusterError, KeyError, TypeError, ValueError) as exc:
                    logger.warning("ignoring supervisor znode %s: %r", path, exc)
        return out

    # -- topologies -----------------------------------------------------------------
    def submit_topology(self, record: TopologyRecord) -> TopologyRecord:
        """Create ``/topologies/<name>``.

        Raises
        ------
        TopologyExistsError
            A topology of that name is already submitted (the message says its status and the fix).
        """
        check_topology_name(record.name)
        path = self.session.path(TOPOLOGIES, record.name)
        try:
            self.session.call(f"create {path}", "create", path, record.to_json())
        except NodeExistsError:
            current = self.find_topology(record.name)
            status = current.status if current else "being removed"
            msg = (
                f"topology {record.name!r} is already submitted ({status}): kill it first "
                f"(`spark-storm kill {record.name}`) or give the new one another name"
            )
            raise TopologyExistsError(msg) from None
        return record

    def topology_names(self) -> list[str]:
        """Names of the submitted topologies, sorted."""
        return self.session.children(self.session.path(TOPOLOGIES))

    def find_topology(self, name: str) -> TopologyRecord | None:
        """Return the topology record, or None when no topology of that name is submitted."""
        path = self.session.path(TOPOLOGIES, name)
        got = self.session.read(path)
        return None if got is None else TopologyRecord.from_json(got.data, path)

    def read_topology(self, name: str) -> TopologyRecord:
        """Return the topology record.

        Raises
        ------
        UnknownTopologyError
            No topology of that name (the message lists the submitted ones).
        """
        record = self.find_topology(name)
        if record is None:
            raise self._unknown(name)
        return record

    def _unknown(self, name: str) -> UnknownTopologyError:
        names = self.topology_names()
        known = f"submitted: {', '.join(names)}" if names else "none is submitted"
        msg = f"no topology {name!r} in ZooKeeper {self.address} ({known}; `spark-storm list` shows them)"
        return UnknownTopologyError(msg)

    def _update_topology(self, name: str, change: Callable[[TopologyRecord], TopologyRecord]) -> TopologyRecord:
        path = self.session.path(TOPOLOGIES, name)
        while True:
            got = self.session.read(path)
            if got is None:
                raise self._unknown(name)
            updated = change(TopologyRecord.from_json(got.data, path))
            try:
                self.session.call(f"write {path}", "set", path, updated.to_json(), version=got.version)
                return updated
            except BadVersionError:
                continue  # written meanwhile: apply the change to the new value
            except NoNodeError:
                raise self._unknown(name) from None

    def set_status(self, name: str, status: str, *, kill_at: float | None = None) -> TopologyRecord:
        """Set a topology's status (``active``, ``inactive`` or ``killed`` with the time to remove it)."""
        if status not in STATUSES:
            msg = f"topology status {status!r} is not one of {', '.join(STATUSES)}"
            raise ConfigError(msg)

        def change(record: TopologyRecord) -> TopologyRecord:
            if record.status == KILLED and status != KILLED:
                msg = f"topology {name!r} is being killed; it cannot be made {status}"
                raise ClusterError(msg)
            return dataclasses.replace(record, status=status, kill_at=kill_at if status == KILLED else None)

        return self._update_topology(name, change)

    def set_workers(self, name: str, workers: int) -> TopologyRecord:
        """Ask for ``workers`` worker processes (rebalance); nimbus reassigns."""
        if workers < 1:
            msg = f"a topology needs at least 1 worker, got {workers}"
            raise ConfigError(msg)

        def change(record: TopologyRecord) -> TopologyRecord:
            if record.status == KILLED:
                msg = f"topology {name!r} is being killed; it cannot be rebalanced"
                raise ClusterError(msg)
            return dataclasses.replace(record, workers=workers)

        return self._update_topology(name, change)

    def set_executors(self, name: str, executors: Mapping[str, int]) -> TopologyRecord:
        """Ask for these components' executors (``rebalance --executors``); nimbus reassigns."""

        def change(record: TopologyRecord) -> TopologyRecord:
            if record.status == KILLED:
                msg = f"topology {name!r} is being killed; it cannot be rebalanced"
                raise ClusterError(msg)
            wanted = {**record.executors, **executors}
            with_parallelism(record.topology(), executors)  # ConfigError naming the component and the range
            return dataclasses.replace(record, executors=wanted)

        return self._update_topology(name, change)

    def remove_topology(self, name: str) -> None:
        """Delete a topology with its assignment and heartbeats (nimbus, after a kill)."""
        self.session.delete_tree(self.session.path(ASSIGNMENTS, name))
        self.session.delete_tree(self.session.path(HEARTBEATS, name))
        self.session.delete_tree(self.session.path(TOPOLOGIES, name))

    # -- assignments ----------------------------------------------------------------
    def assignment_names(self) -> list[str]:
        """Topologies that have an assignment, sorted."""
        return self.session.children(self.session.path(ASSIGNMENTS))

    def read_assignment(self, name: str) -> Assignment | None:
        """Return the current assignment of ``name``, or None (not assigned yet, or removed)."""
        path = self.session.path(ASSIGNMENTS, name)
        got = self.session.read(path)
        return None if got is None else Assignment.from_json(got.data, path)

    def write_assignment(self, assignment: Assignment) -> bool:
        """Write ``assignment`` if its version is newer than the stored one; False if not.

        The compare-and-set on the znode's version means two writers (a leader that lost its
        session and the one that replaced it) never overwrite a newer assignment.
        """
        path = self.session.path(ASSIGNMENTS, assignment.topology)
        data = assignment.to_json()
        while True:
            got = self.session.read(path)
            if got is None:
                try:
                    self.session.call(f"create {path}", "create", path, data, makepath=True)
                    return True
                except NodeExistsError:
                    continue
            current = Assignment.from_json(got.data, path)
            if current.version >= assignment.version:
                logger.warning(
                    "not writing assignment v%d of %s: v%d is already there",
                    assignment.version,
                    assignment.topology,
                    current.version,
                )
                return False
            try:
                self.session.call(f"write {path}", "set", path, data, version=got.version)
                return True
            except (BadVersionError, NoNodeError):
                continue

    def delete_assignment(self, name: str) -> None:
        """Remove a topology's assignment (its workers stop)."""
        self.session.delete_tree(self.session.path(ASSIGNMENTS, name))

    # -- heartbeats -----------------------------------------------------------------
    def send_heartbeat(self, topology: str, slot: Slot, record: WorkerHeartbeat) -> bool:
        """Start writing a worker's heartbeat and return at once (a timer duty must not block).

        Returns False when the session is not connected (nothing is queued: the next beat
        writes a fresher record).  A failed write is logged once per outage, not per beat.
        """

        def done(trouble: str | None) -> None:
            if trouble is None:
                self._heartbeat_failing = False
            else:
                self._heartbeat_trouble(topology, slot, trouble)

        path = self.session.path(HEARTBEATS, topology, str(slot))
        if not self.session.put_nowait(path, dumps(record), done):
            if not self.session.connected:
                self._heartbeat_trouble(topology, slot, "not connected")
            return False
        return True

    def _heartbeat_trouble(self, topology: str, slot: Slot, reason: str) -> None:
        if not self._heartbeat_failing:
            self._heartbeat_failing = True
            logger.warning(
                "heartbeats of %s/%s not reaching ZooKeeper %s (%s); the worker runs on and retries every beat",
                topology,
                slot,
                self.address,
                reason,
            )

    def read_heartbeats(self, topology: str) -> dict[Slot, HeartbeatZnode]:
        """Every worker heartbeat of ``topology``, by slot (a znode that is not a heartbeat is logged and left out)."""
        out = {}
        base = self.session.path(HEARTBEATS, topology)
        for child in self.session.children(base):
            path = f"{base}/{child}"
            got = self.session.read(path)
            if got is None:
                continue
            try:
                slot = parse_slot(child)
                out[slot] = HeartbeatZnode(slot, parse_heartbeat(got.data, f"znode {path}"), got.version, got.modified)
            except (ReportFormatError, ConfigError) as exc:
                logger.warning("ignoring heartbeat znode %s: %s", path, exc)
        return out

    def delete_heartbeat(self, topology: str, slot: Slot) -> None:
        """Remove one worker's heartbeat (its slot left the assignment)."""
        self.session.delete_tree(self.session.path(HEARTBEATS, topology, str(slot)))

    # -- watches --------------------------------------------------------------------
    def watch_assignment(self, name: str, callback: Callable[[Assignment | None], None]) -> Watch:
        """Call ``callback`` with the current assignment now, then with each newer version.

        ``callback(None)`` means the topology has no assignment (not yet, or removed after a
        kill).  A lost session does not lose the watch: it is re-armed on the new session and
        fires if a newer version was written meanwhile.
        """
        path = self.session.path(ASSIGNMENTS, name)
        seen = -1  # the newest version handed to the callback; 0 once it was told "none"

        def on_data(data: bytes | None) -> None:
            nonlocal seen
            if data is None:
                if seen != 0:
                    seen = 0
                    callback(None)
                return
            try:
                assignment = Assignment.from_json(data, path)
            except ClusterError as exc:
                logger.error("%s", exc)
                return
            if assignment.version > seen:
                seen = assignment.version
                callback(assignment)

        return self.session.watch_data(path, on_data, what=f"assignment watch of {name}")

    def watch_status(self, name: str, callback: Callable[[str | None], None]) -> Watch:
        """Call ``callback`` with the topology's status now and on every change; None once it is removed."""
        path = self.session.path(TOPOLOGIES, name)
        seen: str | None = ""

        def on_data(data: bytes | None) -> None:
            nonlocal seen
            try:
                status = None if data is None else TopologyRecord.from_json(data, path).status
            except (ClusterError, KeyError, TypeError, ValueError) as exc:
                logger.error("ignoring topology znode %s: %r", path, exc)
                return
            if status != seen:
                seen = status
                callback(status)

        return self.session.watch_data(path, on_data, what=f"status watch of {name}")

    def watch_topology(self, name: str, callback: Callable[[TopologyRecord | None], None]) -> Watch:
        """Call ``callback`` with the topology record now and on every change (status, workers); None once removed."""
        path = self.session.path(TOPOLOGIES, name)

        def on_data(data: bytes | None) -> None:
            try:
                record = None if data is None else TopologyRecord.from_json(data, path)
            except (ClusterError, KeyError, TypeError, ValueError) as exc:
                logger.error("ignoring topology znode %s: %r", path, exc)
                return
            callback(record)

        return self.session.watch_data(path, on_data, what=f"topology watch of {name}")

    def watch_supervisors(self, callback: Callable[[list[str]], None]) -> Watch:
        """Call ``callback`` with the supervisor ids now and whenever one comes or goes."""
        path = self.session.path(SUPERVISORS)
        return self.session.watch_children(path, callback, what=f"children watch of {path}")

    def watch_topologies(self, callback: Callable[[list[str]], None]) -> Watch:
        """Call ``callback`` with the topology names now and whenever one is submitted or removed."""
        path = self.session.path(TOPOLOGIES)
        return self.session.watch_children(path, callback, what=f"children watch of {path}")

    def watch_assignments(self, callback: Callable[[list[str]], None]) -> Watch:
        """Call ``callback`` with the assigned topology names now and whenever one is added or removed."""
        path = self.session.path(ASSIGNMENTS)
        return self.session.watch_children(path, callback, what=f"children watch of {path}")

    # -- nimbus ---------------------------------------------------------------------
    def election(self, identifier: str) -> Any:
        """Return kazoo's leader election among nimbus processes (``/nimbus``)."""
        return self.session.election(self.session.path(NIMBUS), identifier)

    def nimbus_contenders(self) -> list[NimbusContender]:
        """Return the running nimbus processes, the leader first.

        The election is kazoo's lock: one sequential node per contender, the lowest sequence
        holds it, and each node's data is the contender's identifier (``host:pid``).
        """
        base = self.session.path(NIMBUS)
        nodes = sorted((m.group(1), c) for c in self.session.children(base) if (m := _CONTENDER.search(c)))
        out = []
        for _sequence, node in nodes:
            got = self.session.read(f"{base}/{node}")
            if got is not None:  # None: that nimbus left meanwhile
                out.append(NimbusContender(got.data.decode("utf-8", "replace"), got.created))
        return out

    def nimbus_leader(self) -> str | None:
        """Return the identifier (``host:pid``) of the leader nimbus, or None when none runs."""
        contenders = self.nimbus_contenders()
        return contenders[0].id if contenders else None
