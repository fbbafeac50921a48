"""Starting a topology from a savepoint: which state goes where (docs/design/state.md, "Savepoints").

State is matched **by component id**.  For each stateful component of the new topology:

* in the savepoint with the same task count: each task gets its index's entries, byte for byte;
* in the savepoint with another task count (a *rescale*): only *keyed* state moves.  Keyed
  means a bolt behind a fields grouping (a source: routed by a key) whose state keys are its
  grouping values (one field: the value; several: the list of them).  Each key goes to
  ``pmod(hash(values), tasks)``, the hash the fields grouping routes by (Spark's Murmur3,
  :mod:`spark_storm.topology.hashing`), so every key's state is on the task its tuples now
  reach.  A key of old task ``i`` that does not hash to ``i`` proves the state is not keyed
  that way: the restore is refused, naming the key (state kept by task index would sit on a
  task its tuples no longer reach, so it is never guessed);
* windowed components keep window internals in their state: they restore at the same task
  count only;
* not in the savepoint: starts empty.

A stateful component of the savepoint that the new topology lacks (or whose bolt is no
longer stateful) is refused, naming it, unless ``allow_unmatched`` (Flink's
``allowNonRestoredState``): its state is then dropped.

Why not Flink's key groups (a fixed number of hash ranges, each moving whole)?  The Spark
writer and the workers route by ``pmod(hash, tasks)``, which Spark users see and may compute
themselves; ranges would change that.  Moving keys one by one costs one hash per key at
restore (measured in ``bench.state``), which a restore pays once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from spark_storm.errors import ConfigError, SavepointError
from spark_storm.state.savepoint import Savepoint
from spark_storm.topology.hashing import fields_hash
from spark_storm.topology.model import Topology
from spark_storm.topology.routing import spark_hash
from spark_storm.topology.windows import window_spec

__all__ = [
    "ComponentRestore",
    "RestorePlan",
    "check_state_version",
    "plan_restore",
    "restore_conf",
    "split_keyed",
    "task_share",
]


@dataclass(frozen=True)
class ComponentRestore:
    """How one stateful component of the new topology starts."""

    component: str
    tasks: int
    saved_tasks: int  # 0: not in the savepoint (starts empty)
    saved_version: int = 1

    @property
    def rescaled(self) -> bool:
        """Whether its task count differs from the savepoint's."""
        return self.saved_tasks not in (0, self.tasks)


@dataclass(frozen=True)
class RestorePlan:
    """A savepoint matched against a topology: per stateful component, how it starts."""

    savepoint: Savepoint
    restore_id: str
    components: dict[str, ComponentRestore]
    dropped: tuple[str, ...]


def plan_restore(
    savepoint: Savepoint,
    topology: Topology,
    stateful: Callable[[str], bool],
    restore_id: str | None = None,
    allow_unmatched: bool = False,
) -> RestorePlan:
    """Match ``savepoint`` against ``topology`` (``stateful(component id)``: whether its bolt keeps state).

    Raises
    ------
    SavepointError
        One line naming the component and the fix: a saved component missing (without
        ``allow_unmatched``), or a rescale of state that cannot move (windowed, or not
        behind a fields grouping).
    """
    manifest = savepoint.manifest
    where = savepoint.describe()
    gone = sorted(c for c in manifest.components if c not in topology.components or not stateful(c))
    if gone and not allow_unmatched:
        names = ", ".join(repr(c) for c in gone)
        msg = (
            f"{where} holds the state of {names}, which topology {topology.name!r} has not (or not as a stateful "
            "bolt); keep the component id, or pass --allow-unmatched-state "
            "(topology.state.savepoint.allow.unmatched) to drop its state"
        )
        raise SavepointError(msg)
    out: dict[str, ComponentRestore] = {}
    for cid, comp in topology.components.items():
        if not stateful(cid):
            continue
        saved = manifest.components.get(cid)
        restore = ComponentRestore(
            cid, comp.num_tasks, saved.tasks if saved else 0, saved.state_version if saved else 1
        )
        if restore.rescaled:
            _check_rescale(topology, cid, restore, saved.windowed if saved else False, where)
        out[cid] = restore
    return RestorePlan(savepoint, restore_id or manifest.id, out, tuple(gone))


def restore_conf(
    path: str | Path,
    topology: Topology,
    bolt_class: Callable[[str], Any],
    stateful: Callable[[Any], bool],
    allow_unmatched: bool = False,
) -> dict[str, Any]:
    """Check that ``topology`` can start from the savepoint at ``path``; return the conf keys that make it.

    What ``submit --from-savepoint``, ``local-cluster --from-savepoint`` and
    ``deploy(from_savepoint=...)`` add to the topology's conf: the savepoint's absolute path
    and a fresh restore id (the workers reset each task once for it), so a savepoint that
    does not fit fails here, in one line, before any worker starts.

    Raises
    ------
    SavepointError
        The savepoint is missing, partial, corrupt, newer, another topology's, or does not fit.
    """
    savepoint = Savepoint.open(path, topology=topology.name)
    plan = plan_restore(savepoint, topology, lambda cid: stateful(bolt_class(cid)), None, allow_unmatched)
    for cid, item in plan.components.items():
        if item.saved_tasks:
            check_state_version(bolt_class(cid), item.saved_version, cid, savepoint)
    return {
        "topology.state.savepoint.path": str(savepoint.root.resolve()),
        "topology.state.savepoint.restore.id": uuid.uuid4().hex,
        "topology.state.savepoint.allow.unmatched": allow_unmatched,
    }


