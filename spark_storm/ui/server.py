"""The UI's HTTP server: static pages plus the REST API under ``/api/v1/``.

GET ``/api/v1/cluster/summary``, ``/api/v1/cluster/configuration``, ``/api/v1/nimbus/summary``,
``/api/v1/supervisor/summary``, ``/api/v1/topology/summary``, ``/api/v1/topology/<id>``,
``/api/v1/topology/<id>/component/<component>``, ``/api/v1/topology-workers/<id>`` (Storm's
shapes) and ``/api/v1/topology/<id>/history`` (ours: executed per second per component for
the charts).  POST ``/api/v1/topology/<id>/activate``, ``.../deactivate``,
``.../rebalance/<wait-secs>``, ``.../kill/<wait-secs>``, ``.../savepoint`` (ours: JSON ``{"dir": ...}``;
the answer names the savepoint's ``path`` and ``epoch``).  Errors are JSON
``{"error": ..., "errorMessage": ...}`` with 400 (a bad wait time or option), 403, 404, 405,
501 (this cluster cannot do that) or 502 (a worker, ZooKeeper or nimbus refused or could not
be reached).

Replies follow the package's one HTTP policy (:mod:`spark_storm.http_policy`, which the
workers' endpoints follow too): a POST from a browser page of another origin is refused
(403): the API has no login, so a page on another site must not be able to kill a topology
through the user's browser.  Scripts (curl, requests) send no ``Origin`` header and are not
affected.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from spark_storm.config import Config
from spark_storm.errors import (
    ActionNotSupportedError,
    ConfigError,
    StormError,
    TopologyActionError,
    UnknownTopologyError,
)
from spark_storm.http_policy import JsonRequestHandler
from spark_storm.ui import views
from spark_storm.ui.sampler import Sampler, Snapshot, TopologyReading
from spark_storm.ui.source import ClusterSource

__all__ = ["STATIC_DIR", "UIServer"]

logger = logging.getLogger(__name__)

#: The pages, scripts and styles; ``vendor/`` holds uPlot (scripts/fetch-ui-assets).
STATIC_DIR = Path(__file__).resolve().parent / "static"
_PAGES = {"/": "index.html", "/index.html": "index.html", "/topology.html": "topology.html"}
_PAGES["/component.html"] = "component.html"
_ACTIONS = ("activate", "deactivate", "rebalance", "kill", "savepoint")


def _savepoint_dir(body: bytes) -> str:
    try:
        directory = json.loads(body or b"{}").get("dir")
    except (ValueError, AttributeError):
        directory = None
    if not isinstance(directory, str) or not directory.strip():
        raise _HttpError(400, 'POST /api/v1/topology/<id>/savepoint wants JSON {"dir": "/dir/every/worker/writes"}')
    return directory.strip()


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _wait_secs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        msg = f"wait time must be a whole number of seconds >= 0, got {text!r} (e.g. .../kill/30)"
        raise _HttpError(400, msg)
    return value


class UIServer:
    """Serve the UI and the REST API for one cluster source.

    Parameters
    ----------
    source : ClusterSource
        Where topologies, workers and actions go.
    conf : Config
        ``ui.*`` settings (host, port, sampling, history, timeouts).
    host, port : optional
        Override ``ui.host`` / ``ui.port`` (port 0 = any free port).
    """

    def __init__(self, source: ClusterSource, conf: Config, host: str | None = None, port: int | None = None) -> None:
        self.source = source
        self.conf = conf
        self.host = host if host is not None else conf.get_str("ui.host")
        self._port = port if port is not None else conf.get_int("ui.port", minimum=0)
        self.interval_ms = conf.get_int("ui.sample.interval.ms", minimum=50)
        self.window_s = float(conf.get_int("ui.rate.window.secs", minimum=1))
        self.sampler = Sampler(
            source,
            self.interval_ms / 1000,
            float(conf.get_int("ui.history.secs", minimum=10)),
            conf.get_int("ui.http.timeout.ms", minimum=1) / 1000,
        )
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        return self._server.server_address[1] if self._server is not None else self._port

    @property
    def url(self) -> str:
        """``http://host:port/``; a wildcard bind is shown as 127.0.0.1."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> UIServer:
        """Bind, take a first reading of the cluster and serve on daemon threads."""
        self._server = ThreadingHTTPServer((self.host, self._port), self._handler())
        self._server.daemon_threads = True
        self.sampler.start()
        self._thread = threading.Thread(target=self._server.serve_forever, name="spark-storm-ui-http", daemon=True)
        self._thread.start()
        logger.info("UI on %s (%s)", self.url, self.sampler.snapshot().state.description)
        return self

    def close(self) -> None:
        """Stop serving and sampling; cancel delayed actions."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self.sampler.stop()
        self.source.close()

    def __enter__(self) -> UIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ API
    def _reading(self, snap: Snapshot, topology_id: str) -> TopologyReading:
        reading = snap.topologies.get(topology_id)
        if reading is None:
            msg = f"no running topology {topology_id!r}; /api/v1/topology/summary lists the running ones"
            raise _HttpError(404, msg)
        return reading

    def get_api(self, parts: list[str]) -> Any:
        """Answer a GET under /api/v1/ (``parts`` = the decoded path segments after it)."""
        snap = self.sampler.snapshot()
        match parts:
            case ["cluster", "summary"]:
                return {**views.cluster_summary(snap), "sampleIntervalMs": self.interval_ms}
            case ["cluster", "configuration"]:
                return {k: ("***" if "secret" in k and v else v) for k, v in sorted(self.conf.items())}
            case ["nimbus", "summary"]:
                return views.nimbus_summary(snap)
            case ["supervisor", "summary"]:
                return views.supervisor_summary(snap)
            case ["topology", "summary"]:
                return views.topology_summary(snap)
            case ["topology-workers", tid]:
                return views.topology_workers(self._reading(snap, tid))
            case ["topology", tid]:
                reading = self._reading(snap, tid)
                detail = views.topology_detail(snap, reading, self.sampler.history(tid), self.window_s)
                return {**detail, "sampleIntervalMs": self.interval_ms}
            case ["topology", tid, "history"]:
                self._reading(snap, tid)
                return {**views.chart_history(self.sampler.history(tid)), "sampleIntervalMs": self.interval_ms}
            case ["topology", tid, "component", cid]:
                hist = self.sampler.history(tid)
                comp = views.component_detail(snap, self._reading(snap, tid), hist, self.window_s, cid)
                if comp is None:
                    msg = f"topology {tid!r} has no component {cid!r} on a reachable worker"
                    raise _HttpError(404, msg)
                return {**comp, "sampleIntervalMs": self.interval_ms}
        raise _HttpError(404, f"no such API: /api/v1/{'/'.join(parts)} (see the README)")

    def post_api(self, parts: list[str], body: bytes) -> Any:
        """Carry out a topology action; answers in Storm's ``topologyOperation`` shape."""
        match parts:
            case ["topology", tid, ("activate" | "deactivate") as op]:
                getattr(self.source, op)(tid)
            case ["topology", tid, "rebalance", wait]:
                op = "rebalance"
                self.source.rebalance(tid, _wait_secs(wait), _rebalance_options(body))
            case ["topology", tid, "kill", wait]:
                op = "kill"
                self.source.kill(tid, _wait_secs(wait))
            case ["topology", tid, "savepoint"]:
                taken = self.source.savepoint(tid, _savepoint_dir(body))
                return {"topologyOperation": "savepoint", "topologyId": tid, "status": "success", **taken}
            case ["topology", _tid, op, *_] if op in _ACTIONS:
                msg = f"POST /api/v1/topology/<id>/{op}" + ("/<wait-secs>" if op in ("rebalance", "kill") else "")
                raise _HttpError(400, f"expected {msg}")
            case _:
                raise _HttpError(404, f"no such action: POST /api/v1/{'/'.join(parts)}")
        self.sampler.refresh()
        return {"topologyOperation": op, "topologyId": tid, "status": "success"}

    # ------------------------------------------------------------------ HTTP
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        ui = self

        class Handler(JsonRequestHandler):
            server_version = "spark-storm-ui"

            def _api(self, call: Callable[[list[str]], Any]) -> None:
                path = urlsplit(self.path).path
                parts = [unquote(p) for p in path[len("/api/v1/") :].split("/") if p]
                try:
                    self.send_json(200, call(parts))
                except _HttpError as exc:
                    self.send_json_error(exc.status, str(exc))
                except UnknownTopologyError as exc:
                    self.send_json_error(404, str(exc))
                except ConfigError as exc:  # an option the source cannot use (numWorkers 0)
                    self.send_json_error(400, str(exc))
                except ActionNotSupportedError as exc:
                    self.send_json_error(501, str(exc))
                except TopologyActionError as exc:
                    self.send_json_error(502, str(exc))
                except StormError as exc:
                    logger.error("%s %s failed: %s", self.command, self.path, exc)
                    self.send_json_error(500, str(exc))

            def do_GET(self) -> None:
                path = urlsplit(self.path).path
                if path.startswith("/api/v1/"):
                    self._api(ui.get_api)
                elif path in _PAGES:
                    self._static(_PAGES[path])
                elif path.startswith("/static/"):
                    self._static(path[len("/static/") :])
                else:
                    self.send_body(404, b"not found; the UI is at /\n", "text/plain")

            def _static(self, rel: str) -> None:
                target = (STATIC_DIR / unquote(rel)).resolve()
                if STATIC_DIR not in target.parents or not target.is_file():
                    hint = " (run scripts/fetch-ui-assets for the charts)" if "/vendor/" in str(target) else ""
                    self.send_body(404, f"no such file: {rel}{hint}\n".encode(), "text/plain")
                    return
                ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
                if ctype.startswith("text/") or ctype.endswith("javascript"):
                    ctype += "; charset=utf-8"
                self.send_body(200, target.read_bytes(), ctype)

            def do_POST(self) -> None:
                body = self.read_body()
                if not urlsplit(self.path).path.startswith("/api/v1/"):
                    self.send_json_error(405, "POST only under /api/v1/")
                    return
                if self.refuse_cross_origin():
                    return
                self._api(lambda parts: ui.post_api(parts, body))

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("ui %s: %s", self.address_string(), format % args)

        return Handler


def _rebalance_options(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        data = json.loads(body)
    except ValueError as exc:
        msg = f'rebalance body must be JSON like {{"rebalanceOptions": {{"numWorkers": 2}}}}: {exc}'
        raise _HttpError(400, msg) from exc
    options = data.get("rebalanceOptions", {}) if isinstance(data, dict) else None
    if not isinstance(options, dict):
        raise _HttpError(400, '"rebalanceOptions" must be a JSON object')
    return options
