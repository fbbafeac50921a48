"""Run a long-lived command until SIGTERM or Ctrl-C: the one signal loop every daemon uses."""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["SECOND_SIGNAL_EXIT", "run_until_signalled"]

#: Exit status when a second signal cuts the ordered shutdown short.
SECOND_SIGNAL_EXIT = 3


def _never() -> bool:
    return False


def run_until_signalled(
    start: Callable[[], object] | None = None,
    *,
    until: Callable[[], bool] = _never,
    every: Callable[[], None] | None = None,
    on_signal: Callable[[str], None] | None = None,
    on_second_signal: Callable[[], None] | None = None,
    poll_s: float = 0.5,
) -> str | None:
    """Install SIGTERM/SIGINT handlers, call ``start``, then block until a signal or ``until()``.

    ``SIGUSR1`` dumps every thread's stack to stderr and the daemon goes on (jstack's job).
    The handlers are installed before ``start`` runs, so a signal during start-up is not lost:
    the wait then ends at once.  They stay installed after this returns, so a second signal
    during the caller's ordered shutdown still reaches ``on_second_signal``.

    Parameters
    ----------
    start : callable, optional
        Starts the daemon (its exceptions propagate; the handlers stay installed).
    until : callable
        Polled every ``poll_s``; the wait ends when it returns true (e.g. a worker that
        stopped by itself, or a child process that exited).
    every : callable, optional
        Called after every ``poll_s`` without a signal (e.g. report a leadership change).
    on_signal : callable, optional
        Called with the signal's name (``"SIGTERM"``) on the first signal, in the handler.
    on_second_signal : callable, optional
        When given, a second signal calls it (it logs why and kills what must die at once),
        then the process exits with status :data:`SECOND_SIGNAL_EXIT` without further cleanup.
        When omitted, further signals are ignored: the shutdown already under way continues.
    poll_s : float
        Seconds between polls of ``until`` and calls of ``every``.

    Returns
    -------
    str or None
        The first signal's name, or None when ``until()`` ended the wait.
    """
    stop = threading.Event()
    first: str | None = None

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal first
        if first is None:
            first = signal.Signals(signum).name
            if on_signal is not None:
                on_signal(first)
            stop.set()
        elif on_second_signal is not None:
            on_second_signal()
            os._exit(SECOND_SIGNAL_EXIT)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 <pid>`: every thread's stack on stderr (the daemon's log)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    if start is not None:
        start()
    while not until() and not stop.wait(poll_s):
        if every is not None:
            every()
    return first
