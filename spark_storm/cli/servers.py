"""Servers for tests, demos and operators: Kafka, ZooKeeper, Spark standalone, and the UI."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from spark_storm.cli.common import command_conf, start_ui
from spark_storm.cli.signals import run_until_signalled
from spark_storm.errors import ConfigError

__all__ = ["kafka", "spark_standalone", "ui", "zookeeper"]


def kafka(args: argparse.Namespace) -> int:
    """``spark-storm kafka start|stop|status``: a local KRaft broker for tests and demos."""
    from spark_storm.tools.kafka_broker import KafkaBroker

    broker = KafkaBroker(args.dir)
    if args.action == "start":
        print(f"kafka broker ready on {broker.start()} (pid {broker.pid()}, state in {broker.dir})")
    elif args.action == "stop":
        print("kafka broker stopped" if broker.stop() else "no kafka broker was running")
    else:
        pid = broker.pid()
        up = pid is not None and broker.ready()
        print(
            f"kafka broker {'running' if up else 'not running'}" + (f": pid {pid} on {broker.bootstrap}" if up else "")
        )
        return 0 if up else 1
    return 0


def zookeeper(args: argparse.Namespace) -> int:
    """``spark-storm zookeeper start|stop|status``: a local ZooKeeper server for cluster mode."""
    from spark_storm.tools.zookeeper_server import ZooKeeperServer

    server = ZooKeeperServer(args.dir)
    if args.action == "start":
        address = server.start(port=args.port, host=args.host)
        print(f"zookeeper serving on {address} (pid {server.pid()}, state in {server.dir})")
    elif args.action == "stop":
        print("zookeeper stopped" if server.stop() else "no zookeeper was running")
    else:
        pid = server.pid()
        up = pid is not None and server.ready()
        print(f"zookeeper {'running' if up else 'not running'}" + (f": pid {pid} on {server.address}" if up else ""))
        return 0 if up else 1
    return 0


def spark_standalone(args: argparse.Namespace) -> int:
    """``spark-storm spark-standalone start|stop|status``: a local Spark master and worker."""
    from spark_storm.tools.spark_standalone import SparkStandalone

    cluster = SparkStandalone(args.dir)
    if args.action == "start":
        master = cluster.start(cores=args.cores, memory=args.memory)
        print(f"spark standalone master {master} with 1 worker (web UI {cluster.web_ui}, state in {cluster.dir})")
    elif args.action == "stop":
        print("spark standalone stopped" if cluster.stop() else "no spark standalone cluster was running")
    else:
        up = cluster.ready()
        print(f"spark standalone {'running' if up else 'not running'}" + (f": {cluster.master_url}" if up else ""))
        return 0 if up else 1
    return 0


def ui(args: argparse.Namespace) -> int:
    """``spark-storm ui``: the Storm UI and REST API until SIGTERM or Ctrl-C."""
    from spark_storm.ui import local_ui, zookeeper_ui

    conf = command_conf(args)
    if args.zookeeper is not None:
        if args.heartbeat_dir is not None:
            msg = (
                "--zookeeper and --heartbeat-dir exclude each other: --zookeeper for a cluster (nimbus, "
                "supervisors), --heartbeat-dir for a local cluster's workers"
            )
            raise ConfigError(msg)
        server = zookeeper_ui(args.zookeeper, conf, args.host, args.port)
    else:
        hb_dir = args.heartbeat_dir or conf.get_optional_str("worker.heartbeat.dir") or tempfile.gettempdir()
        if not Path(hb_dir).is_dir():
            msg = f"--heartbeat-dir {hb_dir!r} is not a directory; use the one `spark-storm local-cluster` prints"
            raise ConfigError(msg)
        server = local_ui(hb_dir, conf, args.host, args.port)

    def start() -> None:
        start_ui(server)
        what = server.sampler.snapshot().state.description
        print(f"spark-storm UI on {server.url} ({what}); Ctrl-C stops it", flush=True)

    run_until_signalled(start)
    server.close()
    return 0
