"""Cluster state in ZooKeeper: Storm's layout, typed read/write helpers, watches.

Layout, under the root (``storm.zookeeper.root``, default ``/storm``, or the chroot of
``--zookeeper HOST:PORT/chroot``); every value is UTF-8 JSON::

    /supervisors/<id>               ephemeral  {"id", "host", "ports", "started", "pid"}
    /topologies/<name>              {"name", "source" (the topology YAML text), "status"
                                     (active | inactive | killed), "workers" (asked for),
                                     "submitted", "kill_at"}
    /assignments/<name>             {"topology", "version", "requested", "time", "slots": ["host:port"],
                                     "executors": [[component, first task, last task, "host:port"], ...]}
    /heartbeats/<name>/<host:port>  the worker's heartbeat record ({"time", "pid", "status", ...})
    /nimbus                         kazoo's Election (a lock): one contender node per nimbus process

:class:`ClusterState` owns one ZooKeeper session.  It survives a lost session: kazoo
reconnects, kazoo's watch recipes re-arm themselves, and ephemeral nodes this process
registered are created again on the new session.  Reads and writes retry through a
connection loss (``storm.zookeeper.retry.*``) and then raise
:class:`~spark_storm.errors.ZooKeeperUnavailableError`; :meth:`ClusterState.write_heartbeat`
never raises, so a heartbeat thread keeps running while ZooKeeper is away.

Watch callbacks run on the ZooKeeper client's event thread: keep them short (set an event,
hand work to a thread of your own) and do not block in them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import yaml
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.election import Election
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from spark_storm.config import Config
from spark_storm.errors import (
    ClusterError,
    ConfigError,
    TopologyExistsError,
    UnknownTopologyError,
    ZooKeeperUnavailableError,
)
from spark_storm.topology.assignment import ExecutorSpec, Plan, Slot, parse_slots, plan
from spark_storm.topology.model import Topology, topology_from_dict

__all__ = [
    "ACTIVE",
    "INACTIVE",
    "KILLED",
    "STATUSES",
    "Assignment",
    "ClusterState",
    "Heartbeat",
    "SupervisorInfo",
    "TopologyRecord",
    "Watch",
    "ZooKeeperAddress",
    "check_topology_name",
]

logger = logging.getLogger(__name__)

ACTIVE: Final = "active"
INACTIVE: Final = "inactive"
KILLED: Final = "killed"
STATUSES: Final = (ACTIVE, INACTIVE, KILLED)

SUPERVISORS: Final = "/supervisors"
TOPOLOGIES: Final = "/topologies"
ASSIGNMENTS: Final = "/assignments"
HEARTBEATS: Final = "/heartbeats"
NIMBUS: Final = "/nimbus"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CHROOT = re.compile(r"^(/[A-Za-z0-9._-]+)+$")
_LOCK_NODE = re.compile(r"__lock__\d{10}$")


# ------------------------------------------------------------------ address
@dataclass(frozen=True)
class ZooKeeperAddress:
    """Where the cluster's state lives: ZooKeeper servers and the root znode.

    Attributes
    ----------
    hosts : str
        ``host:port,host:port``.
    root : str
        The chroot every path lives under (``/storm``), or ``""`` for the top.
    """

    hosts: str
    root: str

    def __str__(self) -> str:
        return self.hosts + self.root

    @property
    def spec(self) -> str:
        """``HOST:PORT[,...]/root`` that :meth:`parse` reads back to this address (``/`` for the top)."""
        return self.hosts + (self.root or "/")

    @classmethod
    def parse(cls, spec: str | None, conf: Mapping[str, Any] | None = None) -> ZooKeeperAddress:
        """Parse ``HOST:PORT[,HOST:PORT][/chroot]``; None (or parts left out) come from ``conf``.

        A host without a port gets ``storm.zookeeper.port``; no chroot means
        ``storm.zookeeper.root``; a lone ``/`` means the top of the tree.

        Raises
        ------
        ConfigError
            The value is not of that form (the message names it and shows an example).
        """
        config = Config.of(conf)
        default_port = config.get_int("storm.zookeeper.port", minimum=1)
        example = "e.g. 127.0.0.1:2181 or zk1:2181,zk2:2181/storm"
        if spec is None:
            servers = config["storm.zookeeper.servers"]
            if isinstance(servers, str):
                servers = [servers]
            if not isinstance(servers, list) or not servers or not all(isinstance(s, str) for s in servers):
                msg = f"config key 'storm.zookeeper.servers' must be a list of hosts, got {servers!r}"
                raise ConfigError(msg)
            hosts_part, root = ",".join(servers), str(config["storm.zookeeper.root"] or "")
        else:
            text = spec.strip()
            cut = text.find("/")
            hosts_part = text if cut < 0 else text[:cut]
            root = str(config["storm.zookeeper.root"] or "") if cut < 0 else text[cut:]
        hosts = []
        for part in hosts_part.split(","):
            host, sep, port_text = part.strip().rpartition(":")
            if not sep:
                host, port_text = part.strip(), str(default_port)
            if not host or not port_text.isdigit() or not 0 < int(port_text) <= 65535:
                msg = f"ZooKeeper address {spec or hosts_part!r} is not HOST:PORT[,HOST:PORT][/chroot] ({example})"
                raise ConfigError(msg)
            hosts.append(f"{host}:{int(port_text)}")
        root = root.rstrip("/")
        if root and not _CHROOT.match(root):
            msg = f"ZooKeeper chroot {root!r} in {spec!r} must look like /name or /a/b ({example})"
            raise ConfigError(msg)
        return cls(",".join(hosts), root)


def check_topology_name(name: str) -> str:
    """Return ``name`` if it can name a topology in ZooKeeper, else raise ConfigError."""
    if not isinstance(name, str) or not _NAME.match(name):
        msg = (
            f"topology name {name!r} cannot be used in cluster mode: use letters, digits, '.', '_' and '-' "
            "(starting with a letter or digit, at most 128 characters); rename it in the topology file"
        )
        raise ConfigError(msg)
    return name


# ------------------------------------------------------------------ records
def _dumps(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _loads(data: bytes | None, path: str) -> dict[str, Any]:
    try:
        value = json.loads(data or b"")
    except ValueError as exc:
        msg = f"znode {path} does not hold JSON ({exc}); it was not written by spark-storm"
        raise ClusterError(msg) from exc
    if not isinstance(value, dict):
        msg = f"znode {path} holds {type(value).__name__}, not a JSON object"
        raise ClusterError(msg)
    return value


def _slot(text: str) -> Slot:
    return parse_slots(text)[0]


@dataclass(frozen=True)
class SupervisorInfo:
    """A supervisor's registration: its host and the worker ports (slots) it offers."""

    id: str
    host: str
    ports: tuple[int, ...]
    started: float = 0.0
    pid: int = 0

    @property
    def slots(self) -> tuple[Slot, ...]:
        """The slots this supervisor offers."""
        return tuple(Slot(self.host, p) for p in self.ports)

    def to_json(self) -> bytes:
        """Encode for the znode."""
        return _dumps(
            {"id": self.id, "host": self.host, "ports": list(self.ports), "started": self.started, "pid": self.pid}
        )

    @classmethod
    def from_json(cls, data: bytes, path: str) -> SupervisorInfo:
        """Decode a supervisor znode."""
        raw = _loads(data, path)
        return cls(
            str(raw["id"]),
            str(raw["host"]),
            tuple(int(p) for p in raw["ports"]),
            float(raw.get("started", 0.0)),
            int(raw.get("pid", 0)),
        )


