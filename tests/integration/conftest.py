"""Fixtures of the integration tier."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.runs import RUNS


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    while RUNS:  # a failed test must not leave worker processes behind
        run = RUNS.pop()
        if not run.stopped:
            run.stopped = True
            run.ctx.term()
            run.cluster.stop()
