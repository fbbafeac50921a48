"""Run a server as the child of a guardian that stops it once the process that started it is gone.

``python -m spark_storm.tools.lifeline --fd N [--remove DIR] -- COMMAND...`` starts ``COMMAND``
and waits until it exits or until file descriptor ``N`` reaches end of file.  ``N`` is the read
end of a pipe whose write end only the starter holds (:func:`launch_tied`), so end of file means
the starter exited, however it exited (``SIGKILL`` included, which no exit handler sees).  The
guardian then stops ``COMMAND`` (SIGTERM, SIGKILL after ``--grace`` seconds), removes each
``--remove DIR`` and exits.  SIGTERM or SIGINT to the guardian does the same, so stopping the
guardian by its PID stops the server.  On Linux ``COMMAND`` also gets SIGKILL if the guardian
itself is killed (``PR_SET_PDEATHSIG``).

``spark_storm.spark.deploy`` starts its ZooKeeper this way: a driver that dies leaves no server
behind, and the server's data (the deployment's znodes) goes with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["launch_tied", "main"]

_PR_SET_PDEATHSIG = 1
_USAGE = "usage: python -m spark_storm.tools.lifeline --fd N [--remove DIR]... [--grace S] -- COMMAND...\n"


def launch_tied(
    command: Sequence[str],
    log_file: Path,
    *,
    remove: Sequence[Path] = (),
    grace_s: float = 10.0,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``command`` under a guardian tied to this process; return the guardian and the pipe's write end.

    Keep the returned file descriptor open for as long as the server should live: closing it
    (or this process ending) stops the server.  The guardian's PID is the one to stop it by.
    """
    read_end, write_end = os.pipe()  # both non-inheritable: only the guardian gets read_end (pass_fds)
    guardian = [sys.executable, "-m", "spark_storm.tools.lifeline", "--fd", str(read_end), "--grace", str(grace_s)]
    for path in remove:
        guardian += ["--remove", str(path)]
    try:
        with log_file.open("ab") as out:
            proc = subprocess.Popen(
                [*guardian, "--", *command],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(read_end,),
                start_new_session=True,
                env=dict(env) if env is not None else None,
                cwd=cwd,
            )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return proc, write_end


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the guardian dies (Linux only)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def main(argv: list[str] | None = None) -> int:
    """Run the guardian; returns the server's exit code (or 2 on a usage error)."""
    args = list(sys.argv[1:] if argv is None else argv)
    fd: int | None = None
    grace = 10.0
    remove: list[str] = []
    try:
        while args and args[0] != "--":
            flag, value = args[0], args[1]
            args = args[2:]
            if flag == "--fd":
                fd = int(value)
            elif flag == "--grace":
                grace = float(value)
            elif flag == "--remove":
                remove.append(value)
            else:
                raise ValueError(flag)
    except (IndexError, ValueError):
        sys.stderr.write(_USAGE)
        return 2
    command = args[1:]
    if fd is None or not command:
        sys.stderr.write(_USAGE)
        return 2
    stop = threading.Event()
    why = ["the server exited"]

    def on_signal(signum: int, _frame: object) -> None:
        why[0] = f"signal {signal.Signals(signum).name}"
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    proc = subprocess.Popen(command, preexec_fn=_die_with_parent)  # before any thread of ours starts

    def watch(descriptor: int) -> None:
        with contextlib.suppress(OSError):
            while os.read(descriptor, 64):
                pass
        why[0] = "its starter exited (lifeline closed)"
        stop.set()

    threading.Thread(target=watch, args=(fd,), name="lifeline", daemon=True).start()
    while not stop.is_set() and proc.poll() is None:
        stop.wait(0.2)
    if proc.poll() is None:
        sys.stderr.write(f"lifeline: stopping {command[0]} (pid {proc.pid}): {why[0]}\n")
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for path in remove:
        shutil.rmtree(path, ignore_errors=True)
    return proc.returncode if proc.returncode and proc.returncode > 0 else 0


if __name__ == "__main__":
    raise SystemExit(main())