@dataclass(frozen=True)
class TopologyRecord:
    """A submitted topology: its YAML source, status and the number of workers it asks for."""

    name: str
    source: str
    status: str = ACTIVE
    workers: int = 1
    submitted: float = 0.0
    kill_at: float | None = None

    def topology(self) -> Topology:
        """Parse the stored YAML into a :class:`Topology` (the same parser as a topology file)."""
        return topology_from_dict(yaml.safe_load(self.source), origin=f"ZooKeeper {TOPOLOGIES}/{self.name}")

    @property
    def digest(self) -> str:
        """Short hash of the source: the topology's identity across a kill and a resubmit."""
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()[:16]

    def to_json(self) -> bytes:
        """Encode for the znode."""
        return _dumps(
            {
                "name": self.name,
                "source": self.source,
                "status": self.status,
                "workers": self.workers,
                "submitted": self.submitted,
                "kill_at": self.kill_at,
            }
        )

    @classmethod
    def from_json(cls, data: bytes, path: str) -> TopologyRecord:
        """Decode a topology znode."""
        raw = _loads(data, path)
        kill_at = raw.get("kill_at")
        return cls(
            str(raw["name"]),
            str(raw["source"]),
            str(raw.get("status", ACTIVE)),
            int(raw.get("workers", 1)),
            float(raw.get("submitted", 0.0)),
            None if kill_at is None else float(kill_at),
        )


