"""The CI skip rule (tests/support/skips.py): the skips allowed with CI=true, and what happens to the others."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.skips import ALLOWED_SKIPS, skip_allowed

# The only skips CI may take: none of them is fixed by installing anything.  A new entry
# needs a reason here and in ALLOWED_SKIPS; a missing package, jar or tool is never one.
ALLOWED = [
    "runs in scripts/test-floor's venv, where the wheel is installed",  # tests/packaging outside the floor venv
    "the zmq and cluster extras are installed in this venv",  # missing-extra errors need a venv without them
    "needs spark-storm installed editable from this checkout",  # tests/connect: hiding the checkout from Spark
    "no connection to break",  # conformance: local is in-process, kafka's records outlive clients
    "CPU affinity is Linux only",  # test_worker_config: sched_setaffinity is a Linux system call
    "cannot create a network namespace",  # tests/multihost without root or CAP_SYS_ADMIN
]


def test_the_allowed_skip_reasons_are_these_and_each_says_why() -> None:
    assert list(ALLOWED_SKIPS) == ALLOWED
    assert all(why.strip() for why in ALLOWED_SKIPS.values())


@pytest.mark.parametrize(
    "reason",
    [
        "redis-server is not installed: apt-get install redis-server (Debian's package)",
        "needs Debian's chromium and chromium-driver: apt-get install chromium chromium-driver (scripts/test does)",
        "no Kafka jars in jars/kafka: scripts/fetch-jars could not reach Maven Central (jars/kafka-mvn.log)",
        "no `ip` command to create network namespaces: apt-get install iproute2 (scripts/test does)",
        "PyPI is not reachable to install streamparse: ...",
        "could not import 'numpy': No module named 'numpy'",
    ],
)
def test_a_missing_package_jar_or_tool_is_not_an_allowed_skip(reason: str) -> None:
    assert not skip_allowed(reason)


def test_the_skips_the_suite_takes_for_what_cannot_be_installed_are_allowed() -> None:
    assert skip_allowed("Skipped: no connection to break: local is in-process, kafka's records outlive clients")
    assert skip_allowed(
        "cannot create a network namespace (`ip netns add` says: Operation not permitted); needs root or CAP_SYS_ADMIN"
    )


SKIPPING = """
import pytest

pytestmark = pytest.mark.filterwarnings("ignore")

def test_redis():
    pytest.skip("redis-server is not installed: apt-get install redis-server")

@pytest.mark.skipif(True, reason="needs Debian's chromium: apt-get install chromium")
def test_marker():
    pass

def test_allowed():
    pytest.skip("no connection to break: local is in-process")

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_xfail():
    raise AssertionError

def test_passes():
    pass
"""

MODULE_SKIP = """
import pytest

pytest.skip("no Kafka jars in jars/kafka: scripts/fetch-jars could not reach Maven Central", allow_module_level=True)

def test_never():
    pass
"""


def _pytest(tmp_path: Path, ci: str, *modules: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for n, module in enumerate(modules):
        (tmp_path / f"test_it{n or ''}.py").write_text(module)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.skips", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_with_ci_true_a_skip_not_on_the_list_fails_naming_its_reason(tmp_path: Path) -> None:
    out = _pytest(tmp_path, "true", SKIPPING)
    assert out.returncode == 1, out.stdout
    summary = out.stdout.strip().splitlines()[-1]
    assert "1 failed, 1 passed, 1 skipped, 1 xfailed, 1 error" in summary, out.stdout
    assert "FAILED test_it.py::test_redis" in out.stdout
    assert "ERROR test_it.py::test_marker" in out.stdout  # a skipif marker skips at setup
    assert "SKIPPED [1] test_it.py:14: no connection to break" in out.stdout
    assert "it skipped with: redis-server is not installed: apt-get install redis-server" in out.stdout
    assert "it skipped with: needs Debian's chromium: apt-get install chromium" in out.stdout


def test_with_ci_true_a_module_skip_not_on_the_list_is_a_collection_error(tmp_path: Path) -> None:
    out = _pytest(tmp_path, "true", MODULE_SKIP)
    assert out.returncode == 2, out.stdout  # pytest's "interrupted: errors during collection"
    assert "ERROR test_it.py - CI=true" in out.stdout
    assert "it skipped with: no Kafka jars in jars/kafka" in out.stdout


def test_outside_ci_a_skip_stays_a_skip(tmp_path: Path) -> None:
    out = _pytest(tmp_path, "", SKIPPING, MODULE_SKIP)
    assert out.returncode == 0, out.stdout
    assert "1 passed, 4 skipped, 1 xfailed" in out.stdout.strip().splitlines()[-1], out.stdout
