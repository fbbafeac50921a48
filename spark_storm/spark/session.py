"""A local SparkSession for the demo, jobs and tests (spark-submit users bring their own)."""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import pyspark
from pyspark.sql import SparkSession

__all__ = ["DELTA_CONF", "connect_session", "connector_jars", "local_session", "worker_python"]

#: What a session needs to use Delta Lake (the jars come from spark.jars, never a download).
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def connector_jars(jars_dir: str | Path = "jars/spark", *, kafka: bool = True, delta: bool = True) -> list[str]:
    """Return the connector jars ``scripts/fetch-jars`` put in ``jars_dir`` (sorted paths).

    Raises
    ------
    FileNotFoundError
        A wanted connector is missing: the message says to run ``scripts/fetch-jars``.
    """

    def group(name: str) -> str:
        return "delta" if "delta" in name else "kafka" if "kafka" in name or "commons-pool2" in name else "other"

    wanted = {"kafka"} if kafka else set()
    wanted |= {"delta"} if delta else set()
    jars = sorted(str(p) for p in Path(jars_dir).glob("*.jar") if group(p.name) in wanted)
    missing = sorted(w for w in wanted if not any(group(Path(j).name) == w for j in jars))
    if missing:
        msg = f"no {' / '.join(missing)} jars in {jars_dir}: run scripts/fetch-jars first (it fetches them from Maven)"
        raise FileNotFoundError(msg)
    return jars


def worker_python() -> str:
    """Return the program a local Spark runs its Python workers with: this interpreter, importing pyspark compiled.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on its Python workers' PYTHONPATH.
    With pyspark installed by pip, SPARK_HOME is the installed package and its zip holds the
    same files, but Python keeps no bytecode for modules it imports from a zip: every Python
    process Spark starts compiles the pyspark modules it imports (``import pyspark.worker``:
    1.6 s against 0.3 s from the installed package, measured here), and a streaming query
    with a Python data source starts five of them.  So this writes (once, into
    ``$XDG_CACHE_HOME/spark-storm``, else ``~/.cache/spark-storm``) a POSIX shell script that
    drops that zip from PYTHONPATH and runs this interpreter, which then imports the
    installed pyspark.  It returns ``sys.executable`` when that does not apply: another
    SPARK_HOME (its zip is the Spark that runs), no zip, not a POSIX system, or a cache
    directory that cannot be written.
    """
    package = Path(pyspark.__file__).parent
    zip_path = package / "python" / "lib" / "pyspark.zip"
    home = os.environ.get("SPARK_HOME")
    if os.name != "posix" or not zip_path.is_file() or (home and Path(home).resolve() != package.resolve()):
        return sys.executable
    # Spark joins SPARK_HOME with "python/lib/pyspark.zip"; SPARK_HOME may be the path as given or resolved.
    drops = sorted({f"{base}/python/lib/pyspark.zip" for base in (home, str(package), str(package.resolve())) if base})
    script = "\n".join(
        [
            "#!/bin/sh",
            "# Written by spark-storm (spark_storm/spark/session.py, worker_python): Spark's Python workers",
            "# without pip pyspark's zip on PYTHONPATH, so that they import the installed, compiled pyspark.",
            "kept=",
            "old_ifs=$IFS",
            "IFS=:",
            "set -f",
            "for entry in ${PYTHONPATH-}; do",
            "    case $entry in",
            f"    {'|'.join(shlex.quote(d) for d in drops)}) ;;",
            "    *) kept=${kept:+$kept:}$entry ;;",
            "    esac",
            "done",
            "set +f",
            "IFS=$old_ifs",
            "PYTHONPATH=$kept",
            "export PYTHONPATH",
            f'exec {shlex.quote(sys.executable)} "$@"',
            "",
        ]
    )
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spark-storm"
    path = cache / f"spark-python-{hashlib.sha256(script.encode()).hexdigest()[:16]}"
    try:
        if not path.is_file():
            cache.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            partial.write_text(script)
            partial.chmod(0o755)
            partial.replace(path)  # whole or absent: another process may run it meanwhile
    except OSError:
        return sys.executable
    return str(path)


