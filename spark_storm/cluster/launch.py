"""Run a worker command so that it cannot outlive its supervisor.

``python -m spark_storm.cluster.launch --parent PID -- COMMAND...`` asks Linux to send the
process SIGTERM when its parent (the supervisor thread that started it) dies
(``PR_SET_PDEATHSIG``, kept across ``exec``), checks the parent is still ``PID`` (it may
have died before the request took effect), then replaces itself with ``COMMAND``.  So a
supervisor killed with SIGKILL still takes its workers down through their ordered
shutdown.  Elsewhere than Linux it only execs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["main"]

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


if __name__ == "__main__":
    raise SystemExit(main())
