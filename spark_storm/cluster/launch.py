"""Worker processes: started so that they cannot outlive their parent, stopped in order.

:func:`worker_command` is the ``spark-storm worker`` command line, :func:`launch_worker`
starts it (a session of its own, output to a log), :func:`stop_workers` stops workers
(SIGTERM to each worker, then SIGKILL what is left at the deadline, after its thread stacks
went to its log, and to whatever its bolts left in its group).  The supervisor and the local
cluster both run their workers through them.

``python -m spark_storm.cluster.launch --parent PID -- COMMAND...`` asks Linux to send the
process SIGTERM when its parent (the supervisor thread that started it) dies
(``PR_SET_PDEATHSIG``, kept across ``exec``), checks the parent is still ``PID`` (it may
have died before the request took effect), then replaces itself with ``COMMAND``.  So a
supervisor killed with SIGKILL still takes its workers down through their ordered
shutdown.  Elsewhere than Linux it only execs.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["launch_worker", "main", "stop_workers", "worker_command"]

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def main(argv: list[str] | None = None) -> int:
    """Set the parent-death signal and exec the command; returns only on a usage error."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != "--parent" or not args[1].isdigit() or args[2] != "--":
        sys.stderr.write("usage: python -m spark_storm.cluster.launch --parent PID -- COMMAND...\n")
        return 2
    parent, command = int(args[1]), args[3:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            sys.stderr.write(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}\n")
            return 1
    if os.getppid() != parent:
        sys.stderr.write(f"supervisor {parent} is gone; not starting the worker\n")
        return 1
    os.execvp(command[0], command)
    return 1  # pragma: no cover - execvp does not return


def worker_command(args: Sequence[str], overrides: Mapping[str, Any], conf_path: str | None = None) -> list[str]:
    """Return ``spark-storm worker ARGS`` (with ``--conf`` and a ``--set`` per override) as this Python runs it."""
    command = [sys.executable, "-m", "spark_storm.cli", "--log-level", "INFO", "worker", *args]
    if conf_path:
        command += ["--conf", conf_path]
    for key, value in overrides.items():
        command += ["--set", f"{key}={json.dumps(value)}"]
    return command


def launch_worker(command: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` tied to this process (it gets SIGTERM when the starting thread dies), output to ``log``.

    The worker leads a session (and a process group) of its own: :func:`stop_workers`
    signals the group, so what its bolts started goes with it.
    """
    tied = [sys.executable, "-m", "spark_storm.cluster.launch", "--parent", str(os.getpid()), "--", *command]
    with log.open("ab") as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {list(command)}\n".encode())
        out.flush()
        return subprocess.Popen(tied, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    """Send ``signum`` to the worker's process group (its pid: it leads its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def stop_workers(procs: Mapping[Any, subprocess.Popen[bytes]], timeout: float) -> tuple[dict[Any, int], list[Any]]:
    """SIGTERM every worker (an ordered shutdown), wait, then SIGKILL what is left of its group.

    The SIGTERM goes to the worker alone, not its group: its multilang children must go on
    until the worker's shutdown has drained what they hold (their emits reach the bolts
    after them), and the worker closes them itself.  A worker still running at the deadline
    first gets SIGUSR1 (its thread stacks go to its log), then SIGKILL; every group then gets
    SIGKILL, for whatever a worker left in it.  Returns every worker's exit code, and which had
    to be killed.
    """
    for proc in procs.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    codes: dict[Any, int] = {}
    killed: list[Any] = []
    for key, proc in procs.items():
        try:
            codes[key] = proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.error(
                "worker %s (pid %d) did not stop in %.0fs: its stacks go to its log, then it is killed",
                key,
                proc.pid,
                timeout,
            )
            if hasattr(signal, "SIGUSR1"):
                proc.send_signal(signal.SIGUSR1)
                time.sleep(0.5)  # faulthandler writes from the signal handler: give it a moment
            _signal_group(proc, signal.SIGKILL)
            codes[key] = proc.wait(10)
            killed.append(key)
        _signal_group(proc, signal.SIGKILL)  # whatever the worker left in its group (children of bolts) goes too
    return codes, killed


if __name__ == "__main__":
    raise SystemExit(main())
