"""Nimbus: leader-elected, assigns topologies' executors to supervisors' free slots.

Any number of ``spark-storm nimbus`` processes may run; they contend in kazoo's Election
(``/nimbus``) and only the leader works.  The leader keeps every submitted topology
assigned (:meth:`Nimbus.reconcile`, run whenever a watch fires and every
``nimbus.monitor.freq.secs``):

* a topology without an assignment gets ``workers`` slots, picked from the free ones so
  that its workers spread over supervisors (Storm's even scheduler), and the executors are
  placed on them by the same pure ``plan()`` the static mode uses;
* a slot whose supervisor's ephemeral node went away, or whose worker heartbeat did not
  change for ``nimbus.task.timeout.secs`` (or never came within ``nimbus.task.launch.secs``
  of the assignment), is dead: the topology is planned again over its live slots plus free
  ones, as a new version of ``/assignments/<name>``;
* a slot whose supervisor names a topology (a supervisor task of a Spark-hosted deployment,
  ``spark_storm.spark.deploy``) is given to that topology only;
* a rebalance (a new ``workers`` count) or free slots for a topology that got fewer than it
  asked for lead to a new version too;
* a killed topology keeps its assignment until its kill time, then its topology, assignment
  and heartbeats are removed (the supervisors stop its workers).

Which slots are live, free or used and which workers are dead are the rules of
:mod:`spark_storm.cluster.liveness`, which the UI shows too; heartbeat ages are measured on
nimbus's own clock from the moment the znode's version last changed, never by comparing
another host's timestamp (Storm does the same).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

from spark_storm.cluster.liveness import WorkerLiveness, slot_owners, used_slots
from spark_storm.cluster.records import KILLED, Assignment, TopologyRecord
from spark_storm.cluster.session import Watch, ZooKeeperAddress
from spark_storm.cluster.state import ClusterState
from spark_storm.errors import ClusterError, ConfigError, ZooKeeperUnavailableError
from spark_storm.topology.assignment import Slot, plan

__all__ = ["Nimbus"]

logger = logging.getLogger(__name__)


class Nimbus:
    """One nimbus process: contends for leadership, and assigns while it leads.

    Parameters
    ----------
    zookeeper : str or ZooKeeperAddress, optional
        ``HOST:PORT[/chroot]``; default from ``conf``.
    conf : Mapping, optional
        Configuration (``nimbus.*``, ``storm.zookeeper.*``).
    identifier : str, optional
        This contender's name in the election; default ``host:pid``.
    """

    def __init__(
        self,
        zookeeper: str | ZooKeeperAddress | None = None,
        conf: Mapping[str, Any] | None = None,
        identifier: str | None = None,
    ) -> None:
        self.state = ClusterState(zookeeper, conf)
        self.conf = self.state.conf
        self.identifier = identifier or f"{socket.gethostname()}:{os.getpid()}"
        self.liveness = WorkerLiveness.from_conf(self.conf)
        self.monitor_every = self.conf.get_int("nimbus.monitor.freq.secs", minimum=1)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._leading = threading.Event()
        self._session_lost = threading.Event()
        self._thread: threading.Thread | None = None
        self._election: Any = None
        # self.liveness and self._said: memory of the current leadership term (reset when it is gained).
        self._said: dict[str, str] = {}
        self._next_due = float(self.monitor_every)
        self.counters = {"assignments": 0, "reassignments": 0, "removed": 0, "terms": 0}

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> Nimbus:
        """Connect to ZooKeeper and contend for leadership in a background thread."""
        self.state.session.add_state_listener(self._on_session)
        self.state.start()
        self._thread = threading.Thread(target=self._run, name="nimbus", daemon=True)
        self._thread.start()
        return self

    @property
    def is_leader(self) -> bool:
        """Whether this process leads right now."""
        return self._leading.is_set()

    def wait_leader(self, timeout: float) -> bool:
        """Wait until this process leads; False after ``timeout`` s."""
        return self._leading.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Give up leadership (or the contention) and disconnect."""
        self._stop.set()
        self._wake.set()
        election = self._election
        if election is not None:
            election.cancel()
        if self._thread is not None:
            self._thread.join(timeout)
        self.state.close()
        logger.info("nimbus %s stopped", self.identifier)

    def _on_session(self, change: str) -> None:
        if change == "lost":
            self._session_lost.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.state.session.wait_connected(1.0):
                continue
            self._session_lost.clear()
            self._election = self.state.election(self.identifier)
            try:
                self._election.run(self._lead)
            except Exception as exc:  # a lost session or a failed term as leader: contend again
                if self._stop.is_set():
                    break
                logger.exception("nimbus %s: election failed (%r); contending again", self.identifier, exc)
                self._stop.wait(1.0)

    def _lead(self) -> None:
        if self._stop.is_set():
            return
        self.counters["terms"] += 1
        self.liveness.clear()
        self._said.clear()
        self._leading.set()
        logger.info("nimbus %s is the leader (ZooKeeper %s)", self.identifier, self.state.address)
        watches: dict[str, Watch] = {}
        try:
            wake = self._wake.set
            watches["/supervisors"] = self.state.watch_supervisors(lambda _ids: wake())
            watches["/topologies"] = self.state.watch_topologies(lambda _names: wake())
            watches["/assignments"] = self.state.watch_assignments(lambda _names: wake())
            while not self._stop.is_set() and not self._session_lost.is_set():
                self._wake.clear()
                wait = float(self.monitor_every)
                if self.state.session.connected:
                    try:
                        wait = min(wait, self.reconcile())
                        self._watch_each_topology(watches)
                    except (ZooKeeperUnavailableError, ClusterError) as exc:
                        logger.warning("nimbus %s: assignment round failed: %s", self.identifier, exc)
                self._wake.wait(max(0.05, wait))
        finally:
            for watch in watches.values():
                watch.cancel()
            self._leading.clear()
            if self._session_lost.is_set() and not self._stop.is_set():
                logger.warning(
                    "nimbus %s: ZooKeeper session lost; no longer the leader, contending again", self.identifier
                )

    def _watch_each_topology(self, watches: dict[str, Watch]) -> None:
        """Keep a data watch per topology: a status change (kill) or a rebalance wakes the leader at once."""
        names = set(self.state.topology_names())
        for name in names - set(watches):
            watches[name] = self.state.watch_topology(name, lambda _record: self._wake.set())
        for name in [n for n in watches if not n.startswith("/") and n not in names]:
            watches.pop(name).cancel()

    # -- assignment -----------------------------------------------------------------
    def reconcile(self) -> float:
        """Run one assignment round over every topology (the leader calls it; safe to call again).

        Returns the seconds until the next thing due (a killed topology's removal), at most
        ``nimbus.monitor.freq.secs``.
        """
        now = time.monotonic()
        self._next_due = float(self.monitor_every)
        supervisors = self.state.supervisors()
        live, conflicts = slot_owners(supervisors)
        # A Spark-hosted deployment's supervisor tasks offer their slots to their own topology only.
        dedicated = {slot: info.topology for info in supervisors.values() if info.topology for slot in info.slots}
        for slot, owner, other in conflicts:
            self._say(f"dup:{slot}", f"slot {slot} is offered by supervisors {owner} and {other}; using {owner}")
        records: dict[str, TopologyRecord] = {}
        for name in self.state.topology_names():
            record = self.state.find_topology(name)
            if record is not None:
                records[name] = record
        assignments: dict[str, Assignment] = {}
        for name in self.state.assignment_names():
            current = self.state.read_assignment(name)
            if current is None:
                continue
            if name not in records:
                logger.info("nimbus: removing the assignment of %s (no such topology)", name)
                self.state.delete_assignment(name)
                continue
            assignments[name] = current
        used = used_slots(assignments.values())
        for name in sorted(records):
            self._reconcile_topology(records[name], assignments.get(name), live, used, now, dedicated)
        return self._next_due

    def _reconcile_topology(
        self,
        record: TopologyRecord,
        current: Assignment | None,
        live: dict[Slot, str],
        used: dict[Slot, str],
        now: float,
        dedicated: Mapping[Slot, str] | None = None,
    ) -> None:
        name = record.name
        if record.status == KILLED:
            left = 0.0 if record.kill_at is None else record.kill_at - time.time()
            if left > 0:
                self._next_due = min(self._next_due, left)
            else:
                self.state.remove_topology(name)
                for slot in current.slots if current else ():
                    used.pop(slot, None)
                self._forget(name)
                self.counters["removed"] += 1
                logger.info("nimbus: topology %s killed and removed", name)
            return
        try:
            topology = record.topology()
        except ConfigError as exc:
            self._say(name, f"topology {name} cannot be assigned: {exc}")
            return
        dead: dict[Slot, str] = {}
        if current is not None:
            heartbeats = self.state.read_heartbeats(name)
            for slot in current.slots:
                verdict = self.liveness.judge(name, slot, heartbeats.get(slot), live, now)
                if verdict.dead:
                    dead[slot] = verdict.reason or "dead"
        keep = sorted(s for s in (current.slots if current else ()) if s not in dead)[: record.workers]
        mine = dedicated or {}
        free = [s for s in live if s not in used and s not in dead and mine.get(s, name) == name]
        chosen = keep + self._pick(free, record.workers - len(keep), keep, live)
        if not chosen:
            what = "all its slots are dead" if current else "it waits for one"
            self._say(name, f"topology {name}: no free worker slot ({len(live)} slots, all taken); {what}")
            return
        version = current.version + 1 if current else 1
        candidate = Assignment.from_plan(plan(topology, chosen), version, record.workers)
        if candidate.same_placement(current) and current is not None and current.requested == record.workers:
            if len(chosen) < record.workers:
                self._say(name, f"topology {name}: {len(chosen)} of {record.workers} workers (no more free slots)")
            return
        if not self.state.write_assignment(candidate):
            return
        self._said.pop(name, None)
        old = set(current.slots) if current else set()
        for slot in old - set(chosen):
            used.pop(slot, None)
            self.state.delete_heartbeat(name, slot)
            self.liveness.forget(name, slot)
        for slot in chosen:
            used[slot] = name
            self.liveness.assigned(name, slot, now)
        if current is None:
            self.counters["assignments"] += 1
        else:
            self.counters["reassignments"] += 1
        why = "; ".join(f"{s}: {r}" for s, r in sorted(dead.items())) or (
            "first assignment" if current is None else f"{record.workers} workers asked for"
        )
        logger.info("nimbus: assigned %s v%d to %s (%s)", name, version, ", ".join(map(str, candidate.slots)), why)

    @staticmethod
    def _pick(free: list[Slot], needed: int, keep: list[Slot], live: dict[Slot, str]) -> list[Slot]:
        """Take ``needed`` free slots, each from the supervisor running fewest of this topology's workers."""
        load: dict[str, int] = {}
        for slot in keep:
            load[live[slot]] = load.get(live[slot], 0) + 1
        pool = sorted(free)
        out: list[Slot] = []
        while pool and len(out) < needed:
            best = min(pool, key=lambda s: (load.get(live[s], 0), live[s], s))
            pool.remove(best)
            out.append(best)
            load[live[best]] = load.get(live[best], 0) + 1
        return out

    def _forget(self, name: str) -> None:
        self.liveness.forget(name)
        self._said.pop(name, None)

    def _say(self, key: str, message: str) -> None:
        """Log ``message`` once until it changes (rounds repeat every few seconds)."""
        if self._said.get(key) != message:
            self._said[key] = message
            logger.warning("nimbus: %s", message)
