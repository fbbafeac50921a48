"""run_until_signalled: the one signal loop of the daemons (worker, local-cluster, nimbus, supervisor, ui)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from spark_storm.cli.signals import SECOND_SIGNAL_EXIT, run_until_signalled


@pytest.fixture(autouse=True)
def _restore_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_a_signal_during_start_is_not_lost_and_ends_the_wait() -> None:
    seen: list[str] = []
    polls: list[int] = []
    got = run_until_signalled(
        lambda: os.kill(os.getpid(), signal.SIGTERM),
        on_signal=seen.append,
        every=lambda: polls.append(1),
        poll_s=30,  # the signal ends the wait, not the poll
    )
    assert got == "SIGTERM"
    assert seen == ["SIGTERM"]
    assert polls == []


def test_until_ends_the_wait_and_every_runs_between_polls() -> None:
    polls: list[int] = []
    got = run_until_signalled(until=lambda: len(polls) >= 3, every=lambda: polls.append(1), poll_s=0.001)
    assert got is None
    assert len(polls) == 3


def test_a_second_signal_without_a_hard_exit_lets_the_shutdown_go_on() -> None:
    seen: list[str] = []
    got = run_until_signalled(lambda: os.kill(os.getpid(), signal.SIGINT), on_signal=seen.append, poll_s=30)
    assert got == "SIGINT"
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler)  # ours, still installed: not SIG_DFL, which would end this process
    os.kill(os.getpid(), signal.SIGTERM)  # the second signal, during the shutdown
    assert seen == ["SIGINT"]  # ignored: the first signal's wait is over and nothing ran again
    assert signal.getsignal(signal.SIGTERM) is handler


def test_a_second_signal_during_the_shutdown_runs_the_hard_exit() -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys
        from spark_storm.cli.signals import run_until_signalled
        got = run_until_signalled(
            lambda: os.kill(os.getpid(), signal.SIGTERM),
            on_second_signal=lambda: print("killing now", flush=True),
        )
        print("shutting down after", got, flush=True)
        os.kill(os.getpid(), signal.SIGINT)  # the second signal, during the ordered shutdown
        print("not reached", flush=True)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == SECOND_SIGNAL_EXIT, out.stderr
    assert out.stdout.splitlines() == ["shutting down after SIGTERM", "killing now"]
