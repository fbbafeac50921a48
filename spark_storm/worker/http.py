"""The worker's HTTP endpoint: Prometheus metrics, health, activate/deactivate.

``GET /metrics`` (Prometheus text format, written by ``prometheus_client``), ``GET /health``
(JSON), ``POST /activate``, ``POST /deactivate`` (JSON ``{"active": ...}``), ``POST /savepoint``
(JSON ``{"dir": ..., "commit_first": false, "hold": false}``: a savepoint of the whole topology,
coordinated by this worker; the answer names its path and epoch).  Binds
``topology.worker.metrics.host`` (loopback by default).  Replies follow the package's one
HTTP policy (:mod:`spark_storm.http_policy`): a POST from a web page of another origin is
refused (403), so a page in the user's browser cannot pause a loopback worker.

Execute latency is a Prometheus histogram per task
(``spark_storm_bolt_execute_latency_seconds``: ``_bucket{le=...}``, ``_sum``, ``_count``,
one bucket per doubling from 1 µs), counting tuples, so ``_count`` is the task's
``executed`` and a component's percentiles are ``histogram_quantile`` over the sum of its
tasks' buckets; percentile gauges could not be added up.

The metrics come from one custom collector that turns :meth:`Worker.metrics` into metric
families at scrape time, so each family is written once with all its samples (the
exposition format forbids interleaving families) and the names and escaping are
``prometheus_client``'s, not ours.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from spark_storm.errors import StormError
from spark_storm.http_policy import JsonRequestHandler
from spark_storm.latency import PROMETHEUS_BOUNDS_S, cumulative_counts
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

    def savepoint(self, parent: str, commit_first: bool = False, hold: bool = False) -> dict[str, Any]:
        """Write a savepoint of the topology under ``parent``; return its path and epoch."""


_SERVER_COUNTERS = ("received", "duplicates", "protocol_errors", "auth_failures", "callback_errors")
_CONNECTION_COUNTERS = ("sent", "lost", "reconnects", "resent")
_QUEUE_GAUGES = ("capacity", "population", "overflow", "arrival_rate")
_TASK_COUNTERS = ("executed", "batches", "emitted", "acked", "failed", "errors")
# Optional per-task and per-executor keys: exported when the worker reports them.
_TASK_GAUGES = {
    "latency_ms": "mean execute latency in ms",
    "rate": "tuples executed per second, now",
}
_LATENCY_DOC = "execute latency in seconds, counting tuples (a sampled execute stands for its batch)"


class _Families:
    """Metric families by name, created on first use; every sample carries (topology, worker)."""

    def __init__(self, topology: str, worker: str) -> None:
        self._base = (topology, worker)
        self._families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        self._histograms: dict[str, HistogramMetricFamily] = {}

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

    def add_histogram(self, name: str, doc: str, labels: Mapping[str, object], buckets: object, sum_s: object) -> None:
        """Add one histogram from reported ``[upper bound, count]`` pairs (per bucket, not cumulative)."""
        if not isinstance(buckets, list) or not isinstance(sum_s, int | float):
            return  # a worker that reports no histogram has no sample here
        pairs: list[Sequence[float]] = [b for b in buckets if isinstance(b, list | tuple) and len(b) == 2]
        full = f"spark_storm_{name}"
        family = self._histograms.get(full)
        if family is None:
            family = HistogramMetricFamily(full, doc, labels=["topology", "worker", *labels])
            self._histograms[full] = family
        total = float(sum(c for _, c in pairs))
        cumulative = [(repr(le), n) for le, n in cumulative_counts(pairs, PROMETHEUS_BOUNDS_S)]
        family.add_metric([*self._base, *(str(v) for v in labels.values())], [*cumulative, ("+Inf", total)], sum_s)

    def __iter__(self) -> Iterator[Metric]:
        yield from self._families.values()
        yield from self._histograms.values()


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
            out.add_histogram(
                "bolt_execute_latency_seconds",
                _LATENCY_DOC,
                labels,
                st.get("latency_total_buckets"),
                st.get("latency_total_sum_s"),
            )
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

    class Handler(JsonRequestHandler):
        server_version = "spark-storm-worker"
        json_default = str

        def do_GET(self) -> None:
            if self.path == "/metrics":
                # 0.0.4: what generate_latest writes, and what every Prometheus version reads
                self.send_body(200, generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4)
            elif self.path == "/health":
                self.send_json(200, worker.metrics())
            else:
                self.send_json_error(404, f"no such path: GET {self.path}; try /metrics or /health")

        def do_POST(self) -> None:
            if self.path not in ("/activate", "/deactivate", "/savepoint"):
                self.send_json_error(
                    404, f"no such action: POST {self.path}; POST /activate, /deactivate or /savepoint"
                )
                return
            if self.refuse_cross_origin():
                return
            if self.path == "/savepoint":
                self._savepoint()
                return
            if self.path == "/activate":
                worker.activate()
            else:
                worker.deactivate()
            self.send_json(200, {"active": self.path == "/activate"})

        def _savepoint(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                parent = body["dir"]
                if not isinstance(parent, str) or not parent:
                    raise TypeError(parent)
            except (ValueError, KeyError, TypeError) as exc:
                self.send_json_error(400, f'POST /savepoint wants JSON {{"dir": "/path"}} ({exc!r})')
                return
            try:
                answer = worker.savepoint(parent, bool(body.get("commit_first")), bool(body.get("hold")))
            except StormError as exc:
                self.send_json_error(409, str(exc))
                return
            self.send_json(200, answer)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="spark-storm-metrics-http", daemon=True).start()
    return server, server.server_address[1]
