"""One HTTP policy for the worker's endpoint and the UI: JSON replies, ``nosniff``, the origin guard.

Both servers have no login, and both usually listen on loopback, where any web page the
user opens can reach them through the browser.  A browser lets a page of another site
*send* a "simple" POST to ``http://127.0.0.1:<port>/...`` (it only hides the answer), so a
state-changing request is refused when:

- it comes from a page of another origin: browsers send ``Origin`` with every POST, and
  its host:port must be the ``Host`` the request was sent to;
- the server listens on loopback but the request names another host (``Host``): a page
  whose DNS name was re-pointed at 127.0.0.1 (*DNS rebinding*) is same-origin to the
  browser, but it still names its own host.

Scripts (curl, ``urllib``, the UI reading its workers) send no ``Origin`` and name the
host they connect to, so they are not affected.  Every reply says ``nosniff`` and
``no-cache``; errors are JSON ``{"error": <reason>, "errorMessage": <what and how to fix>}``,
Storm's UI REST shape.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Callable, Mapping
from email.message import Message
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar
from urllib.parse import urlsplit

__all__ = ["JsonRequestHandler", "cross_origin_refusal"]

logger = logging.getLogger(__name__)

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def _is_loopback_name(host: str) -> bool:
    host = host.strip("[]").lower().rstrip(".")
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostname(netloc: str) -> str:
    return urlsplit(f"//{netloc}").hostname or ""


def cross_origin_refusal(headers: Message | Mapping[str, str], bound_host: str) -> str | None:
    """Why a state-changing request must be refused, or None when it may go ahead.

    Parameters
    ----------
    headers : mapping
        The request's headers (``Origin``, ``Host``).
    bound_host : str
        The address the server listens on (``server_address[0]``).

    Returns
    -------
    str or None
        The refusal, worded for the caller (it names the origin or host and the way out).
    """
    host = str(headers.get("Host") or "")
    raw_origin = headers.get("Origin")
    origin = None if raw_origin is None else str(raw_origin)
    if origin is not None and urlsplit(origin).netloc.lower() != host.lower():
        return f"cross-origin POST from {origin} refused; send it from this server's own pages or from a script"
    if _is_loopback_name(bound_host) and host and not _is_loopback_name(_hostname(host)):
        return (
            f"POST naming host {host!r} refused: this server listens on loopback only, so a request "
            "that names another host comes through a re-pointed DNS name; use 127.0.0.1 or localhost"
        )
    return None


class JsonRequestHandler(BaseHTTPRequestHandler):
    """A request handler that replies by the policy: JSON, ``nosniff``, the origin guard.

    Subclasses write ``do_GET`` / ``do_POST`` with :meth:`send_body`, :meth:`send_json` and
    :meth:`send_json_error`, and start each state-changing request with
    ``if self.refuse_cross_origin(): return``.
    """

    server_version = "spark-storm"
    #: ``json.dumps`` ``default`` for values JSON has no type for (the worker's /health: str).
    json_default: ClassVar[Callable[[Any], Any] | None] = None

    def send_body(self, status: int, body: bytes, content_type: str) -> None:
        """Send a complete reply with the policy's headers."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, data: Any) -> None:
        """Send ``data`` as ``application/json``."""
        default = type(self).json_default  # read off the class: a plain function stays unbound
        self.send_body(status, json.dumps(data, default=default).encode(), "application/json")

    def send_json_error(self, status: int, message: str) -> None:
        """Send ``{"error": <the status's reason>, "errorMessage": message}``."""
        reason = self.responses.get(status, ("Error",))[0]
        self.send_json(status, {"error": reason, "errorMessage": message})

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Errors the base class raises itself (a malformed request, an unknown method) in JSON too."""
        self.close_connection = True
        reason = self.responses.get(code, ("Error",))[0]
        self.send_json_error(code, explain or message or reason)

    def refuse_cross_origin(self) -> bool:
        """Reply 403 and return True when a state-changing request must be refused."""
        address = self.server.server_address
        why = cross_origin_refusal(self.headers, str(address[0]) if isinstance(address, tuple) else "")
        if why is None:
            return False
        logger.warning("%s %s from %s: %s", self.command, self.path, self.address_string(), why)
        self.send_json_error(403, why)
        return True

    def read_body(self, limit: int = 1 << 20) -> bytes:
        """Read the request body (at most ``limit`` bytes)."""
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(min(length, limit)) if length > 0 else b""

    def log_message(self, format: str, *args: Any) -> None:
        """Log requests at DEBUG on this module's logger, not to stderr."""
        logger.debug("%s %s", self.address_string(), format % args)
