"""``topology.state.provider: bench.chaos_backend:ChaosBackend``: the embedded backend with a disk that stalls or fails.

The files and their layout are the embedded backend's (``spark_storm.state.files``), so the
harness reads the committed state with :class:`~spark_storm.state.files.EmbeddedBackend`.
While bench.chaos holds an ``fsync`` window open (:mod:`bench.chaos_plan`), each operation
below is hit with the window's chance ``p``:

* ``slow``: a changelog entry's write + fsync, or the fsync of an input-log segment sealed
  at a barrier, first sleeps ``slow_min_s``..``slow_max_s`` (a disk that stalls);
* ``fail``: the same operations raise ``OSError(EIO)`` instead (a disk that fails: the
  epoch is not durable, the round must fail and roll back, never commit);
* ``fail-commit``: writing a task's COMMITTED marker raises ``OSError(EIO)`` (the disk fails
  in the middle of a COMMIT, after other tasks and workers committed).

Provider settings (``topology.state.provider.config``): ``dir`` (as the embedded backend's)
and ``chaos`` (the control directory).
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.chaos_plan import Switch
from spark_storm.state.files import EmbeddedBackend, FileInputLog, FileTaskStore

__all__ = ["ChaosBackend"]


def _disturb(switch: Switch, what: str, modes: tuple[str, ...]) -> None:
    """Sleep or raise as the open window says, if this operation is hit."""
    injection = switch.active()
    if injection is None or injection.mode not in modes:
        return
    rng = switch.draw(injection, what)
    if rng is None:
        return
    switch.log(injection.mode, what)
    if injection.mode == "slow":
        time.sleep(rng.uniform(injection.slow_min_s, injection.slow_max_s))
        return
    raise OSError(errno.EIO, f"bench.chaos: injected I/O error ({injection.mode}, {what})")


class _ChaosTaskStore(FileTaskStore):
    def __init__(self, task: int, directory: Path, switch: Switch) -> None:
        super().__init__(task, directory)
        self._switch = switch

    def write_encoded(self, epoch: int, full: bool, parts: Sequence[bytes]) -> int:
        _disturb(self._switch, f"changelog task={self.task} epoch={epoch}", ("slow", "fail"))
        return super().write_encoded(epoch, full, parts)

    def mark_committed(self, epoch: int) -> None:
        _disturb(self._switch, f"committed task={self.task} epoch={epoch}", ("fail-commit",))
        super().mark_committed(epoch)


class _ChaosInputLog(FileInputLog):
    def __init__(self, task: int, directory: Path, writer: str, fsync_each: bool, switch: Switch) -> None:
        super().__init__(task, directory, writer, fsync_each)
        self._switch = switch

    def seal(self, epoch: int) -> Callable[[], None]:
        make_durable = super().seal(epoch)

        def disturbed() -> None:
            try:
                _disturb(self._switch, f"input-log task={self.task} barrier={epoch}", ("slow", "fail"))
            except OSError:
                make_durable()  # closes the sealed segment's file; the epoch is still reported not durable
                raise
            make_durable()

        return disturbed


class ChaosBackend(EmbeddedBackend):
    """The embedded backend whose writes and fsyncs bench.chaos can stall or fail (see the module doc)."""

    name = "chaos"

    def __init__(self, topology: str, settings: Mapping[str, Any]) -> None:
        super().__init__(topology, settings["dir"], fsync_each=settings.get("log.fsync") == "group")
        self._control = Path(settings["chaos"])

    def describe(self) -> str:
        return f"embedded state in {self.root}, disturbed by bench.chaos"

    def task_store(self, task: int) -> FileTaskStore:
        return _ChaosTaskStore(task, self.root / f"task-{task}", Switch(self._control, "fsync", f"task{task}"))

    def input_log(self, task: int, writer: str) -> FileInputLog:
        switch = Switch(self._control, "fsync", f"log{task}")
        log = _ChaosInputLog(task, self.root / f"task-{task}" / "log", writer, self._fsync_each, switch)
        self._logs.append(log)
        return log
