"""A local Redis server (Debian's ``redis-server``), for the ``redis`` state provider in tests and local runs.

``spark-storm redis start|stop|status [--dir DIR] [--port P] [--host H]`` (or
:class:`RedisServer`): writes a ``redis.conf`` (append-only file with ``appendfsync
everysec``, no RDB snapshots, protected mode on a loopback bind), starts ``redis-server``
on a free loopback port (or ``H:P``), waits until it answers ``PING``, and stops it by PID.
State lives in DIR (default ``.run/redis``): ``redis.conf``, ``data/``, ``server.pid``,
``address`` and ``server.log``.
"""

from __future__ import annotations

import logging
import shutil
import socket
import time
from pathlib import Path

from spark_storm.errors import RedisServerError
from spark_storm.netutil import free_ports
from spark_storm.tools._process import launch_detached, live_pid, stop_pid

__all__ = ["RedisServer", "RedisServerError", "ping"]

logger = logging.getLogger(__name__)


def ping(address: str, timeout: float = 2.0) -> bool:
    """Whether a Redis server answers ``PING`` at ``host:port`` (inline command, no client library)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except (OSError, ValueError):
        return False


class RedisServer:
    """Start, check and stop one ``redis-server`` process."""

    def __init__(self, directory: str | Path = ".run/redis", executable: str = "redis-server") -> None:
        self.dir = Path(directory).resolve()
        self.executable = executable
        self.pid_file = self.dir / "server.pid"
        self.address_file = self.dir / "address"
        self.log_file = self.dir / "server.log"
        self.data_dir = self.dir / "data"

    @property
    def address(self) -> str | None:
        """``host:port`` of the running (or last started) server, if any."""
        return self.address_file.read_text().strip() if self.address_file.exists() else None

    @property
    def url(self) -> str | None:
        """``redis://host:port/0`` of the server, for ``topology.state.provider.config``."""
        return f"redis://{self.address}/0" if self.address else None

    def pid(self) -> int | None:
        """PID of the running server, or None."""
        return live_pid(self.pid_file)

    def ready(self) -> bool:
        """Return True when the server answers PING."""
        address = self.address
        return address is not None and ping(address)

    def start(
        self, timeout: float = 30.0, *, port: int | None = None, clean: bool = True, host: str = "127.0.0.1"
    ) -> str:
        """Start the server (or return the running one's address).

        Parameters
        ----------
        timeout : float
            Seconds to wait for PONG.
        port : int, optional
            Port; default a free one.
        clean : bool
            Remove the data directory first (default); False keeps the append-only file.
        host : str
            The address the server binds (default loopback).
        """
        if self.pid() is not None and self.ready():
            assert self.address is not None
            return self.address
        binary = shutil.which(self.executable)
        if binary is None:
            msg = f"{self.executable} is not installed: apt-get install redis-server (Debian's package)"
            raise RedisServerError(msg)
        chosen = port if port is not None else free_ports(1)[0]
        address = f"{host}:{chosen}"
        if ping(address, timeout=0.5):  # another server's PONG would pass for ours
            msg = f"a Redis server already answers on {address}: give another --port, or stop that server first"
            raise RedisServerError(msg)
        self.dir.mkdir(parents=True, exist_ok=True)
        if clean and self.data_dir.exists():
            shutil.rmtree(self.data_dir)
        self.data_dir.mkdir(exist_ok=True)
        config = self.dir / "redis.conf"
        config.write_text(
            "\n".join(
                [
                    f"bind {host}",
                    f"port {chosen}",
                    f"dir {self.data_dir}",
                    "daemonize no",
                    "appendonly yes",
                    "appendfsync everysec",
                    'save ""',
                    f"protected-mode {'yes' if host in ('127.0.0.1', 'localhost', '::1') else 'no'}",
                    "",
                ]
            )
        )
        self.address_file.write_text(address + "\n")
        pid = launch_detached([binary, str(config)], self.log_file)
        self.pid_file.write_text(f"{pid}\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ping(address):
                logger.info("redis-server %s ready (pid %d)", address, pid)
                return address
            if live_pid(self.pid_file) is None:
                tail = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
                msg = f"redis-server exited at start (see {self.log_file}):\n{tail}"
                raise RedisServerError(msg)
            time.sleep(0.05)
        self.stop()
        msg = f"redis-server on {address} did not answer PING within {timeout:.0f}s (see {self.log_file})"
        raise RedisServerError(msg)

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the server by PID; return whether one was running."""
        pid = self.pid()
        if pid is None:
            return False
        stop_pid(pid, "redis-server", timeout)
        self.pid_file.unlink(missing_ok=True)
        return True

    def status(self) -> str:
        """One line: running (address, pid) or stopped."""
        pid = self.pid()
        if pid is None:
            return "redis: stopped"
        return f"redis: {'running' if self.ready() else 'starting'} on {self.address} (pid {pid})"
