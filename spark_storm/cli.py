"""The ``spark-storm`` command line.

Commands
--------
demo            local Spark streaming sentences into a 2-worker wordcount topology (live progress)
transport-demo  send messages through a transport between two processes, with live progress
worker          run one worker process of a topology
local-cluster   run N worker processes on loopback until Ctrl-C
ui              the Storm UI and REST API for a cluster (--zookeeper) or a local cluster's workers
topology plan   print a topology's tasks, executors and the worker each runs on
kafka           start | stop | status a local KRaft Kafka broker (jars from scripts/fetch-jars)
zookeeper       start | stop | status a local ZooKeeper server (jars from scripts/fetch-jars)
spark-standalone start | stop | status a local Spark standalone master + worker (pyspark's own classes)
nimbus          run a nimbus (leader-elected; assigns topologies to supervisors' slots; --ui-port: the UI)
supervisor      run a supervisor (registers slots; runs, restarts and stops assigned workers)
submit          submit a topology to the cluster (through ZooKeeper)
activate        let a submitted topology's executors consume
deactivate      pause a submitted topology's executors
rebalance       change the number of workers of a submitted topology
kill            deactivate a topology, then remove it and stop its workers
list            the submitted topologies: name, status, workers, uptime
config          print the effective configuration (defaults + --conf file)
version         print the version
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from spark_storm import __version__
from spark_storm.config import STORM_MESSAGING_TRANSPORT, Config, load_config
from spark_storm.errors import ConfigError, StormError
from spark_storm.extras import missing_extra
from spark_storm.messaging import MessageBatch, TaskMessage
from spark_storm.transport import TRANSPORT_ALIASES, make_context, resolve_transport

if TYPE_CHECKING:
    from spark_storm.ui import UIServer

__all__ = ["main"]

logger = logging.getLogger(__name__)


def _demo_receiver(conf: dict[str, Any], port_out: Connection, report: Connection) -> None:
    """Child process: bind a server, count what arrives, report counts when asked."""
    ctx = make_context(conf)
    counts = [0, 0]  # messages, payload bytes
    tasks: set[int] = set()

    def on_batch(batch: MessageBatch) -> None:
        counts[0] += len(batch)
        counts[1] += sum(map(len, batch.payloads))
        tasks.update(batch.tasks)

    server = ctx.bind("demo", 0, on_batch)
    port_out.send(server.port)
    while report.recv() == "report":
        report.send({"messages": counts[0], "bytes": counts[1]})
    report.send({"messages": counts[0], "tasks": len(tasks)})
    ctx.term()


def _demo(args: argparse.Namespace) -> int:
    conf = dict(load_config(args.conf, {STORM_MESSAGING_TRANSPORT: args.transport}))
    if args.transport == "local":
        print("the local transport is in-process only; the demo uses two processes: pick tcp or zmq")
        return 2
    resolve_transport(args.transport)  # here, not in the receiver process: a missing extra is one line
    spawn = mp.get_context("spawn")
    port_r, port_w = spawn.Pipe(duplex=False)
    report, child_end = spawn.Pipe()
    proc = spawn.Process(target=_demo_receiver, args=(conf, port_w, child_end), daemon=True)
    proc.start()
    port = port_r.recv()
    print(f"receiver process {proc.pid} bound topology 'demo' on port {port} ({args.transport})")
    ctx = make_context(conf)
    client = ctx.connect("demo", "127.0.0.1", port)
    if not client.wait_ready(30):
        print(f"could not connect: {client.metrics()['last_error']}")
        return 1
    payload = b"x" * args.size
    batch = [TaskMessage(t % 64, payload) for t in range(args.batch)]
    deadline = time.monotonic() + args.seconds
    sent = 0
    last = time.monotonic()
    started = last
    try:
        while sent < args.messages and time.monotonic() < deadline:
            client.send(batch)
            sent += len(batch)
            now = time.monotonic()
            if now - last >= 0.5:
                report.send("report")
                got = report.recv()
                rate = got["messages"] / (now - started)
                print(
                    f"\rsent {sent:>12,}  received {got['messages']:>12,}  "
                    f"{rate:>12,.0f} msg/s  pending {client.metrics()['pending']:>8,}",
                    end="",
                    flush=True,
                )
                last = now
    except KeyboardInterrupt:
        print("\ninterrupted; flushing what was sent")
    client.flush(30)
    elapsed = time.monotonic() - started
    report.send("stop")
    final = report.recv()
    ctx.term()
    proc.join(10)
    received = final["messages"]
    print(
        f"\nsent {sent:,} messages of {args.size} bytes to {final['tasks']} tasks in {elapsed:.2f}s "
        f"({received / elapsed:,.0f} msg/s); received {received:,}"
    )
    ok = sent == received
    print("sent == received: OK" if ok else f"MISMATCH: {sent - received:,} messages missing")
    return 0 if ok else 1


def _spark_demo(args: argparse.Namespace) -> int:
    try:
        from spark_storm.spark.demo import run_demo
    except ImportError as exc:
        print(f"the demo needs the Spark extra: pip install 'spark-storm[spark]' ({exc})", file=sys.stderr)
        return 2
    return run_demo(args.seconds, args.rows_per_second, args.workers, arrow=args.arrow, verbose=args.verbose)


def _kafka(args: argparse.Namespace) -> int:
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


def _zookeeper(args: argparse.Namespace) -> int:
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


def _spark_standalone(args: argparse.Namespace) -> int:
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


def _cluster_conf(args: argparse.Namespace) -> Config:
    return load_config(args.conf, _overrides(args.set))


def _nimbus(args: argparse.Namespace) -> int:
    from spark_storm.cluster.nimbus import Nimbus
    from spark_storm.ui import zookeeper_ui

    conf = _cluster_conf(args)
    nimbus = Nimbus(args.zookeeper, conf)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    nimbus.start()
    print(f"nimbus {nimbus.identifier} contending for leadership in ZooKeeper {nimbus.state.address}", flush=True)
    ui = None
    if args.ui_port is not None:
        # Leader or not, this nimbus serves the UI over its own session: every nimbus reads the same state.
        try:
            ui = _start_ui(zookeeper_ui(nimbus.state, conf, None, args.ui_port))
        except BaseException:  # the nimbus goes down with the error, which is re-raised
            nimbus.stop()
            raise
        print(f"nimbus {nimbus.identifier}: UI on {ui.url}", flush=True)
    leading = False
    while not stop.wait(0.2):
        if nimbus.is_leader != leading:
            leading = nimbus.is_leader
            print(f"nimbus {nimbus.identifier} {'is the leader' if leading else 'is no longer the leader'}", flush=True)
    if ui is not None:
        ui.close()
    nimbus.stop()
    print(f"nimbus {nimbus.identifier} stopped", flush=True)
    return 0


def _supervisor(args: argparse.Namespace) -> int:
    from spark_storm.cluster.supervisor import Supervisor

    ports = None
    if args.slots:
        try:
            ports = [int(p) for p in args.slots.split(",") if p.strip()]
        except ValueError:
            msg = f"--slots {args.slots!r} is not a list of ports like 6700,6701"
            raise ConfigError(msg) from None
    overrides = _overrides(args.set)
    supervisor = Supervisor(
        args.zookeeper,
        args.host,
        ports,
        load_config(args.conf, overrides),
        conf_path=args.conf,
        overrides=overrides,
        supervisor_id=args.id,
        local_dir=args.local_dir,
    )
    signals = {"count": 0}
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signals["count"] += 1
        if signals["count"] >= 2:
            logger.error("second signal: killing every worker now")
            supervisor.kill_now()
            os._exit(3)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    supervisor.start()
    print(
        f"supervisor {supervisor.id} offering {', '.join(map(str, supervisor.slots))} "
        f"in ZooKeeper {supervisor.state.address}; logs in {supervisor.local_dir / 'logs'}",
        flush=True,
    )
    stop.wait()
    print(f"supervisor {supervisor.id}: stopping its workers", flush=True)
    supervisor.stop()
    print(f"supervisor {supervisor.id} stopped", flush=True)
    return 0


def _admin(args: argparse.Namespace) -> int:
    from spark_storm.cluster import admin
    from spark_storm.cluster.state import ClusterState

    with ClusterState(args.zookeeper, _cluster_conf(args)) as state:
        if args.command == "submit":
            record = admin.submit(state, args.file, args.workers, check_classes=not args.no_class_check)
            print(
                f"submitted topology {record.name} ({record.workers} workers) to {state.address}; "
                f"`spark-storm list` shows its assignment"
            )
        elif args.command == "activate":
            print(f"topology {admin.activate(state, args.name).name} is active")
        elif args.command == "deactivate":
            print(f"topology {admin.deactivate(state, args.name).name} is inactive")
        elif args.command == "rebalance":
            record = admin.rebalance(state, args.name, args.workers)
            print(f"topology {record.name}: rebalancing to {record.workers} workers")
        elif args.command == "kill":
            record = admin.kill(state, args.name, args.wait)
            left = max(0.0, (record.kill_at or 0) - time.time())
            print(
                f"topology {record.name} killed: its workers stop now (ordered shutdown); "
                f"removed from ZooKeeper in {left:.0f}s"
            )
        else:
            leader = state.nimbus_leader()
            print(f"nimbus leader: {leader or 'none (start `spark-storm nimbus`)'}")
            rows = admin.list_topologies(state)
            if not rows:
                print("no topologies submitted")
            else:
                print(f"{'name':24s} {'status':9s} {'workers':>9s} {'version':>7s} {'uptime':>9s}  slots")
                for row in rows:
                    print(
                        f"{row.name:24s} {row.status:9s} {f'{row.workers}/{row.requested}':>9s} "
                        f"{row.version:>7d} {_duration(row.uptime_s):>9s}  {','.join(row.slots)}"
                    )
    return 0


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _config(args: argparse.Namespace) -> int:
    conf = load_config(args.conf)
    for key in sorted(conf):
        value = conf[key]
        shown = "***" if "secret" in key and value and not key.endswith(".file") else value
        print(f"{key}: {shown}")
    return 0


def _overrides(pairs: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            msg = f"--set expects key=value, got {pair!r}"
            raise ConfigError(msg)
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def _worker(args: argparse.Namespace) -> int:
    conf = load_config(args.conf, _overrides(args.set))
    if args.zookeeper is not None or args.topology_id is not None:
        if args.topology or args.workers:
            msg = (
                "worker: --zookeeper/--topology-id (cluster mode: plan from ZooKeeper) and --topology/--workers "
                "(static mode) exclude each other; give one form"
            )
            raise ConfigError(msg)
        if not args.topology_id:
            msg = "worker: cluster mode needs --topology-id NAME (the submitted topology; `spark-storm list` shows it)"
            raise ConfigError(msg)
        return run_cluster_worker(args.zookeeper, args.topology_id, args.host, args.port, conf)
    if not args.topology:
        msg = "worker: give --topology FILE (static mode) or --zookeeper ZK --topology-id NAME (cluster mode)"
        raise ConfigError(msg)
    return run_worker(args.topology, args.host, args.port, args.workers, conf)


def run_worker(topology_path: str, host: str, port: int, workers: str | None, conf: Config) -> int:
    """Run one worker on a static slot list until SIGTERM/SIGINT; a second signal or the deadline forces exit."""
    from spark_storm.topology import Slot, load_topology, plan
    from spark_storm.worker import Worker

    topo = load_topology(topology_path)
    p = plan(topo, workers) if workers else plan(topo)
    worker = Worker(p, Slot(host, port), conf)
    worker.tune_process()
    return _serve(worker, lambda: worker, conf)


def run_cluster_worker(zookeeper: str | None, topology_id: str, host: str, port: int, conf: Config) -> int:
    """Run one worker whose plan and status come from ZooKeeper (what a supervisor launches)."""
    from spark_storm.topology import Slot
    from spark_storm.worker.cluster_mode import ClusterWorker

    runner = ClusterWorker(zookeeper, topology_id, Slot(host, port), conf, tune_process=True)
    return _serve(runner, lambda: runner.worker, conf)


def _serve(runner: Any, worker_of: Any, conf: Config) -> int:
    """Start ``runner`` (a Worker or a ClusterWorker), wait for its stop, run the ordered shutdown."""
    signals = {"count": 0}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signals["count"] += 1
        if signals["count"] >= 2:
            logger.error("second signal: exiting now without draining")
            os._exit(3)
        runner.request_stop(f"signal {signal.Signals(signum).name}", failure=False)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        runner.start()
    except StormError:
        runner.stop(5)  # what started (server, threads, a ZooKeeper session) goes down before the error is reported
        raise
    worker = worker_of()
    if worker is not None:
        print(
            f"worker {worker.slot} of {worker.topology_id} listening; tasks {sorted(worker.local_tasks)}; "
            f"metrics on port {worker.metrics_port}; heartbeat {worker.heartbeat_path}",
            flush=True,
        )
    while not runner.stopping.wait(0.5):
        pass
    timeout = conf.get_int("topology.worker.shutdown.timeout.ms", minimum=0) / 1000
    watchdog = threading.Timer(timeout + 5, lambda: os._exit(4))
    watchdog.daemon = True
    watchdog.start()
    clean = runner.stop(timeout)
    watchdog.cancel()
    name = worker.slot if worker is not None else "(not started)"
    print(f"worker {name} stopped ({'clean' if clean else 'deadline passed'})", flush=True)
    return 0 if clean and not runner.failed else 1


def _plan(args: argparse.Namespace) -> int:
    from spark_storm.topology import load_topology, plan

    topo = load_topology(args.file)
    print(plan(topo, args.workers).describe() if args.workers else plan(topo).describe())
    return 0


def _local_cluster(args: argparse.Namespace) -> int:
    from spark_storm.worker.cluster import LocalCluster

    cluster = LocalCluster(args.topology, args.workers, args.conf, _overrides(args.set))
    print(f"starting {args.workers} workers of {cluster.topology.name}: {cluster.workers_arg}")
    stop = {"now": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # The UI binds first: a taken port then fails the command before any worker runs.
    ui = None
    if args.ui_port is not None:
        from spark_storm.ui import local_ui

        conf = load_config(args.conf, _overrides(args.set))
        ui = _start_ui(local_ui(cluster.heartbeat_dir, conf, None, args.ui_port))
    cluster.start()
    print(cluster.plan.describe())
    for slot in cluster.slots:
        hb = cluster.heartbeat(slot) or {}
        print(f"worker {slot}: pid {hb.get('pid')}, metrics http://127.0.0.1:{hb.get('metrics_port')}/metrics")
    if ui is None:
        print(f"UI: spark-storm ui --heartbeat-dir {cluster.heartbeat_dir}  (or run local-cluster with --ui-port 8080)")
    else:
        print(f"UI: {ui.url}topology.html?id={cluster.topology.name}")
    print("running; Ctrl-C stops every worker (ordered shutdown)", flush=True)
    while not stop["now"] and all(p.poll() is None for p in cluster.procs.values()):
        time.sleep(0.2)
    codes = cluster.stop()
    if ui is not None:
        ui.close()
    for slot, code in codes.items():
        print(f"worker {slot} exited with {code}")
    return 0 if all(c == 0 for c in codes.values()) else 1


def _start_ui(server: UIServer) -> UIServer:
    """Start a built UI; a port it cannot bind is one clear error (and its source is closed)."""
    try:
        return server.start()
    except OSError as exc:
        server.source.close()
        msg = (
            f"the UI cannot listen on {server.host}:{server.port}: {exc.strerror}; pick another with --port / --ui-port"
        )
        raise StormError(msg) from exc


def _ui(args: argparse.Namespace) -> int:
    from spark_storm.ui import local_ui, zookeeper_ui

    conf = load_config(args.conf, _overrides(args.set))
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
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = _start_ui(server)
    what = server.sampler.snapshot().state.description
    print(f"spark-storm UI on {server.url} ({what}); Ctrl-C stops it", flush=True)
    while not stop.wait(0.5):
        pass
    server.close()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spark-storm", description="Storm-style workers fed by Spark")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default), ERROR")
    sub = parser.add_subparsers(dest="command", required=True)
    sdemo = sub.add_parser("demo", help="local Spark -> format('storm') -> 2-worker wordcount, live progress")
    sdemo.add_argument("--seconds", type=float, default=30.0, help="how long to stream (Ctrl-C stops early)")
    sdemo.add_argument(
        "--rows-per-second", type=int, default=None, help="sentences per second (default 2000; 40000 with --arrow)"
    )
    sdemo.add_argument("--workers", type=int, default=2)
    sdemo.add_argument("--arrow", action="store_true", help="the columnar wordcount (batch bolts), at 20x the rate")
    sdemo.add_argument("--verbose", action="store_true", help="also Spark's progress bar and its INFO/WARN log")
    sdemo.set_defaults(func=_spark_demo)
    demo = sub.add_parser("transport-demo", help="two-process transport round trip with live progress")
    demo.add_argument("--transport", default="tcp", choices=sorted(TRANSPORT_ALIASES))
    demo.add_argument("--messages", type=int, default=2_000_000)
    demo.add_argument("--seconds", type=float, default=20.0)
    demo.add_argument("--size", type=int, default=100, help="payload bytes per message")
    demo.add_argument("--batch", type=int, default=1000, help="messages per send()")
    demo.add_argument("--conf", help="a storm.yaml with overrides")
    demo.set_defaults(func=_demo)
    worker = sub.add_parser(
        "worker",
        help="run one worker process of a topology",
        description="Static mode: --topology FILE [--workers SLOTS]. Cluster mode (what a supervisor launches): "
        "--zookeeper ZK --topology-id NAME; the plan and status come from ZooKeeper and are followed.",
    )
    worker.add_argument("--topology", help="topology YAML (static mode)")
    worker.add_argument("--port", type=int, required=True)
    worker.add_argument("--host", default="127.0.0.1", help="this worker's host as the slot list / assignment names it")
    worker.add_argument("--workers", help="static mode: all slots host:port,... (default: the topology's 'workers')")
    worker.add_argument("--zookeeper", help="cluster mode: HOST:PORT[,HOST:PORT][/chroot] of the cluster's state")
    worker.add_argument("--topology-id", help="cluster mode: the submitted topology's name")
    worker.add_argument("--conf", help="a storm.yaml with overrides")
    worker.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override (repeatable)")
    worker.set_defaults(func=_worker)
    cluster = sub.add_parser("local-cluster", help="run N workers on loopback until Ctrl-C")
    cluster.add_argument("--topology", required=True, help="topology YAML")
    cluster.add_argument("--workers", type=int, default=2)
    cluster.add_argument("--conf", help="a storm.yaml with overrides")
    cluster.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override (repeatable)")
    cluster.add_argument(
        "--ui-port", type=int, metavar="PORT", help="also serve the UI in this process on PORT (0 = any free port)"
    )
    cluster.set_defaults(func=_local_cluster)
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
    ui.set_defaults(func=_ui)
    topology = sub.add_parser("topology", help="topology tools")
    tsub = topology.add_subparsers(dest="topology_command", required=True)
    tplan = tsub.add_parser("plan", help="print tasks, executors and the worker each runs on")
    tplan.add_argument("file", help="topology YAML")
    tplan.add_argument("--workers", help="slots host:port,... (default: the topology's 'workers')")
    tplan.set_defaults(func=_plan)
    kafka = sub.add_parser("kafka", help="a local KRaft Kafka broker for tests and demos")
    kafka.add_argument("action", choices=["start", "stop", "status"])
    kafka.add_argument("--dir", default=".run/kafka", help="state directory (config, data, pid, log)")
    kafka.set_defaults(func=_kafka)
    zookeeper = sub.add_parser("zookeeper", help="a local ZooKeeper server for cluster mode")
    zookeeper.add_argument("action", choices=["start", "stop", "status"])
    zookeeper.add_argument("--dir", default=".run/zookeeper", help="state directory (config, data, pid, log)")
    zookeeper.add_argument("--port", type=int, help="client port (default: a free one)")
    zookeeper.add_argument("--host", default="127.0.0.1", help="address the client port binds (default loopback)")
    zookeeper.set_defaults(func=_zookeeper)
    standalone = sub.add_parser("spark-standalone", help="a local Spark standalone master + worker")
    standalone.add_argument("action", choices=["start", "stop", "status"])
    standalone.add_argument("--dir", default=".run/spark-standalone", help="state directory (pids, logs, work)")
    standalone.add_argument("--cores", type=int, default=2, help="cores the worker offers")
    standalone.add_argument("--memory", default="2g", help="memory the worker offers")
    standalone.set_defaults(func=_spark_standalone)

    def cluster_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--zookeeper", help="HOST:PORT[,HOST:PORT][/chroot] (default: storm.zookeeper.* keys)")
        p.add_argument("--conf", help="a storm.yaml with overrides")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="config override (repeatable)")

    nimbus = sub.add_parser("nimbus", help="run a nimbus (leader-elected) until SIGTERM/Ctrl-C")
    cluster_args(nimbus)
    nimbus.add_argument(
        "--ui-port", type=int, metavar="PORT", help="also serve the Storm UI on PORT (ui.host; 0 = any free port)"
    )
    nimbus.set_defaults(func=_nimbus)
    supervisor = sub.add_parser("supervisor", help="run a supervisor for this host's slots until SIGTERM/Ctrl-C")
    cluster_args(supervisor)
    supervisor.add_argument("--host", default="127.0.0.1", help="this host's name as other workers reach it")
    supervisor.add_argument("--slots", help="worker ports, e.g. 6700,6701 (default: supervisor.slots.ports)")
    supervisor.add_argument("--id", help="supervisor id in ZooKeeper (default: HOST-random)")
    supervisor.add_argument("--local-dir", help="topology files, worker logs (default: storm.local.dir or a temp dir)")
    supervisor.set_defaults(func=_supervisor)
    submit = sub.add_parser("submit", help="submit a topology YAML to the cluster")
    cluster_args(submit)
    submit.add_argument("file", help="topology YAML")
    submit.add_argument("--workers", type=int, help="worker processes (default: topology.workers)")
    submit.add_argument("--no-class-check", action="store_true", help="do not import the bolt classes here first")
    submit.set_defaults(func=_admin)
    for name, text in (("activate", "let its executors consume"), ("deactivate", "pause its executors")):
        p = sub.add_parser(name, help=f"{text} (a submitted topology)")
        cluster_args(p)
        p.add_argument("name", help="topology name")
        p.set_defaults(func=_admin)
    rebalance = sub.add_parser("rebalance", help="change a submitted topology's number of workers")
    cluster_args(rebalance)
    rebalance.add_argument("name", help="topology name")
    rebalance.add_argument("--workers", type=int, required=True, help="new number of worker processes")
    rebalance.set_defaults(func=_admin)
    kill = sub.add_parser("kill", help="deactivate a topology, then remove it and stop its workers")
    cluster_args(kill)
    kill.add_argument("name", help="topology name")
    kill.add_argument(
        "--wait", type=float, help="seconds between deactivation and removal (topology.message.timeout.secs)"
    )
    kill.set_defaults(func=_admin)
    listing = sub.add_parser("list", help="submitted topologies: name, status, workers, uptime")
    cluster_args(listing)
    listing.set_defaults(func=_admin)
    config = sub.add_parser("config", help="print the effective configuration")
    config.add_argument("--conf", help="a storm.yaml with overrides")
    config.set_defaults(func=_config)
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=lambda a: print(__version__) or 0)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _parser().parse_args(argv)
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


if __name__ == "__main__":
    raise SystemExit(main())
