"""Detached server processes tracked by PID: launch, check, stop (SIGTERM, then SIGKILL).

Shared by the project's own servers (Kafka broker, ZooKeeper, Spark standalone master and
worker): each outlives the command that started it (``spark-storm zookeeper start``), so it
is started detached through ``/bin/sh ... &`` (re-parented to init, never a zombie of ours),
in a session of its own, with its output in a log file, and found again by its PID file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["launch_detached", "live_pid", "stop_pid"]

logger = logging.getLogger(__name__)


def launch_detached(
    command: Sequence[str], log_file: Path, *, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> int:
    """Start ``command`` detached, stdout and stderr appended to ``log_file``; return its PID."""
    line = f"exec {shlex.join(command)} >> {shlex.quote(str(log_file))} 2>&1 < /dev/null"
    launched = subprocess.run(
        ["/bin/sh", "-c", f"({line}) & echo $!"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        start_new_session=True,
        env=dict(env) if env is not None else None,
        cwd=cwd,
    )
    return int(launched.stdout.strip())


def live_pid(pid_file: Path) -> int | None:
    """Return the PID recorded in ``pid_file`` if that process is still alive, else None."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, owned by someone else
        return pid
    return pid


def stop_pid(pid: int, what: str, timeout: float = 30.0) -> None:
    """SIGTERM ``pid``, wait up to ``timeout`` s for it to exit, then SIGKILL it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    logger.warning("%s (pid %d) ignored SIGTERM for %.0fs; killing it", what, pid, timeout)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
