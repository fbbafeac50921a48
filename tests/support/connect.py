"""The Spark Connect tier's helpers."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest

from tests.support import ROOT


def install_spec() -> str:
    """What ``pip install`` gets spark-storm from here: ``-e ROOT`` (editable) or the floor run's wheel."""
    # Not importlib.metadata: the checkout's own spark_storm.egg-info shadows the installed metadata.
    if not (Path(sysconfig.get_paths()["purelib"]) / "spark_storm" / "__init__.py").exists():
        return f"-e {ROOT}"
    wheels = sorted(Path(os.environ.get("SPARK_STORM_DIST", ROOT / ".venv-floor" / "dist")).glob("*.whl"))
    if not wheels:
        pytest.fail("spark-storm is installed from a wheel, but SPARK_STORM_DIST holds none (scripts/test-floor)")
    return str(wheels[-1])
