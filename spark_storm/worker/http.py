"""The worker's HTTP endpoint: Prometheus metrics, health, activate/deactivate.

``GET /metrics`` (Prometheus text format, written by ``prometheus_client``), ``GET /health``
(JSON), ``POST /activate``, ``POST /deactivate``.  Binds ``topology.worker.metrics.host``
(loopback by default).

The metrics come from one custom collector that turns :meth:`Worker.metrics` into metric
families at scrape time, so each family is written once with all its samples (the
exposition format forbids interleaving families) and the names and escaping are
``prometheus_client``'s, not ours.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from spark_storm.reports import WorkerMetrics

__all__ = ["Controllable", "WorkerCollector", "prometheus_text", "start_metrics_server"]


class Controllable(Protocol):
    """What the endpoint needs from a worker: its metrics, and activate/deactivate."""

    def metrics(self) -> WorkerMetrics:
        """Everything countable, as :meth:`Worker.metrics` returns it."""

    def activate(self) -> None:
        """Let executors consume."""

    def deactivate(self) -> None:
        """Pause executors."""


_SERVER_COUNTERS = ("received", "duplicates", "protocol_errors", "auth_failures", "callback_errors")
_CONNECTION_COUNTERS = ("sent", "lost", "reconnects", "resent")
_QUEUE_GAUGES = ("capacity", "population", "overflow", "arrival_rate")
_TASK_COUNTERS = ("executed", "batches", "emitted", "acked", "failed", "errors")
# Optional per-task and per-executor keys: exported when the worker reports them.
_TASK_GAUGES = {
    "latency_ms": "mean execute latency in ms",
    "latency_p50_ms": "median execute latency in ms",
    "latency_p99_ms": "99th percentile execute latency in ms",
    "rate": "tuples executed per second, now",
}


class _Families:
    """Metric families by name, created on first use; every sample carries (topology, worker)."""

    def __init__(self, topology: str, worker: str) -> None:
        self._base = (topology, worker)
        self._families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(self, kind: str, name: str, doc: str, labels: Mapping[str, object], value: object) -> None:
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int | float):
            return  # a key the worker reports as null or text is not a sample
        full = f"spark_storm_{name}"
        family = self._families.get(full)
        if family is None:
            label_names = ["topology", "worker", *labels]
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = cls(full, doc, labels=label_names)
            self._families[full] = family
        family.add_metric([*self._base, *(str(v) for v in labels.values())], float(value))

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def _families(m: Mapping[str, Any]) -> _Families:
    out = _Families(str(m["topology"]), str(m["worker"]))
    out.add("gauge", "worker_active", "1 when executors are active", {}, 1 if m["active"] else 0)
    for key, value in m["counters"].items():
        out.add("counter", f"worker_{key}", f"worker counter {key}", {}, value)
    out.add(
        "gauge", "worker_backpressure_tasks", "local tasks reported backpressured", {}, len(m["backpressure_tasks"])
    )
    out.add("gauge", "worker_held_messages", "messages held for backpressured remote tasks", {}, m["held"])
    if "uptime_s" in m:
        out.add("gauge", "worker_uptime_seconds", "seconds since the worker started", {}, m["uptime_s"])
    if "rss_bytes" in m:
        out.add("gauge", "worker_rss_bytes", "resident memory of the worker process", {}, m["rss_bytes"])
    acker = m.get("acker", {})
    if "pending" in acker:
        out.add("gauge", "acker_pending", "tuple trees the acker tracks", {}, acker["pending"])
    for key in ("completed", "failed"):
        if key in acker:
            out.add("counter", f"acker_{key}", f"tuple trees {key}", {}, acker[key])
    server = m["server"]
    for key in _SERVER_COUNTERS:
        if key in server:
            out.add("counter", f"server_{key}", f"server {key}", {}, server[key])
    if "pending" in server:
        out.add("gauge", "server_pending", "messages received, not yet handed to the worker", {}, server["pending"])
    for dest, c in m["connections"].items():
        labels = {"dest": dest}
        for key in _CONNECTION_COUNTERS:
            if key in c:
                out.add("counter", f"connection_{key}", f"client connection {key}", labels, c[key])
        if "pending" in c:
            out.add("gauge", "connection_pending", "messages sent, not yet acknowledged", labels, c["pending"])
        ready = 1 if c.get("status") == "ready" else 0
        out.add("gauge", "connection_ready", "1 when the connection is ready", labels, ready)
    queues = [("transfer", m["transfer_queue"])] + [(e, x["queue"]) for e, x in m["executors"].items()]
    for name, q in queues:
        for key in _QUEUE_GAUGES:
            if key in q:
                out.add("gauge", f"queue_{key}", f"queue {key}", {"queue": name}, q[key])
        if "backpressure" in q:
            out.add(
                "gauge", "queue_backpressure", "1 while above the high watermark", {"queue": name}, q["backpressure"]
            )
    for name, ex in m["executors"].items():
        if "capacity" in ex:
            labels = {"component": ex["component"], "executor": name}
            out.add(
                "gauge",
                "executor_capacity",
                "executed x mean latency / window (Storm's capacity)",
                labels,
                ex["capacity"],
            )
        for task, st in ex["tasks"].items():
            labels = {"component": ex["component"], "task": task}
            for key in _TASK_COUNTERS:
                if key in st:
                    out.add("counter", f"bolt_{key}", f"bolt {key}", labels, st[key])
            for key, doc in _TASK_GAUGES.items():
                if key in st:
                    out.add("gauge", f"bolt_{key}", doc, labels, st[key])
    return out


class WorkerCollector(Collector):
    """A ``prometheus_client`` collector reading a worker's metrics at scrape time.

    Parameters
    ----------
    metrics : callable
        Returns a :meth:`Worker.metrics`-shaped dict.
    """

    def __init__(self, metrics: Callable[[], Mapping[str, Any]]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from _families(self._metrics())


def prometheus_text(m: Mapping[str, Any]) -> str:
    """Render a :meth:`Worker.metrics` dict in the Prometheus text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(lambda: m))
    return generate_latest(registry).decode("utf-8")


def start_metrics_server(worker: Controllable, host: str, port: int) -> tuple[ThreadingHTTPServer, int]:
    """Serve the endpoint on a daemon thread; return the server and its port."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker.metrics))

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/metrics":
                # 0.0.4: what generate_latest writes, and what every Prometheus version reads
                self._reply(200, generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4)
            elif self.path == "/health":
                self._reply(200, json.dumps(worker.metrics(), default=str).encode(), "application/json")
            else:
                self._reply(404, b"try /metrics or /health\n", "text/plain")

        def do_POST(self) -> None:
            if self.path == "/activate":
                worker.activate()
                self._reply(200, b"active\n", "text/plain")
            elif self.path == "/deactivate":
                worker.deactivate()
                self._reply(200, b"inactive\n", "text/plain")
            else:
                self._reply(404, b"POST /activate or /deactivate\n", "text/plain")

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="spark-storm-metrics-http", daemon=True).start()
    return server, server.server_address[1]
