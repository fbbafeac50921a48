"""The ``spark-storm`` command line.

Commands
--------
demo            send messages through a transport between two processes, with live progress
config          print the effective configuration (defaults + --conf file)
version         print the version
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from spark_storm import __version__
from spark_storm.config import STORM_MESSAGING_TRANSPORT, load_config
from spark_storm.errors import StormError
from spark_storm.messaging import MessageBatch, TaskMessage
from spark_storm.transport import TRANSPORT_ALIASES, make_context

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


def _config(args: argparse.Namespace) -> int:
    conf = load_config(args.conf)
    for key in sorted(conf):
        value = conf[key]
        shown = "***" if "secret" in key and value and not key.endswith(".file") else value
        print(f"{key}: {shown}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spark-storm", description="Storm-style workers fed by Spark")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default), ERROR")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="two-process transport round trip with live progress")
    demo.add_argument("--transport", default="tcp", choices=sorted(TRANSPORT_ALIASES))
    demo.add_argument("--messages", type=int, default=2_000_000)
    demo.add_argument("--seconds", type=float, default=20.0)
    demo.add_argument("--size", type=int, default=100, help="payload bytes per message")
    demo.add_argument("--batch", type=int, default=1000, help="messages per send()")
    demo.add_argument("--conf", help="a storm.yaml with overrides")
    demo.set_defaults(func=_demo)
    config = sub.add_parser("config", help="print the effective configuration")
    config.add_argument("--conf", help="a storm.yaml with overrides")
    config.set_defaults(func=_config)
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=lambda a: print(__version__) or 0)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except StormError as exc:
        print(f"spark-storm: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
