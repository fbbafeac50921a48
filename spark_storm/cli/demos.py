"""Demos: a two-process transport round trip, and local Spark into a wordcount topology."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from spark_storm.config import STORM_MESSAGING_TRANSPORT, load_config
from spark_storm.messaging import MessageBatch, TaskMessage
from spark_storm.transport import make_context, resolve_transport

__all__ = ["spark_demo", "transport_demo"]


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


def transport_demo(args: argparse.Namespace) -> int:
    """``spark-storm transport-demo``: send through a transport to a receiver process, with live progress."""
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


def spark_demo(args: argparse.Namespace) -> int:
    """``spark-storm demo``: local Spark streaming sentences into a wordcount topology."""
    try:
        from spark_storm.demos.windows import run_windows_demo
        from spark_storm.demos.wordcount import run_demo
    except ImportError as exc:
        print(f"the demo needs the Spark extra: pip install 'spark-storm[spark]' ({exc})", file=sys.stderr)
        return 2
    if args.windows:
        if args.on_spark:
            print("spark-storm demo: --on-spark hosts the wordcount demo; drop --windows", file=sys.stderr)
            return 2
        if args.arrow:
            print("spark-storm demo: --windows runs the tuple topology; drop --arrow", file=sys.stderr)
            return 2
        if args.window <= 0:
            print(
                f"spark-storm demo: --window {args.window}: give the window's length in seconds (> 0)", file=sys.stderr
            )
            return 2
        return run_windows_demo(
            args.seconds,
            args.rows_per_second,
            args.workers,
            window_s=args.window,
            verbose=args.verbose,
            kill_worker=args.kill_worker,
        )
    return run_demo(
        30.0 if args.seconds is None else args.seconds,
        args.rows_per_second,
        args.workers,
        arrow=args.arrow,
        verbose=args.verbose,
        kill_worker=args.kill_worker,
        on_spark=args.on_spark,
    )
