"""The cluster's records in ZooKeeper, and their JSON: supervisors, topologies, assignments, heartbeats.

Layout, under the root (``storm.zookeeper.root``, default ``/storm``, or the chroot of
``--zookeeper HOST:PORT/chroot``); every value is UTF-8 JSON::

    /supervisors/<id>               ephemeral  {"id", "host", "ports", "started", "pid"}
    /topologies/<name>              {"name", "source" (the topology YAML text), "status"
                                     (active | inactive | killed), "workers" (asked for),
                                     "submitted", "kill_at"}
    /assignments/<name>             {"topology", "version", "requested", "time", "slots": ["host:port"],
                                     "executors": [[component, first task, last task, "host:port"], ...]}
    /heartbeats/<name>/<host:port>  the worker's heartbeat (:class:`~spark_storm.reports.WorkerHeartbeat`)
    /nimbus                         kazoo's Election (a lock): one contender node per nimbus process
    /spark/<name>                   a topology hosted by a Spark application (``spark_storm.spark.deploy``):
                                    {"name", "app", "driver", "started", "own_zookeeper", "supervisors", "retired"}
    /spark/<name>/driver            ephemeral: the driver's lease (its supervisor tasks end when it is gone)

A supervisor registered by such a deployment names its topology (``"topology"``): nimbus gives
its slots to that topology only.

Each record class reads and writes its znode's JSON; a znode spark-storm did not write
raises :class:`~spark_storm.errors.ClusterError` naming the path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from spark_storm.errors import ClusterError, ConfigError
from spark_storm.reports import WorkerHeartbeat
from spark_storm.topology.assignment import ExecutorSpec, Plan, Slot, parse_slots, plan
from spark_storm.topology.loader import topology_from_dict
from spark_storm.topology.model import Topology

__all__ = [
    "ACTIVE",
    "ASSIGNMENTS",
    "HEARTBEATS",
    "INACTIVE",
    "KILLED",
    "LAYOUT",
    "NIMBUS",
    "SPARK",
    "STATUSES",
    "SUPERVISORS",
    "TOPOLOGIES",
    "Assignment",
    "HeartbeatZnode",
    "HostedDeployment",
    "NimbusContender",
    "SupervisorInfo",
    "TopologyRecord",
    "check_topology_name",
    "dumps",
    "loads",
    "parse_slot",
]

ACTIVE: Final = "active"
INACTIVE: Final = "inactive"
KILLED: Final = "killed"
STATUSES: Final = (ACTIVE, INACTIVE, KILLED)

SUPERVISORS: Final = "/supervisors"
TOPOLOGIES: Final = "/topologies"
ASSIGNMENTS: Final = "/assignments"
HEARTBEATS: Final = "/heartbeats"
NIMBUS: Final = "/nimbus"
#: Topologies hosted by Spark applications (``spark_storm.spark.deploy``); created when first used.
SPARK: Final = "/spark"
#: The znodes every cluster has under its root.
LAYOUT: Final = (SUPERVISORS, TOPOLOGIES, ASSIGNMENTS, HEARTBEATS, NIMBUS)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_topology_name(name: str) -> str:
    """Return ``name`` if it can name a topology in ZooKeeper, else raise ConfigError."""
    if not isinstance(name, str) or not _NAME.match(name):
        msg = (
            f"topology name {name!r} cannot be used in cluster mode: use letters, digits, '.', '_' and '-' "
            "(starting with a letter or digit, at most 128 characters); rename it in the topology file"
        )
        raise ConfigError(msg)
    return name


def dumps(value: Mapping[str, Any]) -> bytes:
    """Encode a record for its znode (compact JSON, sorted keys)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


def loads(data: bytes | None, path: str) -> dict[str, Any]:
    """Decode a znode's JSON object.

    Raises
    ------
    ClusterError
        Not JSON, or not an object (the message names the path).
    """
    try:
        value = json.loads(data or b"")
    except ValueError as exc:
        msg = f"znode {path} does not hold JSON ({exc}); it was not written by spark-storm"
        raise ClusterError(msg) from exc
    if not isinstance(value, dict):
        msg = f"znode {path} holds {type(value).__name__}, not a JSON object"
        raise ClusterError(msg)
    return value


