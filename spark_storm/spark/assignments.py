"""The Spark side of cluster mode: the current assignment of a topology, read from ZooKeeper.

With ``option("zookeeper", "HOST:PORT[/chroot]")`` the driver reads the topology and its
current assignment for every micro-batch (Spark builds the stream writer on the driver per
micro-batch) and hands the plan to that batch's writer tasks; a retried task reads it again
on its executor.  One ZooKeeper session per process and address is kept open for those
reads (Spark reuses its Python workers), and closed when the process exits, when its
ZooKeeper has been unreachable for ``storm.zookeeper.connection.timeout`` (a cluster that went
away, e.g. one ``deploy()`` started and stopped: the next read opens a new session), or by
:func:`close_sessions`.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from spark_storm.cluster.records import KILLED, Assignment, TopologyRecord
from spark_storm.cluster.session import ZooKeeperAddress
from spark_storm.cluster.state import ClusterState
from spark_storm.errors import ClusterError
from spark_storm.topology.assignment import Slot

__all__ = ["close_sessions", "current_assignment"]

logger = logging.getLogger(__name__)
# Writers run in Spark's Python workers, where logging is not configured: without a handler of its
# own, kazoo's reconnect warnings would reach stderr (Python's last-resort handler) every second
# while a cluster is away.  A process that configures logging still gets them.
logging.getLogger("kazoo").addHandler(logging.NullHandler())

_LOCK = threading.Lock()
_SESSIONS: dict[tuple[str, str], ClusterState] = {}


def _session(address: ZooKeeperAddress, conf: Mapping[str, Any]) -> ClusterState:
    zk_conf = {k: v for k, v in conf.items() if str(k).startswith("storm.zookeeper.")}
    key = (address.spec, repr(sorted(zk_conf.items())))
    with _LOCK:
        state = _SESSIONS.get(key)
        if state is None:
            state = ClusterState(address, conf).start()
            if not _SESSIONS:
                atexit.register(close_sessions)
            _SESSIONS[key] = state
            grace = state.conf.get_int("storm.zookeeper.connection.timeout", minimum=1) / 1000
            state.session.add_state_listener(lambda change: _on_change(key, state, change, grace))
        return state


def _on_change(key: tuple[str, str], state: ClusterState, change: str, grace: float) -> None:
    """On a lost connection: drop the session if ZooKeeper is still away after ``grace`` s (kazoo's thread)."""
    if change == "connected":
        return

    def reap() -> None:
        if state.session.connected:
            return
        with _LOCK:
            if _SESSIONS.get(key) is not state:
                return
            del _SESSIONS[key]
        logger.info("ZooKeeper %s unreachable for %.0fs; closing this process's session to it", state.address, grace)
        state.close()

    timer = threading.Timer(grace, reap)
    timer.daemon = True
    timer.start()


def close_sessions(address: str | None = None) -> None:
    """Close this process's ZooKeeper sessions (all, or those to ``address``, a ``host:port/root`` spec).

    Called at exit; tests call it between clusters, and a stopped ``deploy()`` for its own.
    """
    with _LOCK:
        keys = [k for k in _SESSIONS if address is None or k[0] == address]
        states = [_SESSIONS.pop(k) for k in keys]
    for state in states:
        state.close()


def current_assignment(
    address: ZooKeeperAddress,
    name: str,
    conf: Mapping[str, Any],
    *,
    wait_s: float = 0.0,
    settle_s: float = 0.0,
) -> tuple[TopologyRecord, Assignment]:
    """Return the submitted topology ``name`` and its current assignment.

    Waits up to ``wait_s`` for a first assignment (a topology just submitted), then up to
    ``settle_s`` until every worker of the newest assignment runs it (its ZooKeeper
    heartbeat names that version): rows sent earlier would reach a new worker whose peers
    still run the previous version and cannot yet route its tuple trees' acks, so those
    trees time out and their rows are sent again.  Past ``settle_s`` the assignment is
    returned anyway (logged).

    Raises
    ------
    ZooKeeperUnavailableError
        ZooKeeper did not answer (the message names the address and the fix).
    UnknownTopologyError
        No topology of that name is submitted (the message lists the submitted ones).
    ClusterError
        The topology is killed, or has no assignment (no nimbus, no free slot).
    """
    state = _session(address, conf)
    started = time.monotonic()
    while True:
        record = state.read_topology(name)
        if record.status == KILLED:
            msg = (
                f"topology {name!r} in ZooKeeper {address} is killed: nothing runs it any more "
                "(submit it again, or stop this query)"
            )
            raise ClusterError(msg)
        assignment = state.read_assignment(name)
        if assignment is not None and assignment.slots:
            break
        if time.monotonic() - started >= wait_s:
            msg = (
                f"topology {name!r} has no assignment in ZooKeeper {address} yet: is a nimbus running "
                "(`spark-storm list` shows the leader) and does a supervisor offer a free slot?"
            )
            raise ClusterError(msg)
        time.sleep(0.2)
    settled = time.monotonic()
    while True:
        behind = _behind(state, name, assignment)
        if not behind:
            return record, assignment
        if time.monotonic() - settled >= settle_s:
            if settle_s > 0:
                logger.warning(
                    "assignment v%d of %s: workers %s do not run it after %.1fs; sending anyway",
                    assignment.version,
                    name,
                    ", ".join(map(str, behind)),
                    settle_s,
                )
            return record, assignment
        time.sleep(0.1)
        newer = state.read_assignment(name)
        if newer is not None and newer.slots and newer.version > assignment.version:
            assignment = newer


def _behind(state: ClusterState, name: str, assignment: Assignment) -> list[Slot]:
    """Slots of ``assignment`` whose worker does not report running that version (or a newer one) yet."""
    heartbeats = state.read_heartbeats(name)
    out = []
    for slot in assignment.slots:
        hb = heartbeats.get(slot)
        version = hb.record.get("assignment_version") if hb is not None else None
        if version is None or version < assignment.version:
            out.append(slot)
    return out
