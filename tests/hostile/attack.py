"""Tools of the hostile tier: a server process to attack, its RSS and CPU, raw peers.

Everything here talks to real servers over loopback; nothing stands in for one.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spark_storm.messaging import IContext, TaskMessage
from spark_storm.messaging.handshake import ClientHandshake, new_session_id
from spark_storm.messaging.wire import Challenge, FrameDecoder, Ok, Seq, encode_control, encode_messages
from spark_storm.transport import make_context

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = "h"
MiB = 1 << 20


def rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` in KiB, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    msg = f"no VmRSS for pid {pid}"
    raise AssertionError(msg)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssPeak:
    """Samples a process's RSS every 5 ms in a thread; ``peak`` is the largest seen (KiB)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_kb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            try:
                self.peak = max(self.peak, rss_kb(self.pid))
            except (OSError, AssertionError):
                return

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


class Served:
    """A server process (tests/hostile/serve.py) bound with ``conf``; stopped by PID."""

    def __init__(self, conf: dict[str, Any], tmp: Path, nofile: int | None = None) -> None:
        self.conf = conf
        self.log = tmp / f"server-{time.monotonic_ns()}.log"
        spec = json.dumps({"conf": conf, "nofile": nofile})
        self._err = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.hostile.serve", spec],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            msg = f"server did not start: {line!r}\n{self.log.read_text()}"
            raise AssertionError(msg)
        self.port = int(line.split()[1])
        self.pid = self.proc.pid

    def metrics(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write("m\n")
        self.proc.stdin.flush()
        data: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return data

    def rss_kb(self) -> int:
        return rss_kb(self.pid)

    def log_lines(self, needle: str) -> int:
        return sum(1 for line in self.log.read_text(errors="replace").splitlines() if needle in line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self._err.close()


@contextmanager
def served(conf: dict[str, Any], tmp: Path, nofile: int | None = None) -> Iterator[Served]:
    """Start a server process for the block; stop it (by PID) afterwards."""
    server = Served(conf, tmp, nofile)
    try:
        yield server
    finally:
        server.stop()


def good_messages(n: int, start: int = 0) -> list[TaskMessage]:
    return [TaskMessage(1, b"good:%d" % i) for i in range(start, start + n)]


def send_good(conf: dict[str, Any], port: int, n: int, timeout: float = 30.0) -> IContext:
    """Connect a well-behaved client with ``conf``, send ``n`` good messages, wait for receipts.

    Returns the context (the caller terms it).
    """
    ctx = make_context(conf)
    client = ctx.connect(TOPOLOGY, "127.0.0.1", port)
    for k in range(0, n, 1000):
        client.send(good_messages(min(1000, n - k), k))
    assert client.flush(timeout), client.metrics()
    return ctx


def assert_refused_once_and_serving(server: Served, conf: dict[str, Any]) -> None:
    """The server refused one attack (and delivered none of it), and a good client is still served."""
    ctx = send_good(conf, server.port, 1_000)
    ctx.term()
    metrics = server.metrics()
    assert server.log_lines("I/O thread failed") == 0
    assert (metrics["good"], metrics["evil"], metrics["protocol_errors"]) == (1_000, 0, 1), metrics


def raw_handshake(sock: socket.socket, secret: bytes | None = None, topology: str = TOPOLOGY) -> bytes:
    """Complete the session handshake on a raw tcp socket as a client would; return the session id."""
    session = new_session_id()
    hs = ClientHandshake(topology, session, secret, "server")
    sock.sendall(encode_control(hs.hello()))
    decoder = FrameDecoder(1 << 20)
    for frame in _frames(sock, decoder):
        if isinstance(frame, Challenge):
            sock.sendall(encode_control(hs.on_challenge(frame)))
        elif isinstance(frame, Ok):
            hs.on_ok(frame)
            return session
    msg = "the server closed during the handshake"
    raise AssertionError(msg)


def _frames(sock: socket.socket, decoder: FrameDecoder) -> Iterator[object]:
    while True:
        data = sock.recv(65536)
        if not data:
            return
        yield from decoder.feed(data)


def frame_header(code: int, length: int) -> bytes:
    return struct.pack(">hi", code, length)


def zmq_handshake(dealer: Any, secret: bytes | None = None, topology: str = TOPOLOGY) -> bytes:
    """Complete the session handshake on a raw zmq DEALER; return the session id."""
    session = new_session_id()
    hs = ClientHandshake(topology, session, secret, "server")
    dealer.send(encode_control(hs.hello()))
    decoder = FrameDecoder(1 << 20)
    while dealer.poll(10_000):
        data = dealer.recv()
        for frame in decoder.feed(data):
            if isinstance(frame, Challenge):
                dealer.send(encode_control(hs.on_challenge(frame)))
            elif isinstance(frame, Ok):
                hs.on_ok(frame)
                return session
    msg = "no answer to the handshake"
    raise AssertionError(msg)


def evil_data(first: int, n: int = 1) -> bytes:
    """A SEQ and ``n`` data frames with payload ``evil``: what an attacker wants delivered."""
    return encode_control(Seq(first, n)) + encode_messages([TaskMessage(1, b"evil")] * n)
