from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_storm.tools import zookeeper_server
from spark_storm.tools.kafka_broker import KafkaBroker, default_jars_dir
from spark_storm.tools.spark_standalone import SparkStandalone
from spark_storm.tools.zookeeper_server import ZooKeeperServer
from spark_storm.worker.settings import SWITCH_INTERVAL_ENV, switch_interval_from_env
from tests.support import ROOT
from tests.support.browser import chromium
from tests.support.tls import Pki, make_pki

# With CI=true a skip no install can fix stays a skip; any other fails (tests/support/skips.py).
pytest_plugins = ["tests.support.skips"]


def pytest_configure(config: pytest.Config) -> None:
    """The library's debug log in every test's captured output; the race tier's switch interval.

    ``SPARK_STORM_SWITCH_INTERVAL_US`` (scripts/test's race tier sets 1) applies to this process
    here and, inherited, to every worker process a test starts (WorkerSettings reads it).
    """
    logging.getLogger("spark_storm").setLevel(logging.DEBUG)
    # Spark's JVMs here (local sessions, spark-submit, the Connect server) live for seconds on
    # small data: C2's compiles cost more than they return.  C1 only took a third less CPU over
    # the spark-submit and wheel tests (user time 36-40 s against 43-60 s, three runs each).
    # SPARK_SUBMIT_OPTS reaches every driver JVM spark-submit starts, and nothing else.
    os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} -XX:TieredStopAtLevel=1".strip()
    interval = switch_interval_from_env()
    if interval is not None:
        sys.setswitchinterval(interval)
    # Under pytest-xdist (scripts/test runs the main run on several processes) each test process
    # gets a temporary folder of its own, inherited by every worker, supervisor and Spark it
    # starts: the state backend's default folder (<temp dir>/spark-storm-state/<topology>) and
    # the local clusters' folders are then never shared by two tests running at once.
    xdist_worker = os.environ.get("PYTEST_XDIST_WORKER")
    if xdist_worker:
        own = tempfile.mkdtemp(prefix=f"spark-storm-tests-{xdist_worker}-")
        os.environ["TMPDIR"] = own
        tempfile.tempdir = None
        config.add_cleanup(lambda: shutil.rmtree(own, ignore_errors=True))


def pytest_report_header(config: pytest.Config) -> str:
    """Say which GIL switch interval the tests and their workers run at."""
    override = "" if switch_interval_from_env() is None else f" ({SWITCH_INTERVAL_ENV}, workers too)"
    return f"GIL switch interval: {sys.getswitchinterval() * 1e6:g} us{override}"


@pytest.fixture(scope="session")
def kafka_jars() -> Path:
    """The broker jars; the only skip: scripts/fetch-jars could not reach Maven Central."""
    jars = default_jars_dir()
    if not any(jars.glob("*.jar")):
        log = Path(jars).parent / "kafka-mvn.log"
        pytest.skip(f"no Kafka jars in {jars}: scripts/fetch-jars could not reach Maven Central ({log})")
    return jars


@pytest.fixture(scope="session")
def kafka_broker(kafka_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real KRaft broker on 127.0.0.1 for the whole test session; yields its bootstrap address.

    Shared by the kafka transport's conformance run (tests/integration) and tests/kafka.
    """
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"), kafka_jars)
    bootstrap = broker.start()
    yield bootstrap
    broker.stop()


@pytest.fixture(scope="session")
def spark_jars() -> list[str]:
    """Spark's Kafka connector and Delta jars from scripts/fetch-jars (skip only if Maven was unreachable)."""
    jars = sorted(str(p) for p in (default_jars_dir().parent / "spark").glob("*.jar"))
    if not any("spark-sql-kafka" in j for j in jars) or not any("delta-spark" in j for j in jars):
        log = default_jars_dir().parent / "spark-mvn.log"
        pytest.skip(f"no Spark connector jars in jars/spark: scripts/fetch-jars could not reach Maven Central ({log})")
    return jars


@pytest.fixture(scope="session")
def zookeeper_jars() -> Path:
    """The ZooKeeper server jars; the only skip: scripts/fetch-jars could not reach Maven Central."""
    jars = zookeeper_server.default_jars_dir()
    if not any(jars.glob("*.jar")):
        log = jars.parent / "zookeeper-mvn.log"
        pytest.skip(f"no ZooKeeper jars in {jars}: scripts/fetch-jars could not reach Maven Central ({log})")
    return jars


@pytest.fixture(scope="session")
def zookeeper(zookeeper_jars: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real standalone ZooKeeper on 127.0.0.1 for the whole session; yields ``127.0.0.1:PORT``.

    Tests share it and keep apart by using a chroot of their own (tests/cluster/conftest.py).
    """
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), zookeeper_jars)
    address = server.start()
    yield address
    server.stop()


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark standalone master and one worker (pyspark's own classes) on 127.0.0.1; yields the master URL."""
    cluster = SparkStandalone(tmp_path_factory.mktemp("spark-standalone"))
    master = cluster.start(cores=2, memory="2g")
    yield master
    cluster.stop()


@pytest.fixture(scope="session")
def tls_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA and certificates generated for this test session (tests/support/tls.py)."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def browser() -> Iterator[Any]:
    """Debian's chromium, headless, driven by selenium through chromium-driver (the UI's browser tests)."""
    driver = chromium()
    if not (ROOT / "spark_storm" / "ui" / "static" / "vendor" / "uPlot.iife.min.js").exists():
        driver.quit()
        pytest.fail("uPlot is missing: run scripts/fetch-ui-assets (scripts/setup does)")
    yield driver
    driver.quit()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the Spark Connect tier (tests/connect) last.

    Its local Connect server runs in this process's one Spark JVM, and stopping it (the
    module fixture's ``stop()``, which stops the server's classic session too) left the py4j
    gateway unusable for the classic sessions of later modules in the full run ("SparkConf
    does not exist in the JVM"); after every classic module it stops nothing they need.
    """
    items.sort(key=lambda item: item.get_closest_marker("connect") is not None)
