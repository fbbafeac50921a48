"""A standalone Apache ZooKeeper server (on 127.0.0.1 by default), for cluster mode in tests and local runs.

``spark-storm zookeeper start|stop|status [--dir DIR] [--port P] [--host H]`` (or
:class:`ZooKeeperServer`): writes a ``zoo.cfg``, starts
``org.apache.zookeeper.server.ZooKeeperServerMain`` from the jars ``scripts/fetch-jars`` put
in ``jars/zookeeper`` on a free loopback port (or ``H:P`` that other hosts' daemons reach),
waits until the server answers the ``srvr`` four-letter command as serving, and stops it
by PID.  State lives in DIR (default
``.run/zookeeper``): ``zoo.cfg``, ``data/``, ``server.pid``, ``address`` and ``server.log``.

Spark ships ZooKeeper's own jars (its standalone master uses them for high availability):
:func:`spark_classpath` finds them in the installed pyspark (or ``$SPARK_HOME/jars``), so a
server can run wherever Spark does without ``scripts/fetch-jars`` (``spark_storm.spark.deploy``
does so).  ``start(lifeline=True)`` runs the server under :mod:`spark_storm.tools.lifeline`,
tied to the calling process: it stops, and its directory goes, when that process ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from spark_storm.errors import ZooKeeperServerError
from spark_storm.netutil import free_ports
from spark_storm.tools._process import launch_detached, live_pid, stop_pid

__all__ = ["ZooKeeperServer", "ZooKeeperServerError", "default_jars_dir", "four_letter", "spark_classpath"]

logger = logging.getLogger(__name__)

#: ZooKeeper's tick; sessions may be as short as 2 ticks, so tests can use short session timeouts.
TICK_MS = 500


def default_jars_dir() -> Path:
    """``$SPARK_STORM_JARS/zookeeper``, else ``jars/zookeeper`` of the checkout."""
    root = os.environ.get("SPARK_STORM_JARS")
    if root:
        return Path(root) / "zookeeper"
    return Path(__file__).resolve().parents[2] / "jars" / "zookeeper"


#: What ZooKeeperServerMain needs at run time, as Spark ships it (file name prefixes in Spark's jars/).
_SPARK_ZOOKEEPER_JARS = ("zookeeper-3", "zookeeper-jute-", "slf4j-api-", "commons-io-", "metrics-core-", "snappy-java-")


def spark_classpath() -> list[Path]:
    """Return ZooKeeper's server jars from Spark's own ``jars/`` (pyspark's, or ``$SPARK_HOME``'s).

    Raises
    ------
    ZooKeeperServerError
        No Spark installation here ships them (the message says what else works).
    """
    from spark_storm.tools.spark_standalone import spark_home

    places = [Path(os.environ["SPARK_HOME"]) / "jars"] if os.environ.get("SPARK_HOME") else []
    with contextlib.suppress(Exception):
        places.append(spark_home() / "jars")
    for place in places:
        found = [min(place.glob(f"{prefix}*.jar"), default=None) for prefix in _SPARK_ZOOKEEPER_JARS]
        if all(found):
            return [p for p in found if p is not None]
    msg = (
        f"no ZooKeeper server jars in Spark's jars ({', '.join(map(str, places)) or 'no Spark installation found'}): "
        "give a ZooKeeper of your own, or run scripts/fetch-jars and use jars/zookeeper"
    )
    raise ZooKeeperServerError(msg)


def four_letter(address: str, command: str, timeout: float = 2.0) -> str | None:
    """Send a ZooKeeper four-letter command (``ruok``, ``srvr``, ...); the answer, or None if unreachable."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(command.encode("ascii"))
            chunks = []
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return None
    return b"".join(chunks).decode("utf-8", "replace")


