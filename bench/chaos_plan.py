"""The switches between bench.chaos and its plugins in the worker processes.

The harness turns an injection window on by writing ``<control dir>/<kind>.json`` (an
:class:`Injection`) and off by deleting it; a plugin in a worker (the state provider
``bench.chaos_backend:ChaosBackend``, the transport ``bench.chaos_transport:Context``) asks
:meth:`Switch.active` before each operation it may disturb, and appends one line per
injection to ``<control dir>/injected.log`` (``<kind> <mode> <what>``), which the harness
counts.  Which operation is hit is drawn from a ``random.Random`` seeded by the scenario, the
worker's slot and the operation's own count, so a scenario's plan is the same on a replay;
when the operations fall inside a window still depends on the schedule.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

__all__ = ["INJECTED_LOG", "Injection", "Switch", "count_injections", "write_injection"]

INJECTED_LOG: Final = "injected.log"
_RECHECK_S: Final = 0.05


@dataclass(frozen=True)
class Injection:
    """One window of injections: its ``mode``, the chance ``p`` that an operation is hit, and slow-down bounds."""

    mode: str
    p: float
    seed: int
    slow_min_s: float = 0.0
    slow_max_s: float = 0.0


def write_injection(control: Path, kind: str, injection: Injection | None) -> None:
    """Turn ``kind``'s window on (``injection``) or off (None), atomically."""
    path = control / f"{kind}.json"
    if injection is None:
        path.unlink(missing_ok=True)
        return
    tmp = control / f".{kind}.json.tmp"
    tmp.write_text(json.dumps(asdict(injection)))
    tmp.replace(path)


def count_injections(control: Path) -> dict[str, int]:
    """Injections per ``<kind>:<mode>`` logged so far."""
    out: dict[str, int] = {}
    try:
        text = (control / INJECTED_LOG).read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2:
            key = f"{parts[0]}:{parts[1]}"
            out[key] = out.get(key, 0) + 1
    return out


class Switch:
    """A plugin's view of one kind of window (re-read at most every 50 ms), its draws and its log."""

    def __init__(self, control: Path, kind: str, who: str) -> None:
        self.control = control
        self.kind = kind
        self.who = who
        self._path = control / f"{kind}.json"
        self._checked = 0.0
        self._current: Injection | None = None
        self._draws = 0

    def active(self) -> Injection | None:
        """The window in force now, or None."""
        now = time.monotonic()
        if now - self._checked >= _RECHECK_S:
            self._checked = now
            try:
                self._current = Injection(**json.loads(self._path.read_text()))
            except (OSError, ValueError, TypeError):
                self._current = None
        return self._current

    def draw(self, injection: Injection, what: str) -> random.Random | None:
        """A generator for this operation if it is hit (chance ``p``), else None."""
        self._draws += 1
        rng = random.Random(f"{injection.seed}:{self.kind}:{self.who}:{what}:{self._draws}")
        return rng if rng.random() < injection.p else None

    def log(self, mode: str, what: str) -> None:
        """Record one injection (one ``write``: lines from several processes do not interleave)."""
        line = f"{self.kind} {mode} {what} pid={os.getpid()}\n".encode()
        fd = os.open(self.control / INJECTED_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
