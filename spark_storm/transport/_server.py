"""What the tcp and zmq servers share: an I/O thread fed by a command queue."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from spark_storm.config import Config, is_loopback_host
from spark_storm.errors import ConnectionClosedError
from spark_storm.messaging.api import CallbackLike
from spark_storm.messaging.message import BackpressureStatus
from spark_storm.messaging.wire import LoadMetrics, encode_control
from spark_storm.transport._base import ServerBase
from spark_storm.transport._client import JOIN_TIMEOUT_S
from spark_storm.transport._wake import Waker

__all__ = ["IOThreadServer", "LogLimiter", "warn_if_open"]

logger = logging.getLogger(__name__)


def warn_if_open(log: logging.Logger, topology_id: str, host: str, authenticated: bool) -> bool:
    """Log the SECURITY warning of a server bound beyond loopback without authentication.

    Returns whether it warned.  Every network transport calls it when it binds.
    """
    if authenticated or is_loopback_host(host):
        return False
    log.warning(
        "SECURITY: binding %s on non-loopback host %s WITHOUT authentication: anyone who can "
        "reach this port can inject tuples. Set storm.messaging.auth.secret(.file).",
        topology_id,
        host,
    )
    return True


class LogLimiter:
    """Logs one record per kind per interval; the next one says how many were held back.

    A server under attack (thousands of garbage connections, a full file table) must not
    turn every refused peer into a log line: the log would become the attack.
    """

    def __init__(self, log: logging.Logger, interval_s: float = 10.0) -> None:
        self._log = log
        self._interval = interval_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def log(self, level: int, kind: str, fmt: str, *args: object) -> bool:
        """Log ``fmt % args`` unless ``kind`` was logged less than an interval ago; True if logged."""
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval:
            self._held[kind] = self._held.get(kind, 0) + 1
            return False
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        if held:
            fmt += " (and %d more like it in the last %.0fs)"
            args = (*args, held, now - (last or now))
        self._log.log(level, fmt, *args)
        return True


class IOThreadServer(ServerBase):
    """A server whose socket belongs to one I/O thread; other threads reach it by command.

    Subclasses start ``self._thread``, drain ``self._commands`` in it (frames to broadcast
    to every ready client) and report their ready clients in :meth:`ready_clients`.
    """

    def __init__(self, context: Any, conf: Config, topology_id: str, callback: CallbackLike | None) -> None:
        super().__init__(conf, topology_id, callback)
        self._context = context
        self._commands: deque[bytes] = deque()
        self._waker = Waker()
        self._thread: threading.Thread | None = None
        for name in ("evicted_connections", "refused_connections", "idle_timeouts", "disconnects"):
            self.count(name, 0)  # listed in metrics() from the start

    def ready_clients(self) -> int:
        raise NotImplementedError  # pragma: no cover - every subclass overrides it

    def send_load_metrics(self, loads: Mapping[int, float]) -> None:
        self._command(encode_control(LoadMetrics(dict(loads))))

    def send_backpressure_status(self, status: BackpressureStatus) -> None:
        self._command(encode_control(status))

    def _command(self, frame: bytes) -> None:
        if self.closed:
            msg = f"{self.describe()} is closed"
            raise ConnectionClosedError(msg)
        self._commands.append(frame)
        self._waker.poke()

    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        out["clients"] = self.ready_clients()
        return out

    def abandon(self) -> None:
        """Give the server up when its I/O thread failed: it says CLOSED, and its context forgets it."""
        if self.mark_closed():
            self._context.forget(self)

    def close(self) -> None:
        if not self.mark_closed():
            return
        self._waker.poke()
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join(JOIN_TIMEOUT_S)
        self._context.forget(self)
        logger.info("closed %s", self.describe())
