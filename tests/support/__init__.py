"""Helpers shared by the test tiers (conftests hold only fixtures; test modules import from here)."""

import time
from collections.abc import Callable
from pathlib import Path

#: The checkout's root (conf/, jobs/, jars/ are found from it; daemons run with it as their cwd).
ROOT = Path(__file__).resolve().parents[2]


def wordcount(tmp: Path, name: str = "wordcount") -> Path:
    """conf/topologies/wordcount.yaml renamed ``name``, its report under ``tmp``."""
    text = (ROOT / "conf" / "topologies" / "wordcount.yaml").read_text()
    text = text.replace('report.dir: "./wordcount-report"', f'report.dir: "{tmp / "report"}"')
    text = text.replace("name: wordcount", f"name: {name}")
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    return path


def wait_until(pred: Callable[[], object], *, what: str, timeout: float = 10.0, interval: float = 0.005) -> None:
    """Poll ``pred`` every ``interval`` s until it is truthy; fail the test naming ``what`` after ``timeout`` s.

    Tests wait on conditions with deadlines, never fixed sleeps.  The default interval polls
    often (in-process state is cheap to look at); a ``pred`` that asks another process
    (ZooKeeper, a log file, an HTTP endpoint) each time passes a longer ``interval`` so the
    polling does not take the CPU the processes under test need.
    """
    import pytest  # here, not at the top: bench imports these helpers without pytest installed

    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout}s waiting for {what}")
        time.sleep(interval)
