"""Small network helpers shared by the layers (no imports from them)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["FIRST_EPHEMERAL_PORT", "free_ports"]

#: IANA's first dynamic port: transports without real ports (local, Kafka topics, zmq ipc) number theirs from here.
FIRST_EPHEMERAL_PORT = 49152
#: free_ports draws from here up to the kernel's ephemeral range (below: well-known services).
_FLOOR = 10000


def _ephemeral_low() -> int:
    """Return the lowest port the kernel gives outgoing connections (Linux's ip_local_port_range; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Return ``n`` distinct ports that were free a moment ago (bound together, then released).

    They are drawn below the kernel's ephemeral range where there is room: a port that
    ``bind(0)`` hands out lies in that range, and an outgoing connection (a client
    reconnecting) may take it between this check and the listener's bind, which then fails
    with "Address already in use" (bench.chaos seed 1000 #35, a worker restarted after a
    redeploy).  Ports below the range are never given to outgoing connections.
    """
    socks: list[socket.socket] = []
    low = _ephemeral_low()
    rng = random.SystemRandom()
    try:
        tries = 0
        while len(socks) < n and low - _FLOOR > 100 * n and tries < 50 * n:
            tries += 1
            s = socket.socket()
            try:
                s.bind((host, rng.randrange(_FLOOR, low)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
