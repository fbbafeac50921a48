"""Savepoints: every stateful task's committed state at one epoch, in a directory of its own.

A savepoint is what ``spark-storm savepoint`` (or ``kill --savepoint``) writes and what
``submit --from-savepoint`` starts from (docs/design/state.md, "Savepoints").  Whatever the
state provider, it is files::

    <dir>/savepoint-<topology>-e<epoch>-<id8>/
        MANIFEST.json                 written last: a directory without it is partial
        ledger/task-0/COMMITTED       {"epoch": 41}
        ledger/task-0/e000000000040.full    the task's entries from its last full snapshot
        ledger/task-0/e000000000041.delta   up to the epoch, byte for byte as the backend held them
        ledger/task-1/...

Tasks are named by their *index* in their component (0 .. tasks-1), never by task id, so a
topology whose task ids moved (a component added before it) matches by component id.
Each task directory is an embedded backend's task directory
(:class:`~spark_storm.state.files.FileTaskStore`): the same code reads it back, and the
change feed of every epoch it holds is there to read.

The manifest names the topology, its version (a digest of its definition), the epoch, the ``{query id: batch id}`` the
epoch holds (a restored topology takes groups of those batches as replays), the group keys
of open batches a source component had seen whole (``kept``), and per component its task
count and the ``state_version`` of its bolt; and every file with its size and CRC-32, so
a restore refuses a savepoint that is partial, truncated or corrupt before any task takes
a byte of it (:meth:`Savepoint.open`).
"""

from __future__ import annotations

import json
import os
import re
import uuid
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from spark_storm.errors import SavepointError, StateCorruptError
from spark_storm.messaging.api import GroupKey
from spark_storm.state.backend import NO_EPOCH, TaskStore
from spark_storm.state.files import FileTaskStore

__all__ = [
    "FORMAT",
    "MANIFEST",
    "ComponentManifest",
    "Manifest",
    "Savepoint",
    "merge_answers",
    "new_savepoint_dir",
    "restore_chain",
    "task_dir",
    "write_manifest",
    "write_task",
]

#: The manifest format this code writes and reads (a newer one is refused, naming both).
FORMAT: Final = 1
MANIFEST: Final = "MANIFEST.json"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def task_dir(root: Path, component: str, index: int) -> Path:
    """Where task ``index`` of ``component`` lies in a savepoint."""
    return root / _safe(component) / f"task-{index}"


def new_savepoint_dir(parent: str | Path, topology: str, epoch: int) -> tuple[Path, str]:
    """Return a new savepoint's directory under ``parent`` and its id (Flink's ``savepoint-<id>`` naming)."""
    ident = uuid.uuid4().hex
    return Path(parent).expanduser().resolve() / f"savepoint-{_safe(topology)}-e{epoch}-{ident[:8]}", ident


@dataclass(frozen=True)
class ComponentManifest:
    """One stateful component in a savepoint: its task count and its bolt's ``state_version``."""

    tasks: int
    state_version: int = 1
    windowed: bool = False