def _local_workers_python(master: str) -> None:
    """Let a local master's Python workers run :func:`worker_python` (a PYSPARK_PYTHON of another Python stays)."""
    if master.startswith("local") and os.environ.get("PYSPARK_PYTHON", sys.executable) == sys.executable:
        os.environ["PYSPARK_PYTHON"] = worker_python()


def local_session(
    app: str,
    master: str = "local[2,4]",
    *,
    jars: Sequence[str] = (),
    quiet: bool = False,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Build (or get) a small local session.

    ``local[2,4]`` runs 2 cores and lets a failed task be retried up to 4 times, as a
    cluster would (plain ``local[2]`` never retries).  Spark's Python workers run this
    interpreter, so they see the same installed packages (through :func:`worker_python`,
    unless PYSPARK_PYTHON names another).  ``quiet``: no console progress bar and only
    ERROR lines from Spark's log, from the JVM's start on (for a program whose own output
    is the point, like the demo).
    """
    _local_workers_python(master)
    if quiet:
        quiet_log = resources.files("spark_storm.spark").joinpath("log4j2-quiet.properties")
        os.environ.setdefault(
            "PYSPARK_SUBMIT_ARGS", f"--driver-java-options -Dlog4j2.configurationFile={quiet_log} pyspark-shell"
        )
        conf = {"spark.ui.showConsoleProgress": "false", **(conf or {})}
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
        if any("delta-spark" in Path(j).name for j in jars):
            for key, value in DELTA_CONF.items():
                builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR" if quiet else "WARN")
    return spark


def connect_session(
    app: str,
    master: str = "local[2,4]",
    *,
    jars: Sequence[str] = (),
    conf: Mapping[str, str] | None = None,
) -> Any:
    """Start pyspark's own local Spark Connect server on ``master`` and return a Connect client session.

    What ``SparkSession.builder.remote("local[2,4]")`` does (the ``connect`` extra of pyspark;
    its pip wheel has no ``start-connect-server.sh``), with three differences a local server
    running spark-storm needs: its Python workers run this interpreter (through
    :func:`worker_python`, unless PYSPARK_PYTHON names another); ``conf`` and ``jars`` are
    given to the server when it starts, as static settings must be (set on a Connect
    session they only draw a ``CANNOT_MODIFY_CONFIG`` warning); and the server binds a free
    port, not 15002, so that several processes can each run one.  ``stop()`` on the session
    stops the server too, as with ``remote``.
    """
    from pyspark.sql import SparkSession as ClassicSession
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    _local_workers_python(master)
    server_conf = {
        "spark.app.name": app,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.connect.grpc.binding.port": "0",
        **({"spark.jars": ",".join(jars)} if jars else {}),
        **(conf or {}),
    }
    # pyspark's own start of its local server (what remote("local[...]") calls), then the
    # port the server bound, read as pyspark's own tests do.
    os.environ["SPARK_LOCAL_REMOTE"] = "1"  # so that the session's stop() stops the server
    RemoteSession._start_connect_server(master, server_conf)
    server = ClassicSession._instantiatedSession
    assert server is not None
    service = getattr(server._jvm, "org.apache.spark.sql.connect.service.SparkConnectService$")
    port = getattr(service, "MODULE$").localPort()
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    # The token _start_connect_server made is in SPARK_CONNECT_AUTHENTICATE_TOKEN, which the client reads.
    return RemoteSession.builder.remote(f"sc://localhost:{port}").getOrCreate()


def job_session(app: str, jars_dir: str | Path, *, kafka: bool = False, delta: bool = False) -> SparkSession:
    """Return the session of a ``jobs/`` script.

    Under spark-submit (or a notebook) the master and ``--jars`` are the user's; Delta's
    extension and catalog are still set, because a job that reads or writes Delta needs
    them.  A plain ``python jobs/...`` run gets ``local[*]`` and the fetched connector jars.
    """
    if "SPARK_SUBMIT" in os.environ or "PYSPARK_GATEWAY_PORT" in os.environ:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.appName(app)
        for key, value in (DELTA_CONF if delta else {}).items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
    return local_session(app, "local[*]", jars=connector_jars(jars_dir, kafka=kafka, delta=delta))