def parse_slot(text: str) -> Slot:
    """Parse one ``host:port`` (a heartbeat znode's name, a slot in an assignment)."""
    return parse_slots(text)[0]


@dataclass(frozen=True)
class SupervisorInfo:
    """A supervisor's registration: its host and the worker ports (slots) it offers.

    ``topology``: the topology its slots are dedicated to (a supervisor task of a Spark-hosted
    deployment), or None for a supervisor any topology may use.
    """

    id: str
    host: str
    ports: tuple[int, ...]
    started: float = 0.0
    pid: int = 0
    topology: str | None = None

    @property
    def slots(self) -> tuple[Slot, ...]:
        """The slots this supervisor offers."""
        return tuple(Slot(self.host, p) for p in self.ports)

    def to_json(self) -> bytes:
        """Encode for the znode."""
        record: dict[str, Any] = {
            "id": self.id,
            "host": self.host,
            "ports": list(self.ports),
            "started": self.started,
            "pid": self.pid,
        }
        if self.topology is not None:
            record["topology"] = self.topology
        return dumps(record)

    @classmethod
    def from_json(cls, data: bytes, path: str) -> SupervisorInfo:
        """Decode a supervisor znode."""
        raw = loads(data, path)
        dedicated = raw.get("topology")
        return cls(
            str(raw["id"]),
            str(raw["host"]),
            tuple(int(p) for p in raw["ports"]),
            float(raw.get("started", 0.0)),
            int(raw.get("pid", 0)),
            None if dedicated is None else str(dedicated),
        )


@dataclass(frozen=True)
class TopologyRecord:
    """A submitted topology: its YAML source, status, the workers it asks for and executor overrides.

    ``executors`` is what ``spark-storm rebalance --executors COMPONENT=N`` asked for: a
    component's executors (within its task count, which never changes).  Nimbus plans with
    it; the workers and the Spark driver read it back from the assignment (its executors).
    """

    name: str
    source: str
    status: str = ACTIVE
    workers: int = 1
    submitted: float = 0.0
    kill_at: float | None = None
    executors: Mapping[str, int] = field(default_factory=dict)

    def topology(self) -> Topology:
        """Parse the stored YAML into a :class:`Topology` (the same parser as a topology file), executors applied."""
        topo = topology_from_dict(yaml.safe_load(self.source), origin=f"ZooKeeper {TOPOLOGIES}/{self.name}")
        return with_parallelism(topo, self.executors) if self.executors else topo

    @property
    def digest(self) -> str:
        """Short hash of the source: the topology's identity across a kill and a resubmit."""
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()[:16]

    def to_json(self) -> bytes:
        """Encode for the znode."""
        return dumps(
            {
                "name": self.name,
                "source": self.source,
                "status": self.status,
                "workers": self.workers,
                "submitted": self.submitted,
                "kill_at": self.kill_at,
                "executors": dict(self.executors),
            }
        )

    @classmethod
    def from_json(cls, data: bytes, path: str) -> TopologyRecord:
        """Decode a topology znode."""
        raw = loads(data, path)
        kill_at = raw.get("kill_at")
        return cls(
            str(raw["name"]),
            str(raw["source"]),
            str(raw.get("status", ACTIVE)),
            int(raw.get("workers", 1)),
            float(raw.get("submitted", 0.0)),
            None if kill_at is None else float(kill_at),
            {str(c): int(n) for c, n in dict(raw.get("executors") or {}).items()},
        )


