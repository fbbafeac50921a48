"""The program a local Spark runs its Python workers with (spark/session.py ``worker_python``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from spark_storm.spark.session import worker_python

ZIP = str(Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip")
SHOW = "import os, sys; print(os.environ.get('PYTHONPATH')); print(sys.executable)"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    return tmp_path / "spark-storm"


def run(program: str, pythonpath: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([program, "-c", SHOW], env=env, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.splitlines()


@pytest.mark.skipif(os.name != "posix" or not Path(ZIP).is_file(), reason="pip pyspark's zip on a POSIX system")
def test_the_workers_run_this_interpreter_without_pip_pysparks_zip_and_nothing_else_changes(cache: Path) -> None:
    program = worker_python()
    assert Path(program).parent == cache
    assert run(program, f"/a b:{ZIP}:/c*:/other/pyspark.zip") == ["/a b:/c*:/other/pyspark.zip", sys.executable]
    assert run(program, ZIP) == ["", sys.executable]
    assert run(program, None) == ["", sys.executable]
    assert worker_python() == program  # written once: the same script for the same interpreter and zip


def test_another_spark_home_or_an_unwritable_cache_keeps_this_interpreter(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark-4.2.0-bin"))
    assert worker_python() == sys.executable  # its own pyspark.zip is the Spark that runs
    monkeypatch.delenv("SPARK_HOME")
    cache.parent.chmod(0o500)
    try:
        if os.access(cache.parent, os.W_OK):  # root writes anyway: make the cache a file instead
            cache.parent.chmod(0o700)
            cache.write_text("not a directory")
        assert worker_python() == sys.executable
    finally:
        cache.parent.chmod(0o700)