class ZooKeeperServer:
    """Start, check and stop one standalone ZooKeeper server process."""

    def __init__(
        self,
        directory: str | Path = ".run/zookeeper",
        jars: str | Path | None = None,
        *,
        classpath: Sequence[Path] | None = None,
    ) -> None:
        self.dir = Path(directory).resolve()
        self.jars = Path(jars) if jars else default_jars_dir()
        #: The server's jars; default every jar in ``jars`` (e.g. :func:`spark_classpath` instead).
        self.classpath = list(classpath) if classpath is not None else None
        self._guardian: subprocess.Popen[bytes] | None = None
        self._lifeline: int | None = None
        self.pid_file = self.dir / "server.pid"
        self.address_file = self.dir / "address"
        self.log_file = self.dir / "server.log"
        self.data_dir = self.dir / "data"

    @property
    def address(self) -> str | None:
        """``127.0.0.1:port`` of the running (or last started) server, if any."""
        return self.address_file.read_text().strip() if self.address_file.exists() else None

    def pid(self) -> int | None:
        """PID of the running server, or None."""
        return live_pid(self.pid_file)

    def ready(self) -> bool:
        """Return True when the server answers ``srvr`` and is serving requests."""
        address = self.address
        if address is None:
            return False
        answer = four_letter(address, "srvr")
        return answer is not None and "Mode: standalone" in answer

    def start(
        self,
        timeout: float = 60.0,
        *,
        port: int | None = None,
        clean: bool = True,
        host: str = "127.0.0.1",
        lifeline: bool = False,
    ) -> str:
        """Start the server (or return the running one's address).

        Parameters
        ----------
        timeout : float
            Seconds to wait for the server to serve.
        port : int, optional
            Client port; default a free one.  A restart for tests passes the old port.
        host : str
            The address the client port binds (default loopback).
        clean : bool
            Remove the data directory first (default); False keeps the znodes and sessions of a
            previous run, as a restarted production server would.
        lifeline : bool
            Tie the server to this process (:mod:`spark_storm.tools.lifeline`): it stops, and its
            directory is removed, when this process exits however it exits, or at :meth:`stop`.
        """
        if self.pid() is not None and self.ready():
            assert self.address is not None
            return self.address
        jars = self.classpath if self.classpath is not None else sorted(self.jars.glob("*.jar"))
        if not jars:
            msg = f"no ZooKeeper jars in {self.jars}: run scripts/fetch-jars first"
            raise ZooKeeperServerError(msg)
        self.dir.mkdir(parents=True, exist_ok=True)
        if clean and self.data_dir.exists():
            shutil.rmtree(self.data_dir)
        self.data_dir.mkdir(exist_ok=True)
        chosen = port if port is not None else free_ports(1)[0]
        config = self.dir / "zoo.cfg"
        config.write_text(
            "\n".join(
                [
                    f"tickTime={TICK_MS}",
                    f"dataDir={self.data_dir}",
                    f"clientPort={chosen}",
                    f"clientPortAddress={host}",
                    "maxClientCnxns=0",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons",
                    "autopurge.purgeInterval=1",
                ]
            )
            + "\n"
        )
        classpath = os.pathsep.join(str(j) for j in jars)
        command = [
            "java",
            "-Xms64m",
            "-Xmx256m",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            classpath,
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(config),
        ]
        self.log_file.unlink(missing_ok=True)
        if lifeline:
            from spark_storm.tools.lifeline import launch_tied

            self._guardian, self._lifeline = launch_tied(command, self.log_file, remove=[self.dir])
            pid = self._guardian.pid
        else:
            pid = launch_detached(command, self.log_file)
        self.pid_file.write_text(str(pid))
        address = f"{host}:{chosen}"
        self.address_file.write_text(address)
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.pid() is None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_file.read_text()[-2000:] if self.log_file.exists() else "(no log)"
                msg = f"ZooKeeper did not serve on {address} within {timeout}s:\n{tail}"
                raise ZooKeeperServerError(msg)
            time.sleep(0.1)
        logger.info("ZooKeeper %d serving on %s", pid, address)
        return address

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the server by PID (SIGTERM, then SIGKILL); True if one was running.

        The address file stays, so :meth:`start` with ``port=`` can bring the same server back.
        """
        pid = self.pid()
        if pid is None:
            self._release()
            return False
        stop_pid(pid, "ZooKeeper", timeout)
        self.pid_file.unlink(missing_ok=True)
        self._release()
        return True

    def _release(self) -> None:
        """Close a lifeline's write end and reap its guardian (a server started with ``lifeline=True``)."""
        if self._lifeline is not None:
            with contextlib.suppress(OSError):
                os.close(self._lifeline)
            self._lifeline = None
        if self._guardian is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._guardian.wait(30)
            self._guardian = None
