"""Small network helpers shared by the layers (no imports from them)."""

from __future__ import annotations

import socket

__all__ = ["FIRST_EPHEMERAL_PORT", "free_ports"]

#: IANA's first dynamic port: transports without real ports (local, Kafka topics, zmq ipc) number theirs from here.
FIRST_EPHEMERAL_PORT = 49152


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Return ``n`` distinct ports that were free a moment ago (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