@dataclass(frozen=True)
class Assignment:
    """Where a topology's executors run: version ``version`` of ``/assignments/<topology>``.

    Attributes
    ----------
    topology : str
    version : int
        Increases with every new assignment of this topology (1 for the first).
    slots : tuple[Slot, ...]
        The worker slots, sorted (a slot may hold no executor when there are more slots than executors).
    executors : Mapping[ExecutorSpec, Slot]
        Every executor of the topology and the slot that runs it.
    requested : int
        Workers the topology asked for (the assignment may have fewer when slots are short).
    time : float
        When nimbus wrote it (wall clock, for people).
    """

    topology: str
    version: int
    slots: tuple[Slot, ...]
    executors: Mapping[ExecutorSpec, Slot]
    requested: int = 0
    time: float = 0.0

    @classmethod
    def from_plan(cls, p: Plan, version: int, requested: int | None = None) -> Assignment:
        """Return the assignment that ``p`` (the pure ``plan()``) describes."""
        return cls(
            p.topology.name,
            version,
            tuple(p.slots),
            dict(p.executor_slot),
            len(p.slots) if requested is None else requested,
            time.time(),
        )

    def executors_of(self, slot: Slot) -> list[ExecutorSpec]:
        """Executors assigned to ``slot``, in task order."""
        return sorted(e for e, s in self.executors.items() if s == slot)

    def same_placement(self, other: Assignment | None) -> bool:
        """Return True when ``other`` puts the same executors on the same slots (versions aside)."""
        return other is not None and self.slots == other.slots and dict(self.executors) == dict(other.executors)

    def plan(self, topology: Topology) -> Plan:
        """Return the :class:`Plan` a worker or the Spark driver runs with, for this assignment.

        Task ids and executors come from the pure ``plan()`` (they depend on the topology only);
        the executor -> slot map is this assignment's, whatever placed it.

        Raises
        ------
        ClusterError
            The assignment's executors are not the topology's (it belongs to another topology
            or another version of it).
        """
        if topology.name != self.topology:
            msg = f"assignment of topology {self.topology!r} cannot place topology {topology.name!r}"
            raise ClusterError(msg)
        base = plan(topology, list(self.slots))
        if set(base.executors) != set(self.executors):
            msg = (
                f"assignment v{self.version} of {self.topology!r} does not match the topology's executors "
                f"({', '.join(map(str, base.executors))} vs {', '.join(map(str, sorted(self.executors)))}); "
                "it was made for another version of the topology"
            )
            raise ClusterError(msg)
        executor_slot = {e: self.executors[e] for e in base.executors}
        task_slot = {t: executor_slot[e] for e in base.executors for t in e.tasks}
        return Plan(
            topology,
            tuple(sorted(self.slots)),
            base.component_tasks,
            base.executors,
            executor_slot,
            task_slot,
            base.task_component,
        )

    def to_json(self) -> bytes:
        """Encode for the znode."""
        return _dumps(
            {
                "topology": self.topology,
                "version": self.version,
                "requested": self.requested,
                "time": self.time,
                "slots": [str(s) for s in self.slots],
                "executors": [[e.component, e.first, e.last, str(s)] for e, s in sorted(self.executors.items())],
            }
        )

    @classmethod
    def from_json(cls, data: bytes, path: str) -> Assignment:
        """Decode an assignment znode."""
        raw = _loads(data, path)
        try:
            executors = {ExecutorSpec(int(f), int(last), str(c)): _slot(str(s)) for c, f, last, s in raw["executors"]}
            return cls(
                str(raw["topology"]),
                int(raw["version"]),
                tuple(sorted(_slot(str(s)) for s in raw["slots"])),
                executors,
                int(raw.get("requested", 0)),
                float(raw.get("time", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"znode {path} is not an assignment: {exc!r}"
            raise ClusterError(msg) from exc


@dataclass(frozen=True)
class Heartbeat:
    """A worker's heartbeat as read from ZooKeeper.

    ``version`` is the znode's data version: it changes with every write, so nimbus judges
    liveness by *its own clock* since the version last changed (no clock skew between hosts).
    """

    slot: Slot
    record: Mapping[str, Any]
    version: int
    modified: float = field(default=0.0)


class Watch(Protocol):
    """A registered watch: ``cancel()`` stops further callbacks."""

    def cancel(self) -> None:
        """Stop calling the callback (idempotent)."""


class _Cancellable:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


# ------------------------------------------------------------------ the state
class ClusterState:
    """One ZooKeeper session and the cluster-state operations on it.

    Parameters
    ----------
    zookeeper : str or ZooKeeperAddress, optional
        ``HOST:PORT[,HOST:PORT][/chroot]``; default from ``conf`` (``storm.zookeeper.*``).
    conf : Mapping, optional
        Configuration (defaults fill the rest).

    Use as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(self, zookeeper: str | ZooKeeperAddress | None = None, conf: Mapping[str, Any] | None = None) -> None:
        self.conf = Config.of(conf)
        self.address = (
            zookeeper if isinstance(zookeeper, ZooKeeperAddress) else ZooKeeperAddress.parse(zookeeper, self.conf)
        )
        self.root = self.address.root
        self._session_timeout = self.conf.get_int("storm.zookeeper.session.timeout", minimum=1) / 1000
        self._connect_timeout = self.conf.get_int("storm.zookeeper.connection.timeout", minimum=1) / 1000
        retry_times = self.conf.get_int("storm.zookeeper.retry.times", minimum=0)
        retry_delay = self.conf.get_int("storm.zookeeper.retry.interval", minimum=1) / 1000
        retry_ceiling = self.conf.get_int("storm.zookeeper.retry.intervalceiling.millis", minimum=1) / 1000
        self._retry_times, self._retry_delay, self._retry_ceiling = retry_times, retry_delay, retry_ceiling
        self.client = KazooClient(
            hosts=self.address.hosts,
            timeout=self._session_timeout,
            # Reconnect forever: a process in cluster mode waits out a ZooKeeper outage.
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 2.0},
            command_retry={"max_tries": retry_times + 1, "delay": retry_delay, "max_delay": retry_ceiling},
        )
        self._lock = threading.Lock()
        self._ephemeral: dict[str, bytes] = {}  # path -> data, re-created after a lost session
        self._listeners: list[Callable[[str], None]] = []
        self._restore_needed = False
        self._closed = False
        self.session_losses = 0
        self._heartbeat_failing = False
        self.identity = f"{socket.gethostname()}:{os.getpid()}"
        self.client.add_listener(self._on_state)

    # -- lifecycle ------------------------------------------------------------------
    def start(self, timeout: float | None = None) -> ClusterState:
        """Connect (within ``storm.zookeeper.connection.timeout`` unless ``timeout``) and create the layout.

        Raises
        ------
        ZooKeeperUnavailableError
            No ZooKeeper answered in time (the message names the address and the fix).
        """
        wait = self._connect_timeout if timeout is None else timeout
        try:
            self.client.start(timeout=wait)
        except KazooTimeoutError as exc:
            msg = (
                f"cannot connect to ZooKeeper at {self.address.hosts} within {wait:.0f}s: start it "
                "(`spark-storm zookeeper start`) or fix --zookeeper / storm.zookeeper.servers"
            )
            raise ZooKeeperUnavailableError(msg) from exc
        for path in (SUPERVISORS, TOPOLOGIES, ASSIGNMENTS, HEARTBEATS, NIMBUS):
            self._ensure_path(self._path(path))
        logger.info("connected to ZooKeeper %s (session timeout %.1fs)", self.address, self._session_timeout)
        return self

    def close(self) -> None:
        """Delete this process's ephemeral nodes (by closing the session) and disconnect."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._ephemeral.clear()
        try:
            self.client.stop()
        finally:
            self.client.close()

    def __enter__(self) -> ClusterState:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        """Whether the session is connected right now."""
        return bool(self.client.connected)

    def wait_connected(self, timeout: float) -> bool:
        """Wait until the session is connected; False after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not self.client.connected:
            if time.monotonic() > deadline or self._closed:
                return False
            time.sleep(0.05)
        return True

    def add_state_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener("connected" | "suspended" | "lost")`` on session changes (event thread)."""
        self._listeners.append(listener)

    def session_id(self) -> int | None:
        """Return the session id (it changes after a lost session), or None when not connected."""
        cid = self.client.client_id
        return None if cid is None else int(cid[0])

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: no ZooKeeper calls here.
        if self._closed:
            return
        if state == KazooState.LOST:
            self.session_losses += 1
            self._restore_needed = True
            logger.warning("ZooKeeper session lost (%s); reconnecting with a new session", self.address)
            name = "lost"
        elif state == KazooState.SUSPENDED:
            logger.warning("ZooKeeper connection suspended (%s); retrying", self.address)
            name = "suspended"
        else:
            logger.info("ZooKeeper connected (%s)", self.address)
            name = "connected"
            if self._restore_needed and not self._closed:
                self._restore_needed = False
                self.client.handler.spawn(self._restore_ephemerals)
        for listener in list(self._listeners):
            try:
                listener(name)
            except Exception as exc:  # one failing listener must not starve the others
                logger.exception("ZooKeeper state listener %r failed on %r: %r", listener, name, exc)

    def _restore_ephemerals(self) -> None:
        with self._lock:
            nodes = dict(self._ephemeral)
        for path, data in nodes.items():
            try:
                self._create_ephemeral(path, data)
                logger.info("re-registered %s after a lost ZooKeeper session", path)
            except (ZooKeeperUnavailableError, KazooException) as exc:
                logger.warning("could not re-register %s yet (%r); will retry on the next connection", path, exc)
                self._restore_needed = True

    def _create_ephemeral(self, path: str, data: bytes) -> None:
        try:
            self._call(f"create {path}", "create", path, data, ephemeral=True, makepath=True)
        except NodeExistsError:
            _, stat = self._call(f"read {path}", "get", path)
            if stat.ephemeralOwner != self.session_id():
                msg = (
                    f"znode {path} is held by another live ZooKeeper session (another process with the same id); "
                    "stop it or use another id"
                )
                raise ClusterError(msg) from None
            self._call(f"write {path}", "set", path, data)

    # -- plumbing -------------------------------------------------------------------
    def _path(self, *parts: str) -> str:
        return self.root + "/".join(("", *(p.strip("/") for p in parts)))

    def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``client.<method>_async(...)`` with the retry budget; never blocks on a dead connection.

        kazoo queues a request made while disconnected until it reconnects, which would block a
        synchronous call for as long as ZooKeeper is away: so each attempt is made only while
        connected, waits at most the session timeout, and between attempts we wait (with
        backoff) for the connection to come back.
        """
        call = getattr(self.client, f"{method}_async")
        delay, last = self._retry_delay, "not connected"
        for attempt in range(self._retry_times + 1):
            if self.client.connected:
                try:
                    return call(*args, **kwargs).get(timeout=self._session_timeout)
                except (ConnectionLoss, SessionExpiredError, KazooTimeoutError) as exc:
                    last = type(exc).__name__
                except ConnectionClosedError as exc:
                    raise self._unavailable(what, "client closed") from exc
            if attempt < self._retry_times:
                self.wait_connected(delay)
                delay = min(delay * 2, self._retry_ceiling)
        raise self._unavailable(what, last)

    def _unavailable(self, what: str, reason: str) -> ZooKeeperUnavailableError:
        msg = (
            f"ZooKeeper at {self.address} did not answer ({what}: {reason}); check that it runs "
            "(`spark-storm zookeeper status`) and is reachable, or raise storm.zookeeper.retry.times"
        )
        return ZooKeeperUnavailableError(msg)

    def _get(self, path: str) -> tuple[bytes, Any] | None:
        try:
            data, stat = self._call(f"read {path}", "get", path)
        except NoNodeError:
            return None
        return data, stat

    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self._call(f"list {path}", "get_children", path))
        except NoNodeError:
            return []

    def _ensure_path(self, path: str) -> None:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            node = "/" + "/".join(parts[:i])
            with contextlib.suppress(NodeExistsError):
                self._call(f"create {node}", "create", node, b"")

    def _delete_tree(self, path: str) -> None:
        for child in self._children(path):
            self._delete_tree(f"{path}/{child}")
        # NotEmpty: a child was written meanwhile; the next pass removes it.
        with contextlib.suppress(NoNodeError, NotEmptyError):
            self._call(f"delete {path}", "delete", path)

    # -- supervisors ----------------------------------------------------------------
    def register_supervisor(self, info: SupervisorInfo) -> None:
        """Create ``/supervisors/<id>`` (ephemeral; created again after a lost session)."""
        path = self._path(SUPERVISORS, info.id)
        data = info.to_json()
        with self._lock:
            self._ephemeral[path] = data
        self._create_ephemeral(path, data)

    def unregister_supervisor(self, supervisor_id: str) -> None:
        """Remove this process's supervisor registration."""
        path = self._path(SUPERVISORS, supervisor_id)
        with self._lock:
            self._ephemeral.pop(path, None)
        with contextlib.suppress(NoNodeError):
            self._call(f"delete {path}", "delete", path)

    def supervisors(self) -> dict[str, SupervisorInfo]:
        """Every registered (live) supervisor, by id."""
        out = {}
        for sid in self._children(self._path(SUPERVISORS)):
            path = self._path(SUPERVISORS, sid)
            got = self._get(path)
            if got is not None:
                try:
                    out[sid] = SupervisorInfo.from_json(got[0], path)
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
        path = self._path(TOPOLOGIES, record.name)
        try:
            self._call(f"create {path}", "create", path, record.to_json())
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
        return self._children(self._path(TOPOLOGIES))

    def find_topology(self, name: str) -> TopologyRecord | None:
        """Return the topology record, or None when no topology of that name is submitted."""
        path = self._path(TOPOLOGIES, name)
        got = self._get(path)
        return None if got is None else TopologyRecord.from_json(got[0], path)

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
        path = self._path(TOPOLOGIES, name)
        while True:
            got = self._get(path)
            if got is None:
                raise self._unknown(name)
            updated = change(TopologyRecord.from_json(got[0], path))
            try:
                self._call(f"write {path}", "set", path, updated.to_json(), version=got[1].version)
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
            return TopologyRecord(
                record.name,
                record.source,
                status,
                record.workers,
                record.submitted,
                kill_at if status == KILLED else None,
            )

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
            return TopologyRecord(record.name, record.source, record.status, workers, record.submitted, record.kill_at)

        return self._update_topology(name, change)

    def remove_topology(self, name: str) -> None:
        """Delete a topology with its assignment and heartbeats (nimbus, after a kill)."""
        self._delete_tree(self._path(ASSIGNMENTS, name))
        self._delete_tree(self._path(HEARTBEATS, name))
        self._delete_tree(self._path(TOPOLOGIES, name))

    # -- assignments ----------------------------------------------------------------
    def assignment_names(self) -> list[str]:
        """Topologies that have an assignment, sorted."""
        return self._children(self._path(ASSIGNMENTS))

    def read_assignment(self, name: str) -> Assignment | None:
        """Return the current assignment of ``name``, or None (not assigned yet, or removed)."""
        path = self._path(ASSIGNMENTS, name)
        got = self._get(path)
        return None if got is None else Assignment.from_json(got[0], path)

    def write_assignment(self, assignment: Assignment) -> bool:
        """Write ``assignment`` if its version is newer than the stored one; False if not.

        The compare-and-set on the znode's version means two writers (a leader that lost its
        session and the one that replaced it) never overwrite a newer assignment.
        """
        path = self._path(ASSIGNMENTS, assignment.topology)
        data = assignment.to_json()
        while True:
            got = self._get(path)
            if got is None:
                try:
                    self._call(f"create {path}", "create", path, data, makepath=True)
                    return True
                except NodeExistsError:
                    continue
            current = Assignment.from_json(got[0], path)
            if current.version >= assignment.version:
                logger.warning(
                    "not writing assignment v%d of %s: v%d is already there",
                    assignment.version,
                    assignment.topology,
                    current.version,
                )
                return False
            try:
                self._call(f"write {path}", "set", path, data, version=got[1].version)
                return True
            except (BadVersionError, NoNodeError):
                continue

    def delete_assignment(self, name: str) -> None:
        """Remove a topology's assignment (its workers stop)."""
        self._delete_tree(self._path(ASSIGNMENTS, name))

    # -- heartbeats -----------------------------------------------------------------
    def write_heartbeat(self, topology: str, slot: Slot, record: Mapping[str, Any]) -> bool:
        """Write a worker's heartbeat; never raises: False (logged) while ZooKeeper is unreachable.

        One attempt, no retry loop: the heartbeat thread calls again at its next beat.
        """
        path = self._path(HEARTBEATS, topology, str(slot))
        data = _dumps(record)
        if not self.client.connected:
            logger.warning(
                "heartbeat of %s/%s not written: not connected to ZooKeeper %s", topology, slot, self.address
            )
            return False
        wait = max(1.0, self._session_timeout / 3)
        try:
            try:
                self.client.set_async(path, data).get(timeout=wait)
            except NoNodeError:
                try:
                    self.client.create_async(path, data, makepath=True).get(timeout=wait)
                except NodeExistsError:
                    self.client.set_async(path, data).get(timeout=wait)
            return True
        except (KazooException, KazooTimeoutError) as exc:
            logger.warning(
                "heartbeat of %s/%s not written (%s); ZooKeeper %s", topology, slot, type(exc).__name__, self.address
            )
            return False

    def send_heartbeat(self, topology: str, slot: Slot, record: Mapping[str, Any]) -> bool:
        """Start writing a worker's heartbeat and return at once (a timer duty must not block).

        Returns False when the session is not connected (nothing is queued: the next beat
        writes a fresher record).  A failed write is logged once per outage, not per beat.
        """
        path = self._path(HEARTBEATS, topology, str(slot))
        data = _dumps(record)
        if not self.client.connected:
            self._heartbeat_trouble(topology, slot, "not connected")
            return False

        def created(result: Any) -> None:
            try:
                result.get_nowait()
                self._heartbeat_failing = False
            except NodeExistsError:
                self.client.set_async(path, data).rawlink(written)
            except Exception as exc:
                self._heartbeat_trouble(topology, slot, type(exc).__name__)

        def written(result: Any) -> None:
            try:
                result.get_nowait()
                self._heartbeat_failing = False
            except NoNodeError:
                self.client.create_async(path, data, makepath=True).rawlink(created)
            except Exception as exc:
                self._heartbeat_trouble(topology, slot, type(exc).__name__)

        try:
            self.client.set_async(path, data).rawlink(written)
        except (KazooException, KazooTimeoutError) as exc:
            self._heartbeat_trouble(topology, slot, type(exc).__name__)
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

    def read_heartbeats(self, topology: str) -> dict[Slot, Heartbeat]:
        """Every worker heartbeat of ``topology``, by slot."""
        out = {}
        base = self._path(HEARTBEATS, topology)
        for child in self._children(base):
            got = self._get(f"{base}/{child}")
            if got is None:
                continue
            try:
                slot = _slot(child)
                out[slot] = Heartbeat(slot, _loads(got[0], f"{base}/{child}"), got[1].version, got[1].mtime / 1000)
            except (ClusterError, ConfigError) as exc:
                logger.warning("ignoring heartbeat znode %s/%s: %s", base, child, exc)
        return out

    def delete_heartbeat(self, topology: str, slot: Slot) -> None:
        """Remove one worker's heartbeat (its slot left the assignment)."""
        self._delete_tree(self._path(HEARTBEATS, topology, str(slot)))

    # -- watches --------------------------------------------------------------------
    def watch_assignment(self, name: str, callback: Callable[[Assignment | None], None]) -> Watch:
        """Call ``callback`` with the current assignment now, then with each newer version.

        ``callback(None)`` means the topology has no assignment (not yet, or removed after a
        kill).  A lost session does not lose the watch: it is re-armed on the new session and
        fires if a newer version was written meanwhile.
        """
        path = self._path(ASSIGNMENTS, name)
        handle = _Cancellable()
        seen = {"version": -1}

        def on_data(data: bytes | None, stat: Any) -> bool | None:
            if handle.cancelled:
                return False
            if data is None:
                if seen["version"] != 0:
                    seen["version"] = 0
                    _safe(callback, None, what=f"assignment watch of {name}")
                return None
            try:
                assignment = Assignment.from_json(data, path)
            except ClusterError as exc:
                logger.error("%s", exc)
                return None
            if assignment.version > seen["version"]:
                seen["version"] = assignment.version
                _safe(callback, assignment, what=f"assignment watch of {name}")
            return None

        DataWatch(self.client, path, on_data)
        return handle

    def watch_status(self, name: str, callback: Callable[[str | None], None]) -> Watch:
        """Call ``callback`` with the topology's status now and on every change; None once it is removed."""
        path = self._path(TOPOLOGIES, name)
        handle = _Cancellable()
        seen: dict[str, str | None] = {"status": ""}

        def on_data(data: bytes | None, stat: Any) -> bool | None:
            if handle.cancelled:
                return False
            status = None if data is None else TopologyRecord.from_json(data, path).status
            if status != seen["status"]:
                seen["status"] = status
                _safe(callback, status, what=f"status watch of {name}")
            return None

        DataWatch(self.client, path, on_data)
        return handle

    def watch_topology(self, name: str, callback: Callable[[TopologyRecord | None], None]) -> Watch:
        """Call ``callback`` with the topology record now and on every change (status, workers); None once removed."""
        path = self._path(TOPOLOGIES, name)
        handle = _Cancellable()

        def on_data(data: bytes | None, stat: Any) -> bool | None:
            if handle.cancelled:
                return False
            try:
                record = None if data is None else TopologyRecord.from_json(data, path)
            except (ClusterError, KeyError, TypeError, ValueError) as exc:
                logger.error("ignoring topology znode %s: %r", path, exc)
                return None
            _safe(callback, record, what=f"topology watch of {name}")
            return None

        DataWatch(self.client, path, on_data)
        return handle

    def _watch_children(self, path: str, callback: Callable[[list[str]], None]) -> Watch:
        handle = _Cancellable()

        def on_children(children: list[str]) -> bool | None:
            if handle.cancelled:
                return False
            _safe(callback, sorted(children), what=f"children watch of {path}")
            return None

        ChildrenWatch(self.client, path, on_children)
        return handle

    def watch_supervisors(self, callback: Callable[[list[str]], None]) -> Watch:
        """Call ``callback`` with the supervisor ids now and whenever one comes or goes."""
        return self._watch_children(self._path(SUPERVISORS), callback)

    def watch_topologies(self, callback: Callable[[list[str]], None]) -> Watch:
        """Call ``callback`` with the topology names now and whenever one is submitted or removed."""
        return self._watch_children(self._path(TOPOLOGIES), callback)

    def watch_assignments(self, callback: Callable[[list[str]], None]) -> Watch:
        """Call ``callback`` with the assigned topology names now and whenever one is added or removed."""
        return self._watch_children(self._path(ASSIGNMENTS), callback)

    # -- nimbus ---------------------------------------------------------------------
    def election(self, identifier: str) -> Election:
        """Return kazoo's leader election among nimbus processes (``/nimbus``)."""
        return Election(self.client, self._path(NIMBUS), identifier)

    def nimbus_contenders(self) -> list[str]:
        """Return the identifiers of the running nimbus processes, the leader first.

        The election is kazoo's lock: one sequential node per contender, the lowest sequence
        holds it, and each node's data is the contender's identifier.
        """
        base = self._path(NIMBUS)
        nodes = [c for c in self._children(base) if _LOCK_NODE.search(c)]
        out = []
        for node in sorted(nodes, key=lambda c: c[-10:]):
            got = self._get(f"{base}/{node}")
            if got is not None:
                out.append(got[0].decode("utf-8", "replace"))
        return out

    def nimbus_leader(self) -> str | None:
        """Return the identifier (``host:pid``) of the leader nimbus, or None when none runs."""
        contenders = self.nimbus_contenders()
        return contenders[0] if contenders else None


def _safe(callback: Callable[[Any], None], value: Any, *, what: str) -> None:
    try:
        callback(value)
    except Exception as exc:  # a watch callback raising must not end kazoo's watch
        logger.exception("%s: callback %r failed: %r", what, callback, exc)
