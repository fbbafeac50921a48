"""Which slots are live, free or used, and which workers are alive: nimbus's rules, in one place.

Nimbus reassigns by these rules and the UI shows them, so both call this module:

* a slot is *live* while a registered supervisor offers it; a slot two supervisors offer
  belongs to the first by supervisor id (:func:`slot_owners`);
* a slot is *used* while an assignment names it, else *free* (:func:`used_slots`);
* a worker of an assigned slot is ``starting`` until its first heartbeat, ``alive`` while
  its heartbeat znode keeps changing, and ``dead`` when its slot is no longer live (its
  supervisor is gone), when it never wrote a heartbeat within ``nimbus.task.launch.secs``
  of the assignment, or when its znode did not change for ``nimbus.task.timeout.secs``
  (:class:`WorkerLiveness`).

Heartbeat ages are measured on the judging process's own clock from the moment it saw the
znode's version change, never by comparing another host's timestamp (Storm does the same):
so a :class:`WorkerLiveness` keeps memory between readings, one per judging process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from spark_storm.cluster.records import Assignment, HeartbeatZnode, SupervisorInfo
from spark_storm.config import Config
from spark_storm.topology.assignment import Slot

__all__ = [
    "ALIVE",
    "DEAD",
    "STARTING",
    "Verdict",
    "WorkerLiveness",
    "slot_owners",
    "used_slots",
]

STARTING: Final = "starting"
ALIVE: Final = "alive"
DEAD: Final = "dead"


def slot_owners(supervisors: Mapping[str, SupervisorInfo]) -> tuple[dict[Slot, str], list[tuple[Slot, str, str]]]:
    """Return the live slots with the supervisor that owns each, and the slots offered twice.

    A slot offered by two supervisors (the same host and port registered twice) belongs to
    the first by id; each such conflict is listed as ``(slot, owner, other)``.
    """
    owner: dict[Slot, str] = {}
    conflicts: list[tuple[Slot, str, str]] = []
    for sid, info in sorted(supervisors.items()):
        for slot in info.slots:
            first = owner.setdefault(slot, sid)
            if first != sid:
                conflicts.append((slot, first, sid))
    return owner, conflicts


def used_slots(assignments: Iterable[Assignment]) -> dict[Slot, str]:
    """Return the slots the assignments name, each with its topology (the others are free)."""
    return {slot: a.topology for a in assignments for slot in a.slots}


@dataclass(frozen=True)
class Verdict:
    """A worker's liveness: ``starting``, ``alive`` or ``dead``, and why it is dead."""

    state: str
    reason: str | None = None

    @property
    def dead(self) -> bool:
        """Whether nimbus reassigns the slot."""
        return self.state == DEAD


class WorkerLiveness:
    """Judges the workers of assigned slots by their heartbeat znodes, on this process's clock.

    Parameters
    ----------
    task_timeout_s : float
        A heartbeat znode unchanged this long means a dead worker (``nimbus.task.timeout.secs``).
    launch_timeout_s : float
        A worker with no heartbeat this long after its slot was assigned is dead (``nimbus.task.launch.secs``).

    Safe to call from several threads.
    """

    def __init__(self, task_timeout_s: float, launch_timeout_s: float) -> None:
        self.task_timeout_s = task_timeout_s
        self.launch_timeout_s = launch_timeout_s
        self._lock = threading.Lock()
        self._beat_seen: dict[tuple[str, Slot], tuple[int, float]] = {}  # version, when it last changed
        self._assigned_since: dict[tuple[str, Slot], float] = {}

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any] | None) -> WorkerLiveness:
        """Use nimbus's timeouts (``nimbus.task.timeout.secs``, ``nimbus.task.launch.secs``)."""
        config = Config.of(conf)
        return cls(
            float(config.get_int("nimbus.task.timeout.secs", minimum=1)),
            float(config.get_int("nimbus.task.launch.secs", minimum=1)),
        )

    def assigned(self, topology: str, slot: Slot, now: float | None = None) -> None:
        """Start the launch clock of ``slot`` (kept if it runs already)."""
        with self._lock:
            self._assigned_since.setdefault((topology, slot), time.monotonic() if now is None else now)

    def judge(
        self,
        topology: str,
        slot: Slot,
        heartbeat: HeartbeatZnode | None,
        live: Collection[Slot],
        now: float | None = None,
    ) -> Verdict:
        """Judge the worker of ``slot`` from its heartbeat znode (None: it has none).

        ``live`` holds the slots some supervisor offers (:func:`slot_owners`).  The first call
        for a slot starts its launch clock; ``now`` is ``time.monotonic()``.
        """
        mono = time.monotonic() if now is None else now
        key = (topology, slot)
        if slot not in live:
            return Verdict(DEAD, "its supervisor is gone")
        with self._lock:
            since = self._assigned_since.setdefault(key, mono)
            if heartbeat is None:
                if mono - since > self.launch_timeout_s:
                    return Verdict(DEAD, f"no heartbeat within nimbus.task.launch.secs={self.launch_timeout_s:g}")
                return Verdict(STARTING)
            seen = self._beat_seen.get(key)
            if seen is None or seen[0] != heartbeat.version:
                self._beat_seen[key] = (heartbeat.version, mono)
                return Verdict(ALIVE)
        if mono - seen[1] > self.task_timeout_s:
            return Verdict(DEAD, f"heartbeat unchanged for more than nimbus.task.timeout.secs={self.task_timeout_s:g}")
        return Verdict(ALIVE)

    def heard_from(self, topology: str, slot: Slot) -> bool:
        """Whether a heartbeat of ``slot`` was judged since its memory was last cleared."""
        with self._lock:
            return (topology, slot) in self._beat_seen

    def forget(self, topology: str, slot: Slot | None = None) -> None:
        """Drop what is remembered of ``slot`` of ``topology`` (every slot of it when None)."""
        with self._lock:
            for memory in (self._beat_seen, self._assigned_since):
                for key in [k for k in memory if k[0] == topology and (slot is None or k[1] == slot)]:
                    del memory[key]

    def retain(self, keys: Collection[tuple[str, Slot]]) -> None:
        """Forget every (topology, slot) not in ``keys`` (gone from the cluster since the last reading)."""
        with self._lock:
            for memory in (self._beat_seen, self._assigned_since):
                for key in [k for k in memory if k not in keys]:
                    del memory[key]

    def clear(self) -> None:
        """Forget everything (a new leadership term starts from what it sees)."""
        with self._lock:
            self._beat_seen.clear()
            self._assigned_since.clear()