@dataclass(frozen=True)
class Manifest:
    """What ``MANIFEST.json`` says (see the module doc)."""

    id: str
    topology: str
    version: str
    epoch: int
    created: float
    batches: dict[str, int]
    kept: dict[str, list[GroupKey]]
    components: dict[str, ComponentManifest]
    files: dict[str, tuple[int, int]] = field(default_factory=dict)  # relative path -> (bytes, crc32)
    format: int = FORMAT

    def to_json(self) -> dict[str, Any]:
        """Return the manifest as JSON."""
        return {
            "format": self.format,
            "id": self.id,
            "topology": self.topology,
            "version": self.version,
            "epoch": self.epoch,
            "created": self.created,
            "batches": self.batches,
            "kept": {c: [list(k) for k in keys] for c, keys in self.kept.items()},
            "components": {
                c: {"tasks": m.tasks, "state_version": m.state_version, "windowed": m.windowed}
                for c, m in self.components.items()
            },
            "files": {p: {"bytes": b, "crc32": c} for p, (b, c) in sorted(self.files.items())},
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> Manifest:
        """Read a manifest (SavepointError naming ``where`` and what is wrong)."""
        if not isinstance(data, dict):
            msg = f"{where}: holds a {type(data).__name__}, not a savepoint manifest; it is corrupt"
            raise SavepointError(msg)
        fmt = data.get("format")
        if not isinstance(fmt, int) or fmt > FORMAT:
            msg = (
                f"{where}: savepoint format {fmt!r} is newer than this spark-storm reads ({FORMAT}); "
                "restore it with the spark-storm version that wrote it, or a newer one"
            )
            raise SavepointError(msg)
        try:
            return cls(
                id=str(data["id"]),
                topology=str(data["topology"]),
                version=str(data["version"]),
                epoch=int(data["epoch"]),
                created=float(data["created"]),
                batches={str(q): int(b) for q, b in data["batches"].items()},
                kept={
                    str(c): [(str(k[0]), int(k[1]), int(k[2]), int(k[3])) for k in keys]
                    for c, keys in data["kept"].items()
                },
                components={
                    str(c): ComponentManifest(
                        int(m["tasks"]), int(m.get("state_version", 1)), bool(m.get("windowed", False))
                    )
                    for c, m in data["components"].items()
                },
                files={str(p): (int(f["bytes"]), int(f["crc32"])) for p, f in data["files"].items()},
                format=fmt,
            )
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            msg = f"{where}: a savepoint manifest lacks or mangles {exc!r}; it is corrupt"
            raise SavepointError(msg) from exc


def restore_chain(store: TaskStore, epoch: int) -> list[int]:
    """Return the epochs of ``store`` a restore of ``epoch`` reads: its last full snapshot up to ``epoch``.

    Raises
    ------
    SavepointError
        An entry the chain needs is missing (the task cannot be saved at ``epoch``).
    """
    epochs = [e for e in store.epochs() if e <= epoch]
    fulls = [e for e in store.fulls() if e <= epoch]
    first = fulls[-1] if fulls else 1
    chain = [e for e in epochs if e >= first]
    missing = sorted(set(range(first, epoch + 1)) - set(chain))
    if missing and epoch != NO_EPOCH:
        shown = ", ".join(map(str, missing[:5]))
        msg = f"{store.describe()}: cannot save epoch {epoch}: the entries of epoch(s) {shown} are missing"
        raise SavepointError(msg)
    return chain


def write_task(root: Path, component: str, index: int, store: TaskStore, epoch: int) -> dict[str, tuple[int, int]]:
    """Copy the entries ``store`` restores ``epoch`` from into the savepoint at ``root``; return them as manifest files.

    Entries are copied as stored (no decoding); the copy is committed at ``epoch``.
    """
    target = FileTaskStore(index, task_dir(root, component, index))
    files: dict[str, tuple[int, int]] = {}
    fulls = set(store.fulls())
    for entry_epoch in restore_chain(store, epoch):
        data = store.read_raw(entry_epoch)
        full = entry_epoch in fulls
        target.write_encoded(entry_epoch, full, [data])
        name = f"e{entry_epoch:012d}.{'full' if full else 'delta'}"
        files[str((target.dir / name).relative_to(root))] = (len(data), zlib.crc32(data))
    target.mark_committed(epoch)
    marker = (target.dir / "COMMITTED").read_bytes()
    files[str((target.dir / "COMMITTED").relative_to(root))] = (len(marker), zlib.crc32(marker))
    return files


def write_manifest(root: Path, manifest: Manifest) -> Path:
    """Write ``MANIFEST.json`` last, durably: from then on the savepoint is whole."""
    path = root / MANIFEST
    tmp = root / f".{MANIFEST}.{os.getpid()}.tmp"
    data = json.dumps(manifest.to_json(), indent=1).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


class Savepoint:
    """A savepoint read back, checked whole (:meth:`open`)."""

    def __init__(self, root: Path, manifest: Manifest) -> None:
        self.root = root
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path, *, topology: str | None = None, check_files: bool = True) -> Savepoint:
        """Read and check a savepoint: its manifest, and every file's size and CRC-32.

        Raises
        ------
        SavepointError
            One line naming the path and what is wrong: not a directory, partial (no
            manifest), a corrupt or newer manifest, a file missing, truncated or changed, or
            (``topology`` given) another topology's savepoint.
        """
        root = Path(path).expanduser()
        if not root.is_dir():
            what = "does not exist" if not root.exists() else "is not a directory"
            msg = f"savepoint {root} {what}; pass the directory `spark-storm savepoint` printed"
            raise SavepointError(msg)
        manifest_path = root / MANIFEST
        if not manifest_path.is_file():
            msg = (
                f"savepoint {root} is partial: it has no {MANIFEST} (written last, so the savepoint was cut "
                "short or is still being written); take the savepoint again"
            )
            raise SavepointError(msg)
        try:
            data = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            msg = f"savepoint {manifest_path} is unreadable ({exc}); it is corrupt"
            raise SavepointError(msg) from exc
        manifest = Manifest.from_json(data, str(manifest_path))
        if topology is not None and manifest.topology != topology:
            msg = (
                f"savepoint {root} is of topology {manifest.topology!r}, not {topology!r}; restore a savepoint "
                f"of {topology!r}, or name the topology {manifest.topology!r}"
            )
            raise SavepointError(msg)
        if check_files:
            for rel, (size, crc) in sorted(manifest.files.items()):
                _check_file(root, rel, size, crc)
        return cls(root, manifest)

    def task_store(self, component: str, index: int) -> FileTaskStore:
        """Return task ``index`` of ``component`` as a task store (committed at the savepoint's epoch)."""
        meta = self.manifest.components.get(component)
        if meta is None:
            msg = f"savepoint {self.root} has no state of component {component!r} (it has {self.components_text()})"
            raise SavepointError(msg)
        if not 0 <= index < meta.tasks:
            msg = f"savepoint {self.root}: component {component!r} has {meta.tasks} tasks, not a task {index}"
            raise SavepointError(msg)
        return FileTaskStore(index, task_dir(self.root, component, index))

    def read_task(self, component: str, index: int) -> dict[Any, Any]:
        """Return task ``index`` of ``component``'s state at the savepoint's epoch."""
        store = self.task_store(component, index)
        try:
            return store.restore(self.manifest.epoch)[1]
        except StateCorruptError as exc:
            msg = f"savepoint {self.root}: {exc}"
            raise SavepointError(msg) from exc

    def components_text(self) -> str:
        """Return the components the savepoint holds, for messages."""
        return ", ".join(sorted(self.manifest.components)) or "none"

    def describe(self) -> str:
        """One line: the path, the topology, the epoch."""
        m = self.manifest
        return f"savepoint {self.root} (topology {m.topology!r} version {m.version}, epoch {m.epoch})"


