"""The worker's side of exact state (docs/design/state.md), split by role.

* :mod:`~.alignment` — per executor, on its thread: barrier alignment and its stateful
  tasks' changelogs (:class:`ExecutorCheckpoints`; :class:`NoAlignment` without state);
* :mod:`~.inputs` — the input logs of the worker's source tasks: the receive gate, seals at
  barriers, the replay after a rollback (:class:`InputLogs`);
* :mod:`~.participant` — the worker's answers to the coordinators: lease, PAUSE, RESUME,
  PREPARE, COMMIT, the generation and the dirty flag (:class:`CheckpointManager`);
* :mod:`~.interval` — Storm's checkpoint interval for plain clients (:class:`IntervalCheckpoints`);
* :mod:`~.none` — a topology without state (:class:`NoCheckpoints`), so the worker asks its
  checkpoints the same questions either way;
* :mod:`~.settings` — the ``topology.state.*`` keys, read once (:class:`CheckpointSettings`).
"""

from __future__ import annotations

from collections.abc import Mapping

from spark_storm.worker.checkpoint.alignment import ExecutorCheckpoints, NoAlignment
from spark_storm.worker.checkpoint.inputs import InputLogs
from spark_storm.worker.checkpoint.interval import IntervalCheckpoints, take_savepoint
from spark_storm.worker.checkpoint.none import NoCheckpoints
from spark_storm.worker.checkpoint.participant import CheckpointManager
from spark_storm.worker.checkpoint.settings import CheckpointSettings
from spark_storm.worker.stateful import is_stateful

__all__ = [
    "CheckpointManager",
    "CheckpointSettings",
    "Checkpoints",
    "ExecutorCheckpoints",
    "InputLogs",
    "IntervalCheckpoints",
    "NoAlignment",
    "NoCheckpoints",
    "take_savepoint",
    "topology_is_stateful",
]

#: What a worker's checkpoints are: a stateful topology's, or the stand-in of one without state.
Checkpoints = CheckpointManager | NoCheckpoints


def topology_is_stateful(bolt_classes: Mapping[str, object]) -> bool:
    """Whether any component's bolt class keeps checkpointed state."""
    return any(is_stateful(cls) for cls in bolt_classes.values())