def check_state_version(cls: Any, saved: int, cid: str, savepoint: Savepoint) -> None:
    """Check that bolt class ``cls`` reads the ``saved`` state_version (equal, or newer with ``migrate_state``).

    Raises
    ------
    SavepointError
        A bad ``state_version``, an older one than saved, or a newer one without ``migrate_state``.
    """
    version = getattr(cls, "state_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        msg = f"component {cid!r}: {cls.__name__}.state_version is {version!r}; it must be an integer >= 1"
        raise SavepointError(msg)
    if version < saved:
        msg = (
            f"{savepoint.describe()}: component {cid!r} saved state_version {saved}, newer than "
            f"{cls.__name__}.state_version {version}; deploy the bolt that wrote it (or a newer one)"
        )
        raise SavepointError(msg)
    if version > saved and not callable(getattr(cls, "migrate_state", None)):
        msg = (
            f"component {cid!r}: {cls.__name__}.state_version is {version} and the savepoint's state is version "
            f"{saved}, but the bolt has no migrate_state(key, value, from_version); add it, or keep "
            f"state_version = {saved}"
        )
        raise SavepointError(msg)


def _check_rescale(topology: Topology, cid: str, restore: ComponentRestore, windowed: bool, where: str) -> None:
    comp = topology.components[cid]
    keep = f"keep its tasks at {restore.saved_tasks} (tasks: {restore.saved_tasks}; parallelism may differ)"
    if windowed or window_spec(comp.conf, cid, topology.conf) is not None:
        msg = f"{where}: component {cid!r} is windowed; its windows cannot move between tasks: {keep}"
        raise SavepointError(msg)
    groupings = {i.grouping for i in comp.inputs}
    if comp.source:
        groupings = {comp.grouping}
    if groupings - {"fields"}:
        msg = (
            f"{where}: component {cid!r} has {restore.saved_tasks} tasks in the savepoint and {restore.tasks} now, "
            f"but takes {', '.join(sorted(groupings))} grouping: only keyed state (a bolt behind a fields grouping "
            f"whose state keys are its grouping values) can be rescaled; {keep}"
        )
        raise SavepointError(msg)


def key_values(key: Any) -> tuple[Any, ...]:
    """Return the grouping values a state key stands for (a list key: several fields)."""
    return tuple(key) if isinstance(key, tuple) else (key,)


def split_keyed(
    states: Iterable[tuple[int, Mapping[Any, Any]]], saved_tasks: int, tasks: int, where: str
) -> list[dict[Any, Any]]:
    """Split the saved tasks' ``states`` ((old index, state), ...) over ``tasks`` tasks by the fields grouping's hash.

    Each key is hashed once (vectorised where its column's values share one type, as
    the Spark writer hashes them; one by one otherwise) and checked against the task it
    was saved on.

    Raises
    ------
    SavepointError
        A key of old task ``i`` does not hash to ``i``: the state is not keyed by the grouping values.
    """
    out: list[dict[Any, Any]] = [{} for _ in range(tasks)]
    for old_index, state in states:
        keys = list(state)
        hashes = _hashes(keys, old_index, where)
        old = np.mod(hashes, saved_tasks)
        stray = np.flatnonzero(old != old_index)
        if len(stray):
            key = keys[int(stray[0])]
            msg = (
                f"{where}: state key {key!r} is on task {old_index}, but its grouping values hash to task "
                f"{int(old[stray[0]])} of {saved_tasks}: this state is not keyed by its grouping values and "
                f"cannot be rescaled; restore it with {saved_tasks} tasks"
            )
            raise SavepointError(msg)
        for key, new in zip(keys, np.mod(hashes, tasks).tolist(), strict=True):
            out[new][key] = state[key]
    return out


def _hashes(keys: list[Any], old_index: int, where: str) -> Any:
    """Return the fields grouping's hash of every key, as an int64 numpy array."""
    if not keys:
        return np.zeros(0, dtype=np.int64)
    rows = [key_values(k) for k in keys]
    width = len(rows[0])
    if all(len(r) == width for r in rows):
        try:
            columns = [pa.array([r[i] for r in rows]) for i in range(width)]
            if not any(pa.types.is_null(c.type) for c in columns):
                return spark_hash(columns).astype(np.int64)
        except (pa.ArrowException, ConfigError, TypeError, ValueError, OverflowError):
            pass  # mixed or unhashable types in a column: one by one, as the workers route them
    out = np.empty(len(rows), dtype=np.int64)
    for i, values in enumerate(rows):
        try:
            out[i] = fields_hash(values)
        except (TypeError, ValueError) as exc:
            msg = f"{where}: state key {keys[i]!r} of task {old_index} cannot be hashed as grouping values ({exc})"
            raise SavepointError(msg) from exc
    return out


def task_share(
    states: Iterable[tuple[int, Mapping[Any, Any]]], saved_tasks: int, tasks: int, index: int, where: str
) -> dict[Any, Any]:
    """Return the keys of ``states`` that task ``index`` of ``tasks`` owns (see :func:`split_keyed`)."""
    return split_keyed(states, saved_tasks, tasks, where)[index]
