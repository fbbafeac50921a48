"""Reads the cluster once per ``ui.sample.interval.ms`` and keeps the last minutes of counters.

One thread asks the :class:`~spark_storm.ui.source.ClusterSource` for the cluster state and
fetches every live worker's ``GET /health`` in parallel.  The REST API answers from the
latest reading (every browser and script sees the same numbers, and the workers are read
once per interval however many pages are open); rates, capacity and the charts come from
the per-executor counters kept for ``ui.history.secs``.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from spark_storm.errors import ReportFormatError
from spark_storm.reports import TaskMetrics, WorkerMetrics, parse_worker_metrics
from spark_storm.ui.source import ClusterSource, ClusterView, TopologyRef, WorkerRef

__all__ = ["ExecutorCounts", "Sample", "Sampler", "Snapshot", "TopologyReading", "WorkerReading", "busy_ms"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerReading:
    """A worker and its ``/health`` (None with ``error`` set when it could not be read)."""

    ref: WorkerRef
    health: WorkerMetrics | None
    error: str | None = None


@dataclass(frozen=True)
class TopologyReading:
    """A topology and the readings of its workers."""

    ref: TopologyRef
    workers: tuple[WorkerReading, ...]


@dataclass(frozen=True)
class Snapshot:
    """The cluster at ``time`` (wall clock, seconds)."""

    time: float
    state: ClusterView
    topologies: Mapping[str, TopologyReading]


@dataclass(frozen=True)
class ExecutorCounts:
    """An executor's counters summed over its tasks; ``busy_ms`` = time spent in execute."""

    component: str
    executed: int
    emitted: int
    acked: int
    failed: int
    busy_ms: float


#: (worker id, executor id) -> counters
Sample = tuple[float, Mapping[tuple[str, str], ExecutorCounts]]


def busy_ms(task: TaskMetrics) -> float:
    """Milliseconds a task spent executing: the worker's ``busy_s``, else executed x mean latency."""
    busy = task.get("busy_s")
    if isinstance(busy, int | float):
        return float(busy) * 1000
    return float(task.get("executed", 0)) * float(task.get("latency_ms", 0.0))


def executor_counts(health: WorkerMetrics) -> dict[str, ExecutorCounts]:
    """Sum a worker's ``/health`` task counters per executor."""
    out = {}
    for name, ex in (health.get("executors") or {}).items():
        tasks = list((ex.get("tasks") or {}).values())
        out[name] = ExecutorCounts(
            component=str(ex.get("component", "?")),
            executed=sum(int(t.get("executed", 0)) for t in tasks),
            emitted=sum(int(t.get("emitted", 0)) for t in tasks),
            acked=sum(int(t.get("acked", 0)) for t in tasks),
            failed=sum(int(t.get("failed", 0)) for t in tasks),
            busy_ms=sum(busy_ms(t) for t in tasks),
        )
    return out


@dataclass
class _History:
    samples: deque[Sample] = field(default_factory=deque)


class Sampler:
    """Poll a cluster source on a daemon thread.

    Parameters
    ----------
    source : ClusterSource
        Where topologies and workers are found.
    interval_s : float
        Seconds between readings (``ui.sample.interval.ms``).
    history_s : float
        How long counters are kept for rates and charts (``ui.history.secs``).
    http_timeout_s : float
        Timeout of one ``/health`` request (``ui.http.timeout.ms``).
    """

    def __init__(self, source: ClusterSource, interval_s: float, history_s: float, http_timeout_s: float) -> None:
        self.source = source
        self.interval_s = interval_s
        self.history_s = history_s
        self.http_timeout_s = http_timeout_s
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._latest: Snapshot | None = None
        self._history: dict[str, _History] = {}
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="spark-storm-ui-health")
        self._thread: threading.Thread | None = None

    def start(self) -> Sampler:
        """Take a first reading, then keep reading on a daemon thread."""
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="spark-storm-ui-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (waits at most one interval plus one request timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + self.http_timeout_s + 5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.refresh()
            except Exception:  # a bad reading must not end the UI's sampling; next interval retries
                logger.exception("reading the cluster failed")

    def _read_worker(self, ref: WorkerRef) -> WorkerReading:
        if not ref.alive:
            return WorkerReading(ref, None, f"worker is {ref.status}")
        if ref.endpoint is None:
            why = "it is starting, or topology.worker.metrics.port is -1"
            return WorkerReading(ref, None, f"worker reports no HTTP endpoint ({why})")
        url = f"{ref.endpoint}/health"
        try:
            with urllib.request.urlopen(url, timeout=self.http_timeout_s) as r:
                data = r.read()
        except (OSError, urllib.error.URLError) as exc:
            return WorkerReading(ref, None, f"GET {url} failed: {exc}")
        try:
            return WorkerReading(ref, parse_worker_metrics(data, f"GET {url}"))
        except ReportFormatError as exc:
            return WorkerReading(ref, None, str(exc))

    def refresh(self) -> Snapshot:
        """Read the cluster now and record the counters; returns the new snapshot."""
        with self._refresh_lock:
            state = self.source.state()
            refs = [w for t in state.topologies for w in t.workers]
            readings = dict(zip((w.id for w in refs), self._pool.map(self._read_worker, refs), strict=True))
            now = time.time()
            topologies = {t.id: TopologyReading(t, tuple(readings[w.id] for w in t.workers)) for t in state.topologies}
            snap = Snapshot(now, state, topologies)
            with self._lock:
                self._latest = snap
                for tid, reading in topologies.items():
                    counts = {
                        (w.ref.id, name): c
                        for w in reading.workers
                        if w.health is not None
                        for name, c in executor_counts(w.health).items()
                    }
                    hist = self._history.setdefault(tid, _History()).samples
                    hist.append((now, counts))
                    while hist and hist[0][0] < now - self.history_s:
                        hist.popleft()
                for gone in set(self._history) - set(topologies):
                    del self._history[gone]
            return snap

    def snapshot(self) -> Snapshot:
        """Return the latest reading (reading now if there is none yet)."""
        with self._lock:
            latest = self._latest
        return latest if latest is not None else self.refresh()

    def history(self, topology_id: str) -> list[Sample]:
        """Return the kept samples of a topology, oldest first."""
        with self._lock:
            hist = self._history.get(topology_id)
            return list(hist.samples) if hist else []
