"""Test helpers: wait on conditions with deadlines, never fixed sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(pred: Callable[[], object], *, what: str, timeout: float = 10.0) -> None:
    """Poll ``pred`` until it is truthy; fail the test naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout}s waiting for {what}")
        time.sleep(0.005)
