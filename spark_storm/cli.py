"""The ``spark-storm`` command line.

Commands
--------
demo            local Spark streaming sentences into a 2-worker wordcount topology (live progress)
transport-demo  send messages through a transport between two processes, with live progress
worker          run one worker process of a topology
local-cluster   run N worker processes on loopback until Ctrl-C
ui              the Storm UI and REST API for a local cluster's workers
topology plan   print a topology's tasks, executors and the worker each runs on
kafka           start | stop | status a local KRaft Kafka broker (jars from scripts/fetch-jars)
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
from spark_storm.messaging import MessageBatch, TaskMessage
from spark_storm.transport import TRANSPORT_ALIASES, make_context

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
    return run_demo(args.seconds, args.rows_per_second, args.workers)


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
    return run_worker(args.topology, args.host, args.port, args.workers, conf)


def run_worker(topology_path: str, host: str, port: int, workers: str | None, conf: Config) -> int:
    """Run one worker until SIGTERM/SIGINT; a second signal or the deadline forces exit."""
    from spark_storm.topology import Slot, load_topology, plan
    from spark_storm.worker import Worker

    topo = load_topology(topology_path)
    p = plan(topo, workers) if workers else plan(topo)
    worker = Worker(p, Slot(host, port), conf)
    signals = {"count": 0}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signals["count"] += 1
        if signals["count"] >= 2:
            logger.error("second signal: exiting now without draining")
            os._exit(3)
        worker.request_stop(f"signal {signal.Signals(signum).name}", failure=False)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker.tune_gc()
    try:
        worker.start()
    except StormError:
        worker.stop(0)  # what started (server, threads) goes down before the error is reported
        raise
    print(
        f"worker {worker.slot} of {topo.name} listening; tasks {sorted(worker.local_tasks)}; "
        f"metrics on port {worker.metrics_port}; heartbeat {worker.heartbeat_path}",
        flush=True,
    )
    while not worker.stopping.wait(0.5):
        pass
    timeout = conf.get_int("topology.worker.shutdown.timeout.ms", minimum=0) / 1000
    watchdog = threading.Timer(timeout + 5, lambda: os._exit(4))
    watchdog.daemon = True
    watchdog.start()
    clean = worker.stop(timeout)
    watchdog.cancel()
    print(f"worker {worker.slot} stopped ({'clean' if clean else 'deadline passed'})", flush=True)
    return 0 if clean and not worker.failed else 1


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
        ui = _start_ui(cluster.heartbeat_dir, load_config(args.conf, _overrides(args.set)), None, args.ui_port)
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


def _start_ui(heartbeat_dir: str | Path, conf: Config, host: str | None, port: int | None) -> UIServer:
    from spark_storm.ui import local_ui

    server = local_ui(heartbeat_dir, conf, host, port)
    try:
        return server.start()
    except OSError as exc:
        msg = (
            f"the UI cannot listen on {server.host}:{server.port}: {exc.strerror}; pick another with --port / --ui-port"
        )
        raise StormError(msg) from exc


def _ui(args: argparse.Namespace) -> int:
    conf = load_config(args.conf, _overrides(args.set))
    hb_dir = args.heartbeat_dir or conf.get_optional_str("worker.heartbeat.dir") or tempfile.gettempdir()
    if not Path(hb_dir).is_dir():
        msg = f"--heartbeat-dir {hb_dir!r} is not a directory; use the one `spark-storm local-cluster` prints"
        raise ConfigError(msg)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = _start_ui(hb_dir, conf, args.host, args.port)
    print(f"spark-storm UI on {server.url} (local cluster: worker heartbeats in {hb_dir}); Ctrl-C stops it", flush=True)
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
    sdemo.add_argument("--rows-per-second", type=int, default=2000)
    sdemo.add_argument("--workers", type=int, default=2)
    sdemo.set_defaults(func=_spark_demo)
    demo = sub.add_parser("transport-demo", help="two-process transport round trip with live progress")
    demo.add_argument("--transport", default="tcp", choices=sorted(TRANSPORT_ALIASES))
    demo.add_argument("--messages", type=int, default=2_000_000)
    demo.add_argument("--seconds", type=float, default=20.0)
    demo.add_argument("--size", type=int, default=100, help="payload bytes per message")
    demo.add_argument("--batch", type=int, default=1000, help="messages per send()")
    demo.add_argument("--conf", help="a storm.yaml with overrides")
    demo.set_defaults(func=_demo)
    worker = sub.add_parser("worker", help="run one worker process of a topology")
    worker.add_argument("--topology", required=True, help="topology YAML")
    worker.add_argument("--port", type=int, required=True)
    worker.add_argument("--host", default="127.0.0.1", help="this worker's host in the slot list")
    worker.add_argument("--workers", help="all slots host:port,... (default: the topology's 'workers')")
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
    ui = sub.add_parser("ui", help="the Storm UI and REST API (/api/v1/) for a local cluster's workers")
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


if __name__ == "__main__":
    raise SystemExit(main())
