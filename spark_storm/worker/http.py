"""The worker's HTTP endpoint: Prometheus metrics, health, activate/deactivate.

``GET /metrics`` (Prometheus text format), ``GET /health`` (JSON), ``POST /activate``,
``POST /deactivate``.  Binds ``topology.worker.metrics.host`` (loopback by default).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_storm.worker.worker import Worker

__all__ = ["prometheus_text", "start_metrics_server"]


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(m: dict[str, Any]) -> str:
    """Render :meth:`Worker.metrics` in the Prometheus exposition format."""
    lines: list[str] = []
    seen: set[str] = set()
    w = _label(m["worker"])
    topo = _label(m["topology"])

    def metric(name: str, kind: str, help_text: str, labels: dict[str, object], value: float) -> None:
        full = f"spark_storm_{name}"
        if full not in seen:
            seen.add(full)
            lines.append(f"# HELP {full} {help_text}")
            lines.append(f"# TYPE {full} {kind}")
        lab = ",".join(f'{k}="{_label(v)}"' for k, v in {"topology": topo, "worker": w, **labels}.items())
        lines.append(f"{full}{{{lab}}} {value}")

    metric("worker_active", "gauge", "1 when executors are active", {}, 1 if m["active"] else 0)
    for key, value in m["counters"].items():
        metric(f"worker_{key}_total", "counter", f"worker counter {key}", {}, value)
    metric(
        "worker_backpressure_tasks",
        "gauge",
        "local tasks reported backpressured",
        {},
        len(m["backpressure_tasks"]),
    )
    metric("worker_held_messages", "gauge", "messages held for backpressured remote tasks", {}, m["held"])
    for key in ("received", "duplicates", "protocol_errors", "auth_failures", "callback_errors", "pending"):
        if key in m["server"]:
            metric(
                f"server_{key}",
                "gauge" if key == "pending" else "counter",
                f"server {key}",
                {},
                m["server"][key],
            )
    for dest, c in m["connections"].items():
        for key in ("sent", "lost", "pending", "reconnects", "resent"):
            if key in c:
                metric(
                    f"connection_{key}",
                    "gauge" if key == "pending" else "counter",
                    f"client connection {key}",
                    {"dest": dest},
                    c[key],
                )
        metric(
            "connection_ready",
            "gauge",
            "1 when the connection is ready",
            {"dest": dest},
            1 if c.get("status") == "ready" else 0,
        )
    queues = [("transfer", m["transfer_queue"])] + [(e, x["queue"]) for e, x in m["executors"].items()]
    for name, q in queues:
        for key in ("capacity", "population", "overflow", "arrival_rate"):
            metric(f"queue_{key}", "gauge", f"queue {key}", {"queue": name}, q[key])
    for ex in m["executors"].values():
        for task, st in ex["tasks"].items():
            labels = {"component": ex["component"], "task": task}
            for key in ("executed", "emitted", "acked", "failed", "errors"):
                metric(f"bolt_{key}_total", "counter", f"bolt {key}", labels, st[key])
            metric("bolt_latency_ms", "gauge", "mean execute latency in ms", labels, st["latency_ms"])
    return "\n".join(lines) + "\n"


def start_metrics_server(worker: Worker, host: str, port: int) -> tuple[ThreadingHTTPServer, int]:
    """Serve the endpoint on a daemon thread; return the server and its port."""

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, body: str, ctype: str) -> None:
            data = body.encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._reply(200, prometheus_text(worker.metrics()), "text/plain; version=0.0.4")
            elif self.path == "/health":
                self._reply(200, json.dumps(worker.metrics(), default=str), "application/json")
            else:
                self._reply(404, "try /metrics or /health\n", "text/plain")

        def do_POST(self) -> None:
            if self.path == "/activate":
                worker.activate()
                self._reply(200, "active\n", "text/plain")
            elif self.path == "/deactivate":
                worker.deactivate()
                self._reply(200, "inactive\n", "text/plain")
            else:
                self._reply(404, "POST /activate or /deactivate\n", "text/plain")

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="spark-storm-metrics-http", daemon=True).start()
    return server, server.server_address[1]
