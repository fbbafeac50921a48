"""What the UI needs from a cluster: the seam between the pages and where the cluster lives.

A :class:`ClusterSource` answers "which topologies run, on which workers, in what state"
and carries out the topology actions.  The UI itself never reads heartbeat files or
ZooKeeper: it asks the source for a :class:`ClusterView`, then reads each worker's own
``GET /health`` for the numbers (:mod:`spark_storm.ui.sampler`).

Sources:

* :class:`spark_storm.ui.local.LocalClusterSource` — ``spark-storm local-cluster`` and
  standalone ``spark-storm worker`` processes, found through their heartbeat files;
  activate/deactivate go to each worker's HTTP endpoint, kill is the ordered stop
  (SIGTERM) of its workers, rebalance is not possible (fixed slots).
* :class:`spark_storm.ui.zookeeper.ZooKeeperSource` — cluster mode: ``/topologies``,
  ``/assignments``, ``/heartbeats``, ``/supervisors`` and the nimbus election in ZooKeeper;
  the actions are the ``spark-storm activate|deactivate|rebalance|kill`` functions
  (:mod:`spark_storm.cluster.admin`): status changes the workers follow and nimbus carries out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

__all__ = [
    "ALIVE",
    "ClusterSource",
    "ClusterView",
    "NimbusInfo",
    "SupervisorView",
    "TopologyRef",
    "WorkerRef",
]

#: Worker states in which a worker serves its HTTP endpoint.
ALIVE: Final = frozenset({"running", "inactive"})


@dataclass(frozen=True)
class WorkerRef:
    """A worker as the cluster knows it (heartbeat or assignment), and where its HTTP endpoint is.

    ``status`` is the heartbeat's ``running`` / ``inactive`` / ``stopped``, or ``dead`` when the
    last heartbeat is older than the source's timeout or its process is gone.
    """

    topology: str
    host: str
    port: int
    status: str
    supervisor: str
    heartbeat_time: float | None = None
    uptime_s: float | None = None
    pid: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    executors: tuple[str, ...] = ()
    rss_bytes: int | None = None

    @property
    def id(self) -> str:
        """``host:port``, Storm's name for a worker slot."""
        return f"{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.status in ALIVE

    @property
    def endpoint(self) -> str | None:
        """Base URL of the worker's HTTP endpoint, or None when it serves none."""
        if self.metrics_port is None or self.metrics_port <= 0:
            return None
        return f"http://{self.metrics_host}:{self.metrics_port}"


@dataclass(frozen=True)
class SupervisorView:
    """A host that runs workers, and its slots (for a local cluster: this machine)."""

    id: str
    host: str
    slots_total: int
    slots_used: int
    uptime_s: float | None = None
    ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class NimbusInfo:
    """A nimbus process; ``status`` is Storm's ``Leader`` / ``Not a Leader`` / ``Dead``.

    ``port`` is None when the nimbus listens on none (ours talk through ZooKeeper only);
    ``id`` is its name in the leader election (``host:pid``), as ``spark-storm list`` prints it.
    """

    host: str
    port: int | None
    status: str
    uptime_s: float | None = None
    version: str = ""
    id: str = ""
    pid: int | None = None


@dataclass(frozen=True)
class TopologyRef:
    """A topology and its workers.

    ``status`` is the cluster's own record (``ACTIVE``, ``INACTIVE``, ``KILLED``,
    ``REBALANCING``) when it keeps one; None means "ask the workers" (a local cluster has
    no nimbus: the UI derives the status from each worker's ``active`` flag).  Likewise
    ``uptime_s`` (since it was submitted) when the cluster records it, else the oldest
    worker's uptime; ``assignment_version`` and ``workers_requested`` only in cluster mode.
    """

    id: str
    name: str
    workers: tuple[WorkerRef, ...]
    status: str | None = None
    uptime_s: float | None = None
    assignment_version: int | None = None
    workers_requested: int | None = None


@dataclass(frozen=True)
class ClusterView:
    """One reading of the cluster."""

    kind: str
    description: str
    topologies: tuple[TopologyRef, ...]
    supervisors: tuple[SupervisorView, ...] = ()
    nimbus: tuple[NimbusInfo, ...] = ()
    rebalance_supported: bool = False

    def topology(self, topology_id: str) -> TopologyRef | None:
        """Return the topology with this id, or None."""
        return next((t for t in self.topologies if t.id == topology_id), None)


class ClusterSource(Protocol):
    """Where the UI learns about topologies and sends actions.

    Every action raises :class:`~spark_storm.errors.UnknownTopologyError` for an unknown
    id, :class:`~spark_storm.errors.ActionNotSupportedError` when this kind of cluster
    cannot do it (the message says what to do instead),
    :class:`~spark_storm.errors.TopologyActionError` when some worker (or ZooKeeper, or
    nimbus) refused it or could not be reached, and :class:`~spark_storm.errors.ConfigError`
    for options it cannot use (a rebalance to 0 workers).
    """

    def state(self) -> ClusterView:
        """Read the cluster now (cheap: called about once a second)."""
        ...

    def activate(self, topology_id: str) -> None:
        """Let the topology's executors consume (Storm's activate)."""
        ...

    def deactivate(self, topology_id: str) -> None:
        """Pause the topology's executors; queues fill and hold senders back."""
        ...

    def rebalance(self, topology_id: str, wait_secs: int, options: Mapping[str, Any]) -> None:
        """Redistribute the topology after ``wait_secs`` (Storm's ``rebalanceOptions``)."""
        ...

    def kill(self, topology_id: str, wait_secs: int) -> None:
        """Stop the topology's workers after ``wait_secs``; returns at once."""
        ...

    def savepoint(self, topology_id: str, directory: str) -> dict[str, Any]:
        """Write a savepoint of the topology's state under ``directory``; return its path and epoch."""
        ...

    def close(self) -> None:
        """Cancel pending delayed actions and release resources."""
        ...
