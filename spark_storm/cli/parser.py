"""The ``spark-storm`` parser and :func:`main`: flags here, each command's code in its module."""

from __future__ import annotations

import argparse
import logging
import sys

from spark_storm import __version__
from spark_storm.cli import admin, daemons, demos, servers
from spark_storm.errors import StormError
from spark_storm.extras import missing_extra
from spark_storm.transport import TRANSPORT_ALIASES

__all__ = ["build_parser", "main"]

_FILTER_HELP = "Flux files: a properties file whose values replace ${name} (Flux's --filter)"


def build_parser() -> argparse.ArgumentParser:
    """Build the ``spark-storm`` parser: every command, its flags, and the function that runs it."""
    parser = argparse.ArgumentParser(prog="spark-storm", description="Storm-style workers fed by Spark")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default), ERROR")
    sub = parser.add_subparsers(dest="command", required=True)
    sdemo = sub.add_parser("demo", help="local Spark -> format('storm') -> 2-worker wordcount, live progress")
    sdemo.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="how long to stream (Ctrl-C stops early); default 30, with --windows two windows and 15 s",
    )
    sdemo.add_argument(
        "--rows-per-second", type=int, default=None, help="sentences per second (default 2000; 40000 with --arrow)"
    )
    sdemo.add_argument("--workers", type=int, default=2, help="worker processes the topology runs on (default 2)")
    sdemo.add_argument("--arrow", action="store_true", help="the columnar wordcount (batch bolts), at 20x the rate")
    sdemo.add_argument(
        "--windows",
        action="store_true",
        help="top words per minute of event time (a windowed bolt), checked against Spark",
    )
    sdemo.add_argument("--window", type=int, default=60, metavar="SECONDS", help="with --windows: the window's length")
    sdemo.add_argument("--verbose", action="store_true", help="also Spark's progress bar and its INFO/WARN log")
    sdemo.add_argument(
        "--kill-worker", action="store_true", help="SIGKILL a worker half-way and restart it: the counts stay exact"
    )
    sdemo.add_argument(
        "--on-spark",
        action="store_true",
        help="host the workers as tasks of the demo's own Spark (deploy(); nimbus and ZooKeeper on the driver)",
    )
    sdemo.set_defaults(func=demos.spark_demo)
    demo = sub.add_parser("transport-demo", help="two-process transport round trip with live progress")
    demo.add_argument(
        "--transport",
        default="tcp",
        choices=sorted(TRANSPORT_ALIASES),
        help="the transport to send through (default tcp)",
    )
    demo.add_argument(
        "--messages", type=int, default=2_000_000, help="stop after this many messages (default 2,000,000)"
    )
    demo.add_argument("--seconds", type=float, default=20.0, help="or after this many seconds (default 20)")
    demo.add_argument("--size", type=int, default=100, help="payload bytes per message")
    demo.add_argument("--batch", type=int, default=1000, help="messages per send()")
    demo.add_argument("--conf", help="a storm.yaml with overrides")
    demo.set_defaults(func=demos.transport_demo)
    worker = sub.add_parser(
        "worker",
        help="run one worker process of a topology",
        description="Static mode: --topology FILE [--workers SLOTS]. Cluster mode (what a supervisor launches): "
        "--zookeeper ZK --topology-id NAME; the plan and status come from ZooKeeper and are followed.",
    )
    worker.add_argument("--topology", help="topology YAML or Storm Flux file (static mode)")
    worker.add_argument("--filter", help=_FILTER_HELP)
    worker.add_argument("--port", type=int, required=True, help="the port this worker binds: its slot")
    worker.add_argument("--host", default="127.0.0.1", help="this worker's host as the slot list / assignment names it")
    worker.add_argument("--workers", help="static mode: all slots host:port,... (default: the topology's 'workers')")
    worker.add_argument("--zookeeper", help="cluster mode: HOST:PORT[,HOST:PORT][/chroot] of the cluster's state")
    worker.add_argument("--topology-id", help="cluster mode: the submitted topology's name")
    worker.add_argument("--conf", help="a storm.yaml with overrides")
    worker.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override (repeatable)")
    worker.set_defaults(func=daemons.worker)
    cluster = sub.add_parser("local-cluster", help="run N workers on loopback until Ctrl-C")
    cluster.add_argument("--topology", required=True, help="topology YAML or Storm Flux file")
    cluster.add_argument("--filter", help=_FILTER_HELP)
    cluster.add_argument("--workers", type=int, default=2, help="worker processes, one port each (default 2)")
    cluster.add_argument("--conf", help="a storm.yaml with overrides")
    cluster.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override (repeatable)")
    cluster.add_argument("--from-savepoint", metavar="DIR", help="start from a savepoint")
    cluster.add_argument(
        "--allow-unmatched-state", action="store_true", help="drop saved state of components the topology lacks"
    )
    cluster.add_argument(
        "--ui-port", type=int, metavar="PORT", help="also serve the UI in this process on PORT (0 = any free port)"
    )
    cluster.set_defaults(func=daemons.local_cluster)
    ui = sub.add_parser(
        "ui",
        help="the Storm UI and REST API (/api/v1/) for a cluster (--zookeeper) or a local cluster's workers",
    )
    ui.add_argument(
        "--zookeeper", help="cluster mode: HOST:PORT[,HOST:PORT][/chroot] of the cluster's state (as nimbus's)"
    )
    ui.add_argument(
        "--heartbeat-dir",
        help="the workers' heartbeat dir (local-cluster prints it; default: worker.heartbeat.dir or the temp dir)",
    )
    ui.add_argument("--host", help="bind host (default ui.host: 127.0.0.1)")
    ui.add_argument("--port", type=int, help="port (default ui.port: 8080; 0 = any free port)")
    ui.add_argument("--conf", help="a storm.yaml with overrides")
    ui.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override (repeatable)")
    ui.set_defaults(func=servers.ui)
    topology = sub.add_parser("topology", help="topology tools")
    tsub = topology.add_subparsers(dest="topology_command", required=True)
    tplan = tsub.add_parser("plan", help="print tasks, executors and the worker each runs on")
    tplan.add_argument("file", help="topology YAML or Storm Flux file (shows what each Flux component became)")
    tplan.add_argument("--filter", help=_FILTER_HELP)
    tplan.add_argument("--workers", help="slots host:port,... (default: the topology's 'workers')")
    tplan.set_defaults(func=admin.plan)
    kafka = sub.add_parser("kafka", help="a local KRaft Kafka broker for tests and demos")
    kafka.add_argument(
        "action",
        choices=["start", "stop", "status"],
        help="start the broker, stop it, or print whether it runs (status exits 1 if not)",
    )
    kafka.add_argument("--dir", default=".run/kafka", help="state directory (config, data, pid, log)")
    kafka.set_defaults(func=servers.kafka)
    zookeeper = sub.add_parser("zookeeper", help="a local ZooKeeper server for cluster mode")
    zookeeper.add_argument(
        "action",
        choices=["start", "stop", "status"],
        help="start the server, stop it, or print whether it runs (status exits 1 if not)",
    )
    zookeeper.add_argument("--dir", default=".run/zookeeper", help="state directory (config, data, pid, log)")
    zookeeper.add_argument("--port", type=int, help="client port (default: a free one)")
    zookeeper.add_argument("--host", default="127.0.0.1", help="address the client port binds (default loopback)")
    zookeeper.set_defaults(func=servers.zookeeper)
    redis = sub.add_parser("redis", help="a local Redis server (Debian's redis-server) for the redis state provider")
    redis.add_argument(
        "action",
        choices=["start", "stop", "status"],
        help="start the server, stop it, or print whether it runs (status exits 1 if not)",
    )
    redis.add_argument("--dir", default=".run/redis", help="state directory (config, data, pid, log)")
    redis.add_argument("--port", type=int, help="port (default: a free one)")
    redis.add_argument("--host", default="127.0.0.1", help="address the server binds (default loopback)")
    redis.set_defaults(func=servers.redis)
    standalone = sub.add_parser("spark-standalone", help="a local Spark standalone master + worker")
    standalone.add_argument(
        "action",
        choices=["start", "stop", "status"],
        help="start the master and worker, stop them, or print whether they run (status exits 1 if not)",
    )
    standalone.add_argument("--dir", default=".run/spark-standalone", help="state directory (pids, logs, work)")
    standalone.add_argument("--cores", type=int, default=2, help="cores the worker offers")
    standalone.add_argument("--memory", default="2g", help="memory the worker offers")
    standalone.set_defaults(func=servers.spark_standalone)

    def cluster_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--zookeeper", help="HOST:PORT[,HOST:PORT][/chroot] (default: storm.zookeeper.* keys)")
        p.add_argument("--conf", help="a storm.yaml with overrides")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override (repeatable)")

    nimbus = sub.add_parser("nimbus", help="run a nimbus (leader-elected) until SIGTERM/Ctrl-C")
    cluster_args(nimbus)
    nimbus.add_argument(
        "--ui-port", type=int, metavar="PORT", help="also serve the Storm UI on PORT (ui.host; 0 = any free port)"
    )
    nimbus.set_defaults(func=daemons.nimbus)
    supervisor = sub.add_parser("supervisor", help="run a supervisor for this host's slots until SIGTERM/Ctrl-C")
    cluster_args(supervisor)
    supervisor.add_argument("--host", default="127.0.0.1", help="this host's name as other workers reach it")
    supervisor.add_argument("--slots", help="worker ports, e.g. 6700,6701 (default: supervisor.slots.ports)")
    supervisor.add_argument("--id", help="supervisor id in ZooKeeper (default: HOST-random)")
    supervisor.add_argument("--local-dir", help="topology files, worker logs (default: storm.local.dir or a temp dir)")
    supervisor.set_defaults(func=daemons.supervisor)
    submit = sub.add_parser("submit", help="submit a topology YAML to the cluster")
    cluster_args(submit)
    submit.add_argument("file", help="topology YAML or Storm Flux file")
    submit.add_argument("--filter", help=_FILTER_HELP)
    submit.add_argument("--workers", type=int, help="worker processes (default: topology.workers)")
    submit.add_argument("--no-class-check", action="store_true", help="do not import the bolt classes here first")
    submit.add_argument(
        "--from-savepoint", metavar="DIR", help="start from a savepoint (`spark-storm savepoint` printed its path)"
    )
    submit.add_argument(
        "--allow-unmatched-state",
        action="store_true",
        help="drop the savepoint's state of components the topology no longer has (else refused)",
    )
    submit.set_defaults(func=admin.cluster_command)
    for name, text in (("activate", "let its executors consume"), ("deactivate", "pause its executors")):
        p = sub.add_parser(name, help=f"{text} (a submitted topology)")
        cluster_args(p)
        p.add_argument("name", help="topology name")
        p.set_defaults(func=admin.cluster_command)
    rebalance = sub.add_parser("rebalance", help="change a submitted topology's workers or a component's executors")
    cluster_args(rebalance)
    rebalance.add_argument("name", help="topology name")
    rebalance.add_argument("--workers", type=int, help="new number of worker processes")
    rebalance.add_argument(
        "--executors",
        "-e",
        action="append",
        metavar="COMPONENT=N",
        help="a component's executors, within its task count (repeatable; Storm's -e)",
    )
    rebalance.set_defaults(func=admin.cluster_command)
    kill = sub.add_parser("kill", help="deactivate a topology, then remove it and stop its workers")
    cluster_args(kill)
    kill.add_argument("name", help="topology name")
    kill.add_argument(
        "--wait", type=float, help="seconds between deactivation and removal (topology.message.timeout.secs)"
    )
    kill.add_argument("--savepoint", metavar="DIR", help="first commit, then write a savepoint under DIR, then kill")
    kill.set_defaults(func=admin.cluster_command)
    savepoint = sub.add_parser(
        "savepoint", help="write every stateful task's committed state at one epoch under a directory"
    )
    cluster_args(savepoint)
    savepoint.add_argument("name", help="topology name")
    savepoint.add_argument(
        "--dir", required=True, help="parent directory every worker writes to; the savepoint is a new folder in it"
    )
    savepoint.set_defaults(func=admin.cluster_command)
    listing = sub.add_parser("list", help="submitted topologies: name, status, workers, uptime")
    cluster_args(listing)
    listing.set_defaults(func=admin.cluster_command)
    config = sub.add_parser("config", help="print the effective configuration")
    config.add_argument("--conf", help="a storm.yaml with overrides")
    config.set_defaults(func=admin.config)
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=lambda a: print(__version__) or 0)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except StormError as exc:
        print(f"spark-storm: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an optional part used without its extra: one line naming it
        error = missing_extra(exc, f"spark-storm {args.command}")
        if error is None:
            raise
        print(f"spark-storm: {error}", file=sys.stderr)
        return 2
