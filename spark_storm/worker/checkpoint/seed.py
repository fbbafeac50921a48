"""A worker's side of starting from a savepoint: its tasks' state and logs reset to what the savepoint holds.

``topology.state.savepoint.path`` names the savepoint (``spark-storm submit --from-savepoint``
sets it with a fresh ``topology.state.savepoint.restore.id``).  Each stateful task and each
source task's input log is reset the first time a worker opens it, unless it already
carries the restore's id (its *origin*, written last): a worker that restarts, or a task
that moves to another worker later, keeps what it committed since.  What goes where is
:mod:`spark_storm.topology.restore`'s plan, checked once per worker before anything is
reset, so a savepoint that does not fit stops the worker with one line and no task half
restored.

* same task count: the task's entries are copied byte for byte (committed at the epoch);
* rescaled: the keys the task now owns, gathered from every saved task of the component;
* a bolt whose ``state_version`` is newer than the saved one: every value goes through
  ``migrate_state(key, value, from_version)`` at once (keys never change, as in Flink);
* a new stateful component: an empty snapshot at the savepoint's epoch;
* a source task's log: emptied, with the savepoint's committed batches (their groups are
  replays from then on) and the group keys of open batches it had taken in whole.

Threads: the worker's start thread and executor threads at their prepare (one task each)
call it; the split of a rescaled component's saved keys is made once, under ``_lock``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_storm.config import Config
from spark_storm.errors import SavepointError
from spark_storm.state import InputLog, TaskStore
from spark_storm.state.format import encode_entry
from spark_storm.state.savepoint import Savepoint
from spark_storm.topology.assignment import Plan
from spark_storm.topology.model import Topology, resolve_class
from spark_storm.topology.restore import RestorePlan, check_state_version, plan_restore, restore_conf, split_keyed
from spark_storm.worker.stateful import is_stateful

__all__ = ["Seeder", "restore_for"]

logger = logging.getLogger(__name__)


def restore_for(path: str | Path, allow_unmatched: bool = False) -> Callable[[Topology], dict[str, Any]]:
    """Return what starting from the savepoint at ``path`` adds to a topology's conf (checked against it first).

    ``submit --from-savepoint``, ``local-cluster --from-savepoint`` and
    ``deploy(from_savepoint=...)`` call it with the topology they start
    (:func:`~spark_storm.topology.restore.restore_conf`; SavepointError when it does not fit).
    """

    def restore(topology: Topology) -> dict[str, Any]:
        def bolt_class(cid: str) -> Any:
            return resolve_class(topology.components[cid].bolt, f"component {cid!r}: bolt")

        return restore_conf(path, topology, bolt_class, is_stateful, allow_unmatched)

    return restore


class Seeder:
    """Resets a worker's stateful tasks and source logs from a savepoint (see the module doc)."""

    def __init__(self, plan: Plan, restore: RestorePlan) -> None:
        self._plan = plan
        self.restore = restore
        self._lock = threading.Lock()
        self._shares: dict[str, list[dict[Any, Any]]] = {}
        self.reset_tasks = 0
        self.reset_logs = 0

    @classmethod
    def from_conf(cls, conf: Config, plan: Plan) -> Seeder | None:
        """Return the seeder of ``topology.state.savepoint.path`` (None: not set), its plan checked.

        Raises
        ------
        SavepointError
            The savepoint is unreadable, another topology's, or does not fit this topology.
        """
        path = conf.get_optional_str("topology.state.savepoint.path")
        if path is None:
            return None
        topology = plan.topology
        savepoint = Savepoint.open(path, topology=topology.name)

        def stateful(cid: str) -> bool:
            return is_stateful(resolve_class(topology.components[cid].bolt, "bolt"))

        restore = plan_restore(
            savepoint,
            topology,
            stateful,
            conf.get_optional_str("topology.state.savepoint.restore.id"),
            conf.get_bool("topology.state.savepoint.allow.unmatched"),
        )
        for cid, item in restore.components.items():
            if item.saved_tasks:
                check_state_version(
                    resolve_class(topology.components[cid].bolt, "bolt"), item.saved_version, cid, savepoint
                )
        return cls(plan, restore)

    @property
    def epoch(self) -> int:
        """The savepoint's epoch: the committed epoch of every task it seeds."""
        return self.restore.savepoint.manifest.epoch

    # --- stateful tasks ---------------------------------------------------------------------------
    def seed_task(self, task: int, store: TaskStore) -> None:
        """Reset stateful task ``task``'s store from the savepoint unless it carries this restore already."""
        restore = self.restore
        if store.origin() == restore.restore_id:
            return
        cid = self._plan.task_component[task]
        item = restore.components.get(cid)
        if item is None:  # not stateful in this topology
            return
        index = list(self._plan.component_tasks[cid]).index(task)
        savepoint = restore.savepoint
        epoch = self.epoch
        cls = resolve_class(self._plan.topology.components[cid].bolt, "bolt")
        version = int(getattr(cls, "state_version", 1))
        where = f"{savepoint.describe()}, component {cid!r} task {index}"
        if item.saved_tasks == 0:
            entries = [(epoch, True, encode_entry(epoch, True, {}))]
            how = "empty (a component the savepoint does not have)"
        elif not item.rescaled and version == item.saved_version:
            saved = savepoint.task_store(cid, index)
            fulls = set(saved.fulls())
            entries = [(e, e in fulls, saved.read_raw(e)) for e in saved.epochs() if e <= epoch]
            how = "copied"
        else:
            if item.rescaled:
                state = self._share(cid, item.saved_tasks, item.tasks, index, where)
                how = f"{len(state)} keys of {item.saved_tasks} saved tasks (rescaled to {item.tasks})"
            else:
                state = savepoint.read_task(cid, index)
                how = f"{len(state)} keys"
            if version != item.saved_version:
                state = _migrate(cls, state, item.saved_version, where)
                how += f", migrated from state_version {item.saved_version} to {version}"
            entries = [(epoch, True, encode_entry(epoch, True, state))]
        store.reset(epoch, entries, restore.restore_id)
        with self._lock:
            self.reset_tasks += 1
        logger.info("task %d (%s[%d]) restored from %s at epoch %d: %s", task, cid, index, savepoint.root, epoch, how)

    def _share(self, cid: str, saved_tasks: int, tasks: int, index: int, where: str) -> dict[Any, Any]:
        """Task ``index``'s keys of a rescaled component (the saved tasks read and split once per worker)."""
        with self._lock:
            shares = self._shares.get(cid)
            if shares is None:
                savepoint = self.restore.savepoint
                saved = ((i, savepoint.read_task(cid, i)) for i in range(saved_tasks))
                shares = self._shares[cid] = split_keyed(saved, saved_tasks, tasks, where)
            return shares[index]

    # --- source logs ----------------------------------------------------------------------------------
    def seed_log(self, task: int, log: InputLog) -> None:
        """Reset source task ``task``'s input log to the savepoint's batches unless it carries this restore."""
        if log.origin() == self.restore.restore_id:
            return
        manifest = self.restore.savepoint.manifest
        kept = manifest.kept.get(self._plan.task_component[task], [])
        log.reset(manifest.batches, kept, self.restore.restore_id)
        with self._lock:
            self.reset_logs += 1
        logger.info(
            "source task %d's input log restored from %s: batches %s, %d kept group keys",
            task,
            self.restore.savepoint.root,
            manifest.batches,
            len(kept),
        )


def _migrate(cls: type, state: dict[Any, Any], from_version: int, where: str) -> dict[Any, Any]:
    """Return ``state`` with every value through ``cls().migrate_state`` (an instance made for it, not prepared)."""
    bolt = cls()
    out: dict[Any, Any] = {}
    for key, value in state.items():
        try:
            out[key] = bolt.migrate_state(key, value, from_version)
        except Exception as exc:
            msg = f"{where}: {cls.__name__}.migrate_state failed on key {key!r}: {type(exc).__name__}: {exc}"
            raise SavepointError(msg) from exc
    return out
