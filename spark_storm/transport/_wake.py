"""A wake-up socketpair: other threads poke an I/O thread blocked in select/poll."""

from __future__ import annotations

import contextlib
import socket

__all__ = ["Waker"]


class Waker:
    """A non-blocking socketpair; ``poke`` from any thread, ``drain`` in the I/O thread."""

    def __init__(self) -> None:
        self.reader, self._writer = socket.socketpair()
        self.reader.setblocking(False)
        self._writer.setblocking(False)

    def poke(self) -> None:
        """Wake the I/O thread (cheap; a full pipe already means a pending wake)."""
        with contextlib.suppress(OSError):
            self._writer.send(b"\0")

    def drain(self) -> None:
        """Swallow pending wake bytes (I/O thread only)."""
        with contextlib.suppress(OSError):
            while self.reader.recv(4096):
                pass

    def close(self) -> None:
        """Close both ends."""
        self.reader.close()
        self._writer.close()
