"""The built wheel and sdist, installed (not editable) in a venv that looks like a Spark runtime.

``scripts/test-floor`` builds the dists, makes a fresh venv with pyspark 4.2.0, numpy 1.26.4
and pyarrow 18.1.0, installs the wheel without extras and runs this module with that venv's
Python (``SPARK_STORM_DIST`` names the dists).  Every program below runs from a temporary
directory, so it sees the installed files only, never this checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheel

DIST = os.environ.get("SPARK_STORM_DIST")


def _installed_from_wheel() -> bool:
    # Not importlib.metadata: the checkout's own spark_storm.egg-info shadows the installed metadata.
    return (Path(sysconfig.get_paths()["purelib"]) / "spark_storm" / "__init__.py").exists()


if not DIST or not _installed_from_wheel():
    pytest.skip(
        "runs in scripts/test-floor's venv, where the wheel is installed (scripts/test calls it after this run)",
        allow_module_level=True,
    )

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FILES = (
    "pyspark_storm.py",
    "pyspark_storm_state.py",
    "spark_storm/defaults.yaml",
    "spark_storm/py.typed",
    "spark_storm/examples/corpus.txt",
    "spark_storm/examples/wordcount.yaml",
    "spark_storm/examples/wordcount-arrow.yaml",
    "spark_storm/spark/log4j2-quiet.properties",
    "spark_storm/ui/static/index.html",
    "spark_storm/ui/static/topology.html",
    "spark_storm/ui/static/component.html",
    "spark_storm/ui/static/app.js",
    "spark_storm/ui/static/style.css",
    "spark_storm/ui/static/vendor/uPlot.iife.min.js",
    "spark_storm/ui/static/vendor/uPlot.min.css",
)


def _run(args: list[str], cwd: Path, timeout: float = 300, **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = sys.executable
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, check=False, **kw)  # type: ignore[call-overload,no-any-return]


def test_the_wheel_and_the_sdist_hold_the_ui_assets_defaults_and_examples() -> None:
    assert DIST is not None
    wheel = next(Path(DIST).glob("spark_storm-*.whl"))
    sdist = next(Path(DIST).glob("spark_storm-*.tar.gz"))
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in PACKAGE_FILES if f not in names]
    assert not missing, f"the wheel lacks {missing}"
    assert not [n for n in names if n.startswith(("tests/", "jobs/", "bench/"))], "the wheel ships test or job code"
    with tarfile.open(sdist) as tf:
        top = tf.getnames()[0].split("/")[0]
        snames = {n.removeprefix(top + "/") for n in tf.getnames()}
    for needed in (
        *PACKAGE_FILES,
        "pyproject.toml",
        "README.md",
        "conf/defaults.yaml",
        "conf/topologies/wordcount.yaml",
    ):
        assert needed in snames, f"the sdist lacks {needed}"
    assert "jobs/notebooks/storm_stream.ipynb" in snames
    assert "constraints/floor.txt" in snames


def test_installed_files_come_from_the_wheel_not_the_checkout(tmp_path: Path) -> None:
    code = (
        "import json, spark_storm, pyspark_storm, pkgutil, numpy, pyarrow\n"
        "print(json.dumps({'storm': spark_storm.__file__, 'numpy': numpy.__version__, 'pyarrow': pyarrow.__version__,"
        " 'found': [m.name for m in pkgutil.iter_modules() if m.name.startswith('pyspark_')]}))\n"
    )
    out = _run([sys.executable, "-c", code], tmp_path)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert "site-packages" in info["storm"]
    assert not info["storm"].startswith(str(ROOT / "spark_storm"))
    assert info["found"] == ["pyspark_storm", "pyspark_storm_state"]  # what Spark's data source lookup scans
    expected = os.environ.get("SPARK_STORM_EXPECT_RUNTIME")  # e.g. "numpy==1.26.4 pyarrow==18.1.0"
    for pin in (expected or "").split():
        name, _, version = pin.lower().partition("==")
        if name in info:
            assert info[name] == version, f"{name} is {info[name]}, the runtime had {version}"


def test_the_transport_demo_runs_from_the_installed_wheel(tmp_path: Path) -> None:
    cli = Path(sys.executable).parent / "spark-storm"
    out = _run([str(cli), "transport-demo", "--transport", "tcp", "--seconds", "2"], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "sent == received: OK" in out.stdout


def test_a_missing_extra_is_one_line_naming_it(tmp_path: Path) -> None:
    # Only where the extras are not installed (scripts/test-floor runs this module before adding them).
    cli = Path(sys.executable).parent / "spark-storm"
    cases = {"zmq": ["transport-demo", "--transport", "zmq"], "kazoo": ["list", "--zookeeper", "127.0.0.1:1"]}
    ran = 0
    for module, args in cases.items():
        try:
            __import__(module)
            continue
        except ImportError:
            ran += 1
        out = _run([str(cli), *args], tmp_path, timeout=60)
        extra = {"zmq": "zmq", "kazoo": "cluster"}[module]
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2, out.stderr
        assert len(lines) == 1, f"not one line:\n{out.stderr}"
        assert lines[0].startswith("spark-storm: ")
        assert f"pip install 'spark-storm[{extra}]'" in lines[0]
    if not ran:
        pytest.skip("the zmq and cluster extras are installed in this venv")


SPARK_JOB = """
import json, sys, urllib.request
from importlib import resources
from pyspark.sql import SparkSession
from spark_storm.cluster.local_cluster import LocalCluster

topology = str(resources.files("spark_storm.examples") / "wordcount.yaml")
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
rows = 500
with open("in/part0.json", "w") as f:
    f.writelines(json.dumps({"sentence": f"the quick brown fox {i}"}) + "\\n" for i in range(rows))
with LocalCluster(topology, 2) as cluster:
    # no register(): Spark finds pyspark_storm in site-packages by itself
    spark.range(rows).selectExpr("concat('a b c ', CAST(id AS STRING)) AS sentence").write.format("storm") \\
        .mode("append").option("topology", topology).option("workers", cluster.workers_arg).save()
    q = (spark.readStream.schema("sentence string").json("in").writeStream.format("storm")
         .option("topology", topology).option("workers", cluster.workers_arg)
         .option("checkpointLocation", "ck").trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    received = 0
    for slot in cluster.slots:
        received += cluster.health(slot)["counters"]["source_tuples_in"]
    print(f"sent {2 * rows} processed {received}")
spark.stop()
"""


def test_a_local_cluster_and_format_storm_run_from_the_installed_wheel(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    out = _run([sys.executable, "-c", SPARK_JOB], tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("sent ")][-1]
    _, sent, _, processed = line.split()
    assert int(sent) == int(processed) == 1000
