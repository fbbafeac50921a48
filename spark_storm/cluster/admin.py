"""What ``spark-storm submit | activate | deactivate | rebalance | kill | list`` do, through ZooKeeper.

Each function takes a started :class:`~spark_storm.cluster.state.ClusterState` and raises
a :class:`~spark_storm.errors.StormError` whose message names the value and the fix; the
command line prints it as one ``spark-storm:`` line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from spark_storm.cluster.records import ACTIVE, INACTIVE, KILLED, TopologyRecord, check_topology_name
from spark_storm.cluster.state import ClusterState
from spark_storm.errors import ConfigError, NoNimbusError, SavepointError
from spark_storm.reports import metrics_endpoint, request_savepoint
from spark_storm.topology.flux import is_flux
from spark_storm.topology.loader import load_topology, topology_from_dict
from spark_storm.topology.model import Topology, resolve_class, topology_to_dict

__all__ = [
    "TopologySummary",
    "activate",
    "deactivate",
    "kill",
    "list_topologies",
    "rebalance",
    "require_nimbus",
    "savepoint",
    "submit",
]


@dataclass(frozen=True)
class TopologySummary:
    """One line of ``spark-storm list``."""

    name: str
    status: str
    workers: int
    requested: int
    version: int
    uptime_s: float
    slots: tuple[str, ...]


def require_nimbus(state: ClusterState) -> str:
    """Return the leader nimbus's identifier.

    Raises
    ------
    NoNimbusError
        No nimbus runs for this ZooKeeper and root (the message says how to start one).
    """
    leader = state.nimbus_leader()
    if leader is None:
        msg = (
            f"no nimbus is running for ZooKeeper {state.address}: start one with "
            f"`spark-storm nimbus --zookeeper {state.address}` (the topology would never be assigned)"
        )
        raise NoNimbusError(msg)
    return leader


def _requested_workers(topology: Topology, workers: int | None, default: int) -> int:
    if workers is not None:
        chosen = workers
    elif "topology.workers" in topology.conf:
        value = topology.conf["topology.workers"]
        if isinstance(value, bool) or not isinstance(value, int):
            msg = f"topology {topology.name!r}: conf topology.workers must be an integer, got {value!r}"
            raise ConfigError(msg)
        chosen = value
    elif topology.workers:
        chosen = len(topology.workers)
    else:
        chosen = default
    if chosen < 1:
        msg = f"topology {topology.name!r}: workers must be at least 1, got {chosen} (use --workers N)"
        raise ConfigError(msg)
    return chosen


def submit(
    state: ClusterState,
    path: str | Path,
    workers: int | None = None,
    *,
    check_classes: bool = True,
    properties: str | Path | None = None,
    restore: Callable[[Topology], Mapping[str, Any]] | None = None,
) -> TopologyRecord:
    """Submit the topology file at ``path`` (status active); nimbus assigns it.

    Parameters
    ----------
    workers : int, optional
        Worker processes; default the topology's conf ``topology.workers``, else the number of
        slots it lists in ``workers``, else ``topology.workers`` of the configuration.
    check_classes : bool
        Import every bolt class here first, so a typo fails the submit rather than every worker.
    properties : str or Path, optional
        A Flux file's ``--filter`` properties file.  A Flux file is stored as the topology it
        became (our YAML form), so workers need neither its includes nor the properties.
    restore : callable, optional
        Starting from a savepoint (``--from-savepoint``): checks the topology against it and
        returns the conf keys that make the workers restore it
        (:func:`spark_storm.topology.restore.restore_conf`); they are stored with the topology.

    Raises
    ------
    ConfigError
        Unreadable or invalid topology, a bad name, a bolt class that does not import.
    NoNimbusError
        No nimbus runs.
    TopologyExistsError
        A topology of that name is already submitted.
    """
    try:
        source = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"cannot read topology file {str(path)!r}: {exc.strerror}"
        raise ConfigError(msg) from exc
    try:
        data = yaml.safe_load(source)
    except yaml.YAMLError as exc:
        msg = f"topology file {str(path)!r} is not valid YAML: {exc}"
        raise ConfigError(msg) from exc
    if properties is not None or is_flux(data):
        # A Flux file may include others and take ${...} from --filter: store what it became, self-contained.
        topology = load_topology(path, properties)
        source = yaml.safe_dump(topology_to_dict(topology), sort_keys=False)
    else:
        topology = topology_from_dict(data, origin=str(path))
    check_topology_name(topology.name)
    if check_classes or restore is not None:
        for component in topology.components.values():
            resolve_class(component.bolt, f"topology {topology.name!r}, component {component.id!r}: bolt")
    if restore is not None:
        stored = topology_to_dict(topology)
        stored["conf"] = {**stored.get("conf", {}), **restore(topology)}
        source = yaml.safe_dump(stored, sort_keys=False)
    count = _requested_workers(topology, workers, state.conf.get_int("topology.workers", minimum=1))
    require_nimbus(state)
    return state.submit_topology(TopologyRecord(topology.name, source, ACTIVE, count, time.time()))


def activate(state: ClusterState, name: str) -> TopologyRecord:
    """Set ``name`` active: its executors consume (workers follow the status in ZooKeeper)."""
    return state.set_status(name, ACTIVE)


def deactivate(state: ClusterState, name: str) -> TopologyRecord:
    """Set ``name`` inactive: its executors pause, its workers stay up."""
    return state.set_status(name, INACTIVE)


def rebalance(
    state: ClusterState, name: str, workers: int | None, executors: Mapping[str, int] | None = None
) -> TopologyRecord:
    """Ask for ``workers`` worker processes and/or these components' executors; nimbus writes a new assignment.

    ``executors`` (Storm's ``rebalance -e COMPONENT=N``) changes a component's executors
    within its task count, live: its tasks move between executors (and workers) as in any
    reassignment, and stateful tasks restore their committed state there (the next round
    rolls back what moved, so the state stays exact).

    Raises
    ------
    ConfigError
        Neither given, a bad worker count, an unknown component or a count outside 1 .. its tasks.
    """
    if workers is None and not executors:
        msg = f"rebalance of {name!r}: give --workers N and/or --executors COMPONENT=N"
        raise ConfigError(msg)
    require_nimbus(state)
    record = state.read_topology(name)
    if executors:
        record = state.set_executors(name, executors)
    if workers is not None:
        record = state.set_workers(name, workers)
    return record


def kill(state: ClusterState, name: str, wait_secs: float | None = None) -> TopologyRecord:
    """Kill ``name``: status killed now (its workers run their ordered shutdown), removed after ``wait_secs``.

    Until then the name stays taken and ``list`` shows it killed.  The default wait is
    ``topology.message.timeout.secs`` (as Storm's ``kill -w``).  ``kill --savepoint`` calls
    :func:`savepoint` (``commit_first``, ``hold``) just before: the workers stay leased to the
    savepoint, so no commit comes between it and the kill.
    """
    wait = float(state.conf.get_int("topology.message.timeout.secs", minimum=0) if wait_secs is None else wait_secs)
    if wait < 0:
        msg = f"--wait must be >= 0 seconds, got {wait_secs}"
        raise ConfigError(msg)
    require_nimbus(state)
    state.read_topology(name)
    return state.set_status(name, KILLED, kill_at=time.time() + wait)


def savepoint(
    state: ClusterState, name: str, parent: str | Path, *, commit_first: bool = False, hold: bool = False
) -> dict[str, Any]:
    """Write a savepoint of ``name``'s stateful tasks under ``parent``; return its path and epoch.

    A running worker of the topology (found by its heartbeat's HTTP endpoint) coordinates it
    (``POST /savepoint``).  ``parent`` must be a directory every worker writes to (one host,
    or a shared mount): each worker copies its own tasks' state.

    Raises
    ------
    SavepointError
        No worker answers, or the workers could not write it (the reason names why).
    """
    record = state.read_topology(name)
    timeout = state.conf.get_int("topology.state.savepoint.timeout.ms", minimum=1) / 1000
    tried = []
    for slot, heartbeat in sorted(state.read_heartbeats(record.name).items()):
        endpoint = metrics_endpoint(heartbeat.record, slot.host)
        if endpoint is None or heartbeat.record["status"] != "running":
            tried.append(f"{slot}: {heartbeat.record['status']}, endpoint {endpoint}")
            continue
        try:
            return request_savepoint(
                endpoint[0], endpoint[1], str(parent), commit_first=commit_first, hold=hold, timeout=timeout
            )
        except SavepointError as exc:
            if "did not answer" not in str(exc):
                raise
            tried.append(str(exc))
    msg = f"topology {name!r}: no running worker could take the savepoint ({'; '.join(tried) or 'no heartbeats'})"
    raise SavepointError(msg)


def list_topologies(state: ClusterState) -> list[TopologySummary]:
    """Every submitted topology with its status, assigned/requested workers and uptime."""
    out = []
    now = time.time()
    for name in state.topology_names():
        record = state.find_topology(name)
        if record is None:
            continue
        assignment = state.read_assignment(name)
        out.append(
            TopologySummary(
                name,
                record.status,
                len(assignment.slots) if assignment else 0,
                record.workers,
                assignment.version if assignment else 0,
                max(0.0, now - record.submitted),
                tuple(str(s) for s in assignment.slots) if assignment else (),
            )
        )
    return out
