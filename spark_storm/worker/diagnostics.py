"""Thread stacks in the worker's log: what a stuck worker was waiting on, jstack-style.

A worker that does not drain by its shutdown deadline logs every thread's stack before it
stops its executors, so the log of a hung run says which queue, lock or request each thread
waited on.  A running daemon dumps the same on ``SIGUSR1`` (see
:func:`spark_storm.cli.signals.run_until_signalled`).
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback

__all__ = ["log_thread_stacks", "thread_stacks"]

logger = logging.getLogger(__name__)


def thread_stacks() -> str:
    """Return every live thread's name and stack, innermost call last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f'Thread "{names.get(ident, "?")}" ({ident}):\n{stack}')
    return "\n".join(parts)


def log_thread_stacks(reason: str) -> None:
    """Log every thread's stack at ERROR, headed by ``reason``."""
    logger.error("%s; thread stacks follow\n%s", reason, thread_stacks())
