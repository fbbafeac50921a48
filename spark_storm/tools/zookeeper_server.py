"""A standalone Apache ZooKeeper server (on 127.0.0.1 by default), for cluster mode in tests and local runs.

``spark-storm zookeeper start|stop|status [--dir DIR] [--port P] [--host H]`` (or
:class:`ZooKeeperServer`): writes a ``zoo.cfg``, starts
``org.apache.zookeeper.server.ZooKeeperServerMain`` from the jars ``scripts/fetch-jars`` put
in ``jars/zookeeper`` on a free loopback port (or ``H:P`` that other hosts' daemons reach),
waits until the server answers the ``srvr`` four-letter command as serving, and stops it
by PID.  State lives in DIR (default
``.run/zookeeper``): ``zoo.cfg``, ``data/``, ``server.pid``, ``address`` and ``server.log``.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import time
from pathlib import Path

from spark_storm.errors import ZooKeeperServerError
from spark_storm.netutil import free_ports
from spark_storm.tools._process import launch_detached, live_pid, stop_pid

__all__ = ["ZooKeeperServer", "ZooKeeperServerError", "default_jars_dir", "four_letter"]

logger = logging.getLogger(__name__)

#: ZooKeeper's tick; sessions may be as short as 2 ticks, so tests can use short session timeouts.
TICK_MS = 500


def default_jars_dir() -> Path:
    """``$SPARK_STORM_JARS/zookeeper``, else ``jars/zookeeper`` of the checkout."""
    root = os.environ.get("SPARK_STORM_JARS")
    if root:
        return Path(root) / "zookeeper"
    return Path(__file__).resolve().parents[2] / "jars" / "zookeeper"


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

    def __init__(self, directory: str | Path = ".run/zookeeper", jars: str | Path | None = None) -> None:
        self.dir = Path(directory).resolve()
        self.jars = Path(jars) if jars else default_jars_dir()
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
        self, timeout: float = 60.0, *, port: int | None = None, clean: bool = True, host: str = "127.0.0.1"
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
        """
        if self.pid() is not None and self.ready():
            assert self.address is not None
            return self.address
        jars = sorted(self.jars.glob("*.jar"))
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
            return False
        stop_pid(pid, "ZooKeeper", timeout)
        self.pid_file.unlink(missing_ok=True)
        return True
