"""Spark Connect: detect a Connect session, check its server's Python workers, ship the package.

Over Spark Connect (Databricks serverless and shared clusters, ``SparkSession.builder.remote``)
the client only builds plans: ``format("storm")``, the ``foreachBatch`` function and the
``foreach`` writer run in the *server's* Python workers.  So spark-storm must be importable
there, not only on the client:

* installed where the server runs (a cluster library, ``%pip install`` on a classic cluster,
  a wheel in the server's environment): Spark finds ``format("storm")`` by itself, as in a
  classic session;
* or shipped from the client with :func:`ship`, which adds the installed package as a
  Python artifact of this session (``spark.addArtifacts(zip, pyfile=True)``) and registers
  the data source (Spark's own scan for data sources runs once per server, without a
  session's artifacts, so a shipped copy needs :func:`spark_storm.spark.register`).

:func:`check_server` asks the server's Python workers, with one tiny job, whether they can
import spark-storm and which version; :func:`spark_storm.spark.register` calls it on a
Connect session and raises :class:`ServerPackageError` naming both fixes when they cannot.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import spark_storm
from spark_storm.errors import ServerPackageError

__all__ = ["ServerPackageError", "check_server", "is_connect", "package_zip", "ship"]

logger = logging.getLogger(__name__)


def is_connect(spark: Any) -> bool:
    """Return True if ``spark`` is a Spark Connect session (``pyspark.sql.connect``), False for a classic one."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _probe_source() -> str:
    # Built from source text so that cloudpickle ships the function by value: a function of an
    # importable module goes by reference, and its unpickling would itself need spark_storm.
    return (
        "def probe(_):\n"
        "    import sys\n"
        "    try:\n"
        "        import spark_storm, pyspark_storm\n"
        "    except Exception as exc:\n"
        "        return 'missing\\t' + sys.executable + '\\t' + type(exc).__name__ + ': ' + str(exc)\n"
        "    return 'ok\\t' + sys.executable + '\\t' + spark_storm.__version__ + '\\t' + str(spark_storm.__file__)\n"
    )


def check_server(spark: Any) -> str:
    """Return where the server's Python workers import spark-storm from; raise if they cannot.

    Runs one one-row Python UDF job on ``spark`` (a Connect session, usually).

    Raises
    ------
    ServerPackageError
        The workers cannot import spark-storm, or import another version than this client's;
        the message names the Python they run and both fixes.
    """
    from pyspark.sql.functions import udf

    namespace: dict[str, Any] = {}
    exec(_probe_source(), namespace)
    probe = udf(namespace["probe"], "string")
    answer = str(spark.range(1).select(probe("id")).first()[0])
    state, python, *rest = answer.split("\t")
    fixes = (
        "install spark-storm where the server's Python workers run (a cluster library, or %pip install "
        "spark-storm on the cluster; for a local server, PYSPARK_PYTHON names that Python), or ship it from "
        "this client: spark_storm.spark.ship(spark)"
    )
    if state != "ok":
        msg = f"the Spark Connect server's Python workers ({python}) cannot import spark_storm ({rest[0]}): {fixes}"
        raise ServerPackageError(msg)
    version, where = rest
    if version != spark_storm.__version__:
        msg = (
            f"the Spark Connect server's Python workers ({python}) run spark-storm {version} from {where}, "
            f"this client {spark_storm.__version__}: install the same version on both, or ship this one with "
            "spark_storm.spark.ship(spark)"
        )
        raise ServerPackageError(msg)
    return where


def package_zip(directory: str | Path | None = None) -> Path:
    """Zip the installed spark-storm (``spark_storm/`` and the ``pyspark_storm*.py`` shims) for ``addArtifacts``.

    Spark Connect takes Python artifacts as ``.py``, ``.zip``, ``.egg`` or ``.jar`` only, so a
    wheel is not accepted as such; this zip holds the same files.  Returns its path (in
    ``directory``, default a new temporary one).
    """
    import pyspark_storm
    import pyspark_storm_state

    package = Path(spark_storm.__file__).parent
    out = Path(directory or tempfile.mkdtemp(prefix="spark-storm-ship-")) / f"spark_storm-{spark_storm.__version__}.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                zf.write(path, Path("spark_storm") / path.relative_to(package))
        zf.write(str(pyspark_storm.__file__), "pyspark_storm.py")
        zf.write(str(pyspark_storm_state.__file__), "pyspark_storm_state.py")
    return out


def ship(spark: Any, path: str | Path | None = None) -> None:
    """Ship spark-storm to a Spark Connect session's server and register ``format("storm")``.

    ``path``: a wheel or zip of spark-storm to ship (default: this client's installed copy,
    zipped by :func:`package_zip`).  The server's Python must already have spark-storm's
    dependencies (pyarrow, numpy, msgpack, PyYAML, prometheus-client; a Databricks runtime
    has the first two).  The artifact lives as long as the session.

    Raises
    ------
    ServerPackageError
        ``spark`` is not a Connect session, or the server still cannot import what was shipped.
    """
    from spark_storm.spark import register

    if not is_connect(spark):
        msg = (
            "ship() is for Spark Connect sessions (SparkSession.builder.remote(...)); a classic session's "
            "workers get the package from spark-submit --py-files or the cluster's own install"
        )
        raise ServerPackageError(msg)
    tmp = Path(tempfile.mkdtemp(prefix="spark-storm-ship-"))
    try:
        if path is None:
            artifact = package_zip(tmp)
        else:
            source = Path(path)
            if not source.is_file():
                msg = f"ship(spark, {str(path)!r}): no such file; give a spark-storm wheel or zip, or no path"
                raise ServerPackageError(msg)
            # A wheel is a zip with the packages at its root; Connect wants the .zip suffix.
            artifact = tmp / (source.stem + ".zip")
            shutil.copyfile(source, artifact)
        spark.addArtifacts(str(artifact), pyfile=True)
        logger.info("shipped %s to the Spark Connect session %s", artifact.name, getattr(spark, "session_id", "?"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    register(spark)