def with_parallelism(topology: Topology, executors: Mapping[str, int]) -> Topology:
    """Return ``topology`` with these components' executors (parallelism); their task counts stay.

    Raises
    ------
    ConfigError
        An unknown component, or a count outside 1 .. its task count.
    """
    components = dict(topology.components)
    for cid, count in executors.items():
        comp = components.get(cid)
        if comp is None:
            msg = f"topology {topology.name!r} has no component {cid!r} (it has {', '.join(sorted(components))})"
            raise ConfigError(msg)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= comp.num_tasks:
            msg = (
                f"component {cid!r} of {topology.name!r}: executors must be 1 .. {comp.num_tasks} (its tasks, fixed "
                f"when the topology was submitted), got {count!r}"
            )
            raise ConfigError(msg)
        components[cid] = dataclasses.replace(comp, parallelism=count, tasks=comp.num_tasks)
    return dataclasses.replace(topology, components=components)


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
        counts: dict[str, int] = {}
        for spec in self.executors:
            counts[spec.component] = counts.get(spec.component, 0) + 1
        changed = {
            c: n for c, n in counts.items() if c in topology.components and topology.components[c].parallelism != n
        }
        if changed:  # a rebalance --executors: the assignment's executors are the ones that run
            with contextlib.suppress(ConfigError):  # counts no task range allows: refused just below
                topology = with_parallelism(topology, changed)
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
        return dumps(
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
        raw = loads(data, path)
        try:
            executors = {
                ExecutorSpec(int(f), int(last), str(c)): parse_slot(str(s)) for c, f, last, s in raw["executors"]
            }
            return cls(
                str(raw["topology"]),
                int(raw["version"]),
                tuple(sorted(parse_slot(str(s)) for s in raw["slots"])),
                executors,
                int(raw.get("requested", 0)),
                float(raw.get("time", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"znode {path} is not an assignment: {exc!r}"
            raise ClusterError(msg) from exc


@dataclass(frozen=True)
class HeartbeatZnode:
    """A worker's heartbeat znode as read from ZooKeeper: the record and the znode's version.

    ``version`` is the znode's data version: it changes with every write, so liveness is
    judged by the *reader's own clock* since the version last changed (no clock skew
    between hosts; :mod:`spark_storm.cluster.liveness`).  ``modified`` is ZooKeeper's
    ``mtime`` (seconds, the server's clock), for people.
    """

    slot: Slot
    record: WorkerHeartbeat
    version: int
    modified: float = 0.0


@dataclass(frozen=True)
class NimbusContender:
    """A nimbus process in the leader election: its identifier (``host:pid``) and since when it contends.

    ``since`` is its election node's creation time (ZooKeeper's clock, seconds).
    """

    id: str
    since: float


@dataclass(frozen=True)
class HostedDeployment:
    """A topology hosted by a Spark application: ``/spark/<name>``, written by ``deploy()`` on the driver.

    Attributes
    ----------
    name : str
        The topology.
    app : str
        The Spark application id (for people, and for the UI).
    driver : str
        ``host:pid`` of the process that called ``deploy()``.
    started : float
        Wall clock.
    own_zookeeper : bool
        ``deploy()`` started this ZooKeeper, so losing it means the driver is gone (supervisor
        tasks then end); a ZooKeeper of the user's may be away for a while, workers keep running.
    supervisors : int
        Supervisor tasks the deployment keeps (one worker slot each).
    retired : tuple[int, ...]
        Indexes of supervisor tasks told to end (a rebalance to fewer workers).
    """

    name: str
    app: str
    driver: str
    started: float
    own_zookeeper: bool
    supervisors: int
    retired: tuple[int, ...] = ()

    def to_json(self) -> bytes:
        """Encode for the znode."""
        return dumps(
            {
                "name": self.name,
                "app": self.app,
                "driver": self.driver,
                "started": self.started,
                "own_zookeeper": self.own_zookeeper,
                "supervisors": self.supervisors,
                "retired": list(self.retired),
            }
        )

    @classmethod
    def from_json(cls, data: bytes, path: str) -> HostedDeployment:
        """Decode a deployment znode."""
        raw = loads(data, path)
        try:
            return cls(
                str(raw["name"]),
                str(raw.get("app", "")),
                str(raw.get("driver", "")),
                float(raw.get("started", 0.0)),
                bool(raw.get("own_zookeeper", False)),
                int(raw.get("supervisors", 0)),
                tuple(int(i) for i in raw.get("retired", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"znode {path} is not a Spark-hosted deployment: {exc!r}"
            raise ClusterError(msg) from exc