def _check_file(root: Path, rel: str, size: int, crc: int) -> None:
    path = root / rel
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        msg = f"savepoint {root}: {rel} is missing (the manifest lists it); the savepoint is incomplete"
        raise SavepointError(msg) from None
    except OSError as exc:
        msg = f"savepoint {root}: {rel} is unreadable ({exc})"
        raise SavepointError(msg) from exc
    if len(data) != size:
        msg = f"savepoint {root}: {rel} has {len(data)} bytes, the manifest says {size}; it is truncated or changed"
        raise SavepointError(msg)
    if zlib.crc32(data) != crc:
        msg = f"savepoint {root}: {rel} fails its CRC-32 check; it is corrupt"
        raise SavepointError(msg)


def merge_answers(answers: Iterable[Mapping[str, Any]]) -> tuple[dict[str, int], dict[str, list[GroupKey]]]:
    """Merge the workers' committed batches (max per query) and kept keys (per source component)."""
    batches: dict[str, int] = {}
    kept: dict[str, dict[GroupKey, None]] = {}
    for answer in answers:
        for query, batch in dict(answer.get("batches", {})).items():
            batches[str(query)] = max(int(batch), batches.get(str(query), int(batch)))
        for component, keys in dict(answer.get("kept", {})).items():
            into = kept.setdefault(str(component), {})
            for k in keys:
                into[(str(k[0]), int(k[1]), int(k[2]), int(k[3]))] = None
    return batches, {c: list(keys) for c, keys in kept.items()}
