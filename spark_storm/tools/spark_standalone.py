"""A Spark standalone cluster (one master, one worker) on 127.0.0.1 from the pyspark package.

``spark-storm spark-standalone start|stop|status [--dir DIR]`` (or :class:`SparkStandalone`)
runs ``org.apache.spark.deploy.master.Master`` and ``org.apache.spark.deploy.worker.Worker``
with pyspark's own ``bin/spark-class`` (the jars pyspark ships: no Spark download) on free
loopback ports, waits until the master's web UI reports the worker ALIVE, and stops both by
PID.  Jobs then run unchanged with ``spark-submit --master spark://127.0.0.1:PORT``.  State
lives in DIR (default ``.run/spark-standalone``): pid files, ``master`` (the URL),
``webui`` (the master's UI port), logs and the worker's ``work`` directory.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from spark_storm.errors import SparkStandaloneError
from spark_storm.netutil import free_ports
from spark_storm.tools._process import launch_detached, live_pid, stop_pid

__all__ = ["SparkStandalone", "SparkStandaloneError", "spark_home"]

logger = logging.getLogger(__name__)


def spark_home() -> Path:
    """Return the installed pyspark package directory (it holds ``bin/spark-class`` and ``jars/``).

    Found without importing pyspark (only ``spark_storm.spark`` imports it).
    """
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        msg = "pyspark is not installed: pip install 'spark-storm[spark]'"
        raise SparkStandaloneError(msg)
    return Path(next(iter(spec.submodule_search_locations)))


class SparkStandalone:
    """Start, check and stop a one-worker Spark standalone cluster."""

    def __init__(self, directory: str | Path = ".run/spark-standalone") -> None:
        self.dir = Path(directory).resolve()
        self.master_pid_file = self.dir / "master.pid"
        self.worker_pid_file = self.dir / "worker.pid"
        self.master_file = self.dir / "master"
        self.webui_file = self.dir / "webui"

    @property
    def master_url(self) -> str | None:
        """``spark://127.0.0.1:PORT`` of the running master, if any."""
        return self.master_file.read_text().strip() if self.master_file.exists() else None

    @property
    def web_ui(self) -> str | None:
        """The master's web UI address, if it runs."""
        return f"http://127.0.0.1:{self.webui_file.read_text().strip()}" if self.webui_file.exists() else None

    def status(self) -> dict[str, Any] | None:
        """Return the master's JSON status (``/json/``), or None when it does not answer."""
        ui = self.web_ui
        if ui is None:
            return None
        try:
            with urllib.request.urlopen(f"{ui}/json/", timeout=2) as reply:
                data: dict[str, Any] = json.loads(reply.read())
                return data
        except (OSError, ValueError):
            return None

    def ready(self) -> bool:
        """Return True when the master is ALIVE with at least one ALIVE worker."""
        data = self.status()
        if not data or data.get("status") != "ALIVE":
            return False
        return any(w.get("state") == "ALIVE" for w in data.get("workers", []))

    def start(self, timeout: float = 120.0, *, cores: int = 2, memory: str = "2g") -> str:
        """Start the master and one worker (or return the running master's URL)."""
        if live_pid(self.master_pid_file) and live_pid(self.worker_pid_file) and self.ready():
            assert self.master_url is not None
            return self.master_url
        self.stop()
        home = spark_home()
        spark_class = home / "bin" / "spark-class"
        if not spark_class.exists():
            msg = f"{spark_class} is missing: the pyspark installation is incomplete; reinstall pyspark"
            raise SparkStandaloneError(msg)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "work").mkdir(exist_ok=True)
        master_port, master_ui, worker_port, worker_ui = free_ports(4)
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(self.dir / "work"),
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        }
        master_url = f"spark://127.0.0.1:{master_port}"
        self.master_file.write_text(master_url)
        self.webui_file.write_text(str(master_ui))
        master = [
            str(spark_class),
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(master_port),
            "--webui-port",
            str(master_ui),
        ]
        worker = [
            str(spark_class),
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--port",
            str(worker_port),
            "--webui-port",
            str(worker_ui),
            "--cores",
            str(cores),
            "--memory",
            memory,
            "--work-dir",
            str(self.dir / "work"),
            master_url,
        ]
        for name in ("master", "worker"):
            (self.dir / f"{name}.log").unlink(missing_ok=True)
        self.master_pid_file.write_text(str(launch_detached(master, self.dir / "master.log", env=env, cwd=self.dir)))
        self.worker_pid_file.write_text(str(launch_detached(worker, self.dir / "worker.log", env=env, cwd=self.dir)))
        deadline = time.monotonic() + timeout
        while not self.ready():
            dead = [
                n for n, f in (("master", self.master_pid_file), ("worker", self.worker_pid_file)) if not live_pid(f)
            ]
            if dead or time.monotonic() > deadline:
                self.stop()
                logs = "\n".join(
                    f"--- {n}.log\n" + (self.dir / f"{n}.log").read_text(errors="replace")[-1500:]
                    for n in ("master", "worker")
                    if (self.dir / f"{n}.log").exists()
                )
                why = f"{' and '.join(dead)} exited" if dead else f"no ALIVE worker within {timeout}s"
                msg = f"Spark standalone cluster did not start ({why}):\n{logs}"
                raise SparkStandaloneError(msg)
            time.sleep(0.5)
        logger.info("Spark standalone master %s ready with one worker", master_url)
        return master_url

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the worker (and its executors), then the master, by PID; True if any ran."""
        stopped = False
        for name, pid_file in (("worker", self.worker_pid_file), ("master", self.master_pid_file)):
            pid = live_pid(pid_file)
            if pid is not None:
                stop_pid(pid, f"Spark standalone {name}", timeout)
                stopped = True
            pid_file.unlink(missing_ok=True)
        return stopped
