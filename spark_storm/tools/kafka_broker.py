"""A single Apache Kafka broker in KRaft mode on 127.0.0.1, for tests and local runs.

``spark-storm kafka start|stop|status [--dir DIR]`` (or :class:`KafkaBroker`): formats a
KRaft storage directory, starts ``kafka.Kafka`` from the jars ``scripts/fetch-jars`` put in
``jars/kafka`` on free loopback ports, waits until it answers a metadata request
(kafka-python), and stops it by PID.  State lives in DIR (default ``.run/kafka``):
``server.properties``, ``broker.pid``, ``bootstrap`` and ``broker.log``.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

from spark_storm.errors import KafkaBrokerError
from spark_storm.netutil import free_ports
from spark_storm.tools._process import launch_detached, live_pid, stop_pid

__all__ = ["KafkaBroker", "KafkaBrokerError", "default_jars_dir", "new_cluster_id"]

logger = logging.getLogger(__name__)


def new_cluster_id() -> str:
    """Return a new KRaft cluster id: a random UUID in unpadded base64url not starting with "-".

    The storage tool's option parser takes an id starting with "-" for an option ("argument
    --cluster-id: expected one argument"), about one id in 64; Kafka's own ``Uuid.randomUuid``
    draws again in that case, and so does this.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def default_jars_dir() -> Path:
    """``$SPARK_STORM_JARS/kafka``, else ``jars/kafka`` of the checkout."""
    root = os.environ.get("SPARK_STORM_JARS")
    if root:
        return Path(root) / "kafka"
    return Path(__file__).resolve().parents[2] / "jars" / "kafka"


class KafkaBroker:
    """Start, check and stop one KRaft broker+controller process."""

    def __init__(self, directory: str | Path = ".run/kafka", jars: str | Path | None = None) -> None:
        self.dir = Path(directory).resolve()
        self.jars = Path(jars) if jars else default_jars_dir()
        self.pid_file = self.dir / "broker.pid"
        self.bootstrap_file = self.dir / "bootstrap"
        self.log_file = self.dir / "broker.log"

    @property
    def bootstrap(self) -> str | None:
        """``host:port`` of the running broker, if any."""
        return self.bootstrap_file.read_text().strip() if self.bootstrap_file.exists() else None

    def pid(self) -> int | None:
        """PID of the running broker, or None."""
        return live_pid(self.pid_file)

    def start(self, timeout: float = 90.0) -> str:
        """Start the broker (or return the running one's bootstrap address)."""
        if self.pid() is not None and self.bootstrap and self.ready():
            return self.bootstrap
        jars = sorted(self.jars.glob("*.jar"))
        if not jars:
            msg = f"no Kafka jars in {self.jars}: run scripts/fetch-jars first"
            raise KafkaBrokerError(msg)
        self.dir.mkdir(parents=True, exist_ok=True)
        port, controller = free_ports(2)
        data = self.dir / "data"
        if data.exists():
            for child in sorted(data.rglob("*"), reverse=True):
                child.unlink() if child.is_file() else child.rmdir()
        props = self.dir / "server.properties"
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{controller}",
                    f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={data}",
                    "num.partitions=2",
                    "offsets.topic.replication.factor=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=true",
                ]
            )
            + "\n"
        )
        log4j = self.dir / "log4j2.properties"
        log4j.write_text(
            "rootLogger.level=WARN\nrootLogger.appenderRef.out.ref=out\n"
            "appender.out.type=Console\nappender.out.name=out\nappender.out.layout.type=PatternLayout\n"
            "appender.out.layout.pattern=%d %p %c: %m%n\n"
        )
        classpath = os.pathsep.join(str(j) for j in jars)
        java = ["java", "-Xms256m", "-Xmx512m", f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        cluster_id = new_cluster_id()
        fmt = subprocess.run(
            [*java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if fmt.returncode != 0:
            msg = f"formatting the KRaft storage failed: {fmt.stdout[-1000:]}{fmt.stderr[-1000:]}"
            raise KafkaBrokerError(msg)
        # Detached: the broker outlives this process (``spark-storm kafka start``) and is
        # tracked by PID only, so no Popen object is left waiting for it.
        self.log_file.unlink(missing_ok=True)
        pid = launch_detached([*java, "kafka.Kafka", str(props)], self.log_file)
        self.pid_file.write_text(str(pid))
        bootstrap = f"127.0.0.1:{port}"
        self.bootstrap_file.write_text(bootstrap)
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.pid() is None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_file.read_text()[-2000:]
                msg = f"Kafka broker did not answer a metadata request on {bootstrap} within {timeout}s:\n{tail}"
                raise KafkaBrokerError(msg)
            time.sleep(0.5)
        logger.info("Kafka broker %d ready on %s", pid, bootstrap)
        return bootstrap

    def ready(self) -> bool:
        """Return True when the broker answers a metadata request."""
        bootstrap = self.bootstrap
        if bootstrap is None:
            return False
        host, _, port = bootstrap.rpartition(":")
        try:  # cheap check first: kafka-python clients leak sockets on refused connections
            socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            return False
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        try:
            admin = KafkaAdminClient(
                bootstrap_servers=bootstrap,
                request_timeout_ms=3000,
                reconnect_backoff_ms=50,
                reconnect_backoff_max_ms=200,
                client_id="spark-storm-probe",
            )
        except (KafkaError, OSError, ValueError):
            return False
        try:
            admin.list_topics()
            return True
        except (KafkaError, OSError):
            return False
        finally:
            admin.close()

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the broker by PID (SIGTERM, then SIGKILL); True if one was running."""
        pid = self.pid()
        if pid is None:
            return False
        stop_pid(pid, "Kafka broker", timeout)
        self.pid_file.unlink(missing_ok=True)
        self.bootstrap_file.unlink(missing_ok=True)
        return True
