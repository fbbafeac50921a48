"""What a worker reports about itself, read by other processes: its heartbeat and its metrics.

Two records cross process boundaries, so they are typed here, below every layer that
writes or reads them (the worker writes them; LocalCluster, the supervisor, nimbus, the
Spark driver, the UI and the command line read them):

* :class:`WorkerHeartbeat` — written every ``worker.heartbeat.frequency.secs`` to the
  heartbeat file ``<topology>-<port>.json`` in ``worker.heartbeat.dir``
  (:class:`HeartbeatFileWriter`, :func:`read_heartbeat_file`) and, in cluster mode, to the
  znode ``/heartbeats/<topology>/<host:port>`` in ZooKeeper;
* :class:`WorkerMetrics` — what :meth:`Worker.metrics <spark_storm.worker.worker.Worker.metrics>`
  returns and ``GET /health`` serves as JSON (:func:`parse_worker_metrics`).

Readers take these records from files, znodes and sockets, so the parse functions check
the shape and raise :class:`~spark_storm.errors.ReportFormatError` (a ``ValueError``)
naming where the record came from and what is wrong.  A worker of another version may
leave keys of :class:`WorkerMetrics` out; the UI reads those with ``.get`` and shows
what is missing as unknown.

This module imports nothing from the layers above it (only ``spark_storm.errors``).
"""

from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, NotRequired, TypedDict, cast

from spark_storm.errors import ReportFormatError, SavepointError

__all__ = [
    "HEARTBEAT_FILE_NAME",
    "AckerMetrics",
    "CheckpointMetrics",
    "ComponentInfo",
    "ErrorReport",
    "ExecutorMetrics",
    "HeartbeatFileWriter",
    "QueueMetrics",
    "StateMetrics",
    "TaskMetrics",
    "WindowMetrics",
    "WorkerHeartbeat",
    "WorkerMetrics",
    "WriterCounts",
    "WriterMetrics",
    "heartbeat_file_name",
    "metrics_endpoint",
    "parse_heartbeat",
    "parse_worker_metrics",
    "read_heartbeat_file",
    "request_savepoint",
]

logger = logging.getLogger(__name__)

#: A heartbeat file's name, ``<topology>-<port>.json`` (topology names may hold ``-`` too).
HEARTBEAT_FILE_NAME: Final = re.compile(r"^(?P<topology>.+)-(?P<port>\d{1,5})\.json$")
_HEARTBEAT_MAX_BYTES: Final = 1 << 20  # the temp dir holds other programs' JSON too
_WILDCARD_HOSTS: Final = frozenset({"", "0.0.0.0", "::", "[::]"})


# ---------------------------------------------------------------------- the heartbeat
class WorkerHeartbeat(TypedDict):
    """A worker's heartbeat record (``Worker.heartbeat_record()``).

    ``status`` is ``running``, ``inactive`` (deactivated) or ``stopped`` (its last record,
    after the ordered shutdown).  ``metrics_port`` / ``metrics_host`` name its HTTP endpoint
    (None when it serves none).  ``assignment_version`` is the version of
    ``/assignments/<topology>`` it runs: only in cluster mode.
    """

    topology: str
    worker: str  # host:port, the worker's slot
    pid: int
    status: str
    time: float  # wall clock of the writer's host, seconds
    uptime_s: float
    executors: list[str]
    received: int
    metrics_port: int | None
    metrics_host: str | None
    assignment_version: NotRequired[int]


#: key -> (JSON types accepted, may be null, required)
_HEARTBEAT_KEYS: Final[Mapping[str, tuple[tuple[type, ...], bool, bool]]] = {
    "topology": ((str,), False, True),
    "worker": ((str,), False, True),
    "pid": ((int,), False, True),
    "status": ((str,), False, True),
    "time": ((int, float), False, True),
    "uptime_s": ((int, float), False, True),
    "executors": ((list,), False, True),
    "received": ((int,), False, True),
    "metrics_port": ((int,), True, True),
    "metrics_host": ((str,), True, True),
    "assignment_version": ((int,), False, False),
}


def _json_object(data: bytes | str, origin: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError both
        msg = f"{origin} is not a {what}: not JSON ({exc})"
        raise ReportFormatError(msg) from exc
    if not isinstance(value, dict):
        msg = f"{origin} is not a {what}: it holds a JSON {type(value).__name__}, not an object"
        raise ReportFormatError(msg)
    return value


def parse_heartbeat(data: bytes | str, origin: str) -> WorkerHeartbeat:
    """Read a heartbeat record from its JSON (a file's or a znode's content).

    Parameters
    ----------
    data : bytes or str
        The JSON text.
    origin : str
        Where it came from (a path, a znode), for the error message.

    Raises
    ------
    ReportFormatError
        Not JSON, not an object, or a key missing or of the wrong type (the message names it).
    """
    raw = _json_object(data, origin, "worker heartbeat")
    for key, (types, nullable, required) in _HEARTBEAT_KEYS.items():
        if key not in raw:
            if required:
                msg = f"{origin} is not a worker heartbeat: it has no {key!r}"
                raise ReportFormatError(msg)
            continue
        value = raw[key]
        if value is None and nullable:
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            want = " or ".join(t.__name__ for t in types)
            msg = f"{origin} is not a worker heartbeat: {key!r} is {value!r}, not {want}"
            raise ReportFormatError(msg)
    host, sep, port = raw["worker"].rpartition(":")
    if not sep or not host or not port.isdigit():
        msg = f"{origin} is not a worker heartbeat: 'worker' is {raw['worker']!r}, not host:port"
        raise ReportFormatError(msg)
    return cast(WorkerHeartbeat, raw)


def metrics_endpoint(record: WorkerHeartbeat, slot_host: str) -> tuple[str, int] | None:
    """Return ``(host, port)`` of the worker's HTTP endpoint, or None when it serves none.

    The host is the worker's ``metrics_host``, or ``slot_host`` (the host of its slot) when
    it names none or bound a wildcard address.
    """
    port = record.get("metrics_port")
    if port is None or isinstance(port, bool) or not isinstance(port, int) or port <= 0:
        return None
    host = record.get("metrics_host")
    return (host if isinstance(host, str) and host not in _WILDCARD_HOSTS else slot_host), port


def heartbeat_file_name(topology: str, port: int) -> str:
    """Return the name of a worker's heartbeat file in ``worker.heartbeat.dir``: ``<topology>-<port>.json``."""
    return f"{topology}-{port}.json"


def read_heartbeat_file(path: Path) -> WorkerHeartbeat | None:
    """Return the heartbeat in ``path``, or None when there is none or it is not a heartbeat.

    None covers a file that is missing, unreadable, larger than any heartbeat, or not of
    the shape a worker writes (another program's JSON in a shared temp dir): the caller
    has no worker there.
    """
    try:
        if path.stat().st_size > _HEARTBEAT_MAX_BYTES:
            return None
        return parse_heartbeat(path.read_bytes(), str(path))
    except (OSError, ReportFormatError):
        return None


class HeartbeatFileWriter:
    """Writes a worker's heartbeat file, replacing it atomically (readers never see half a record).

    Parameters
    ----------
    directory : Path
        ``worker.heartbeat.dir``.
    topology : str
    port : int
        The worker's slot port; the file is :func:`heartbeat_file_name` of both.
    """

    def __init__(self, directory: Path, topology: str, port: int) -> None:
        self.path = directory / heartbeat_file_name(topology, port)

    def write(self, record: WorkerHeartbeat) -> None:
        """Replace the file with ``record``; a failure is logged (the next beat tries again)."""
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(record), encoding="utf-8")
            tmp.replace(self.path)
        except OSError as exc:
            logger.warning("cannot write heartbeat %s: %s", self.path, exc)


# ---------------------------------------------------------------------- the metrics
class TaskMetrics(TypedDict):
    """One task's counters (``TaskStats.snapshot()``); latencies in ms, rate in tuples/s."""

    executed: int
    batches: int
    emitted: int
    acked: int
    failed: int
    errors: int
    ticks: int
    rate: float
    latency_ms: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    latency_samples: int
    latency_buckets: list[list[float]]  # [upper bound in s, tuples], non-empty buckets of the window
    latency_total_buckets: list[list[float]]  # the same since the worker started (/metrics)
    latency_total_sum_s: float
    busy_s: float
    capacity: float


class QueueMetrics(TypedDict):
    """A bounded queue's state (an executor's receive queue, the worker's transfer queue)."""

    capacity: int
    population: int
    overflow: int
    published: int
    consumed: int
    publishes: int
    wakeups: int
    arrival_rate: float
    backpressure: bool


class WindowMetrics(TypedDict):
    """A windowed task (or executor, summed): its spec, watermark and counters."""

    spec: str
    watermark_ms: int | None  # the lowest over the executor's tasks; None before every input sent
    windows: int  # windows fired (execute_window calls)
    late: int  # tuples older than the watermark (sent to the late stream, or dropped)
    bad_times: int  # tuples whose event time was missing or not a time (reported, dropped)
    held: int  # tuples (or accumulators, or sessions) in open windows


class StateMetrics(TypedDict):
    """A stateful executor's state (docs/design/state.md): its keys, checkpoints, restores and rollbacks."""

    stateful: bool
    keys: int
    last_checkpoint_bytes: int
    checkpoint_p50_ms: float | None
    checkpoint_p99_ms: float | None
    checkpoint_buckets: list[list[float]]  # [upper bound in s, checkpoints], since the executor started
    checkpoints: int
    restores: int
    rollbacks: int
    epoch: int


class ExecutorMetrics(TypedDict):
    """An executor: its component, receive queue, capacity (busy fraction) and tasks by id."""

    component: str
    source: bool
    kind: str
    queue: QueueMetrics
    capacity: float
    tasks: dict[str, TaskMetrics]  # task id as text: the same in process and in JSON
    state: StateMetrics | None  # stateful executors only
    windows: WindowMetrics | None  # windowed executors only


class CheckpointMetrics(TypedDict):
    """A worker's view of the checkpoint protocol (docs/design/state.md)."""

    worker: str
    stateful: bool
    epoch: int
    committed: int
    generation: int
    dirty: bool
    reasons: list[str]
    replaying: bool
    last_group_age_s: float | None
    rollbacks: int
    replayed_records: int
    committed_epochs: int
    logged_groups: int
    interval_rounds: int
    interval_stood_aside: int
    provider: str
    last_commit_at: float | None


class AckerMetrics(TypedDict):
    """The worker's acker: tuple trees pending and how the others ended."""

    pending: int
    completed: int
    failed: int
    timed_out: int
    failed_on_peer_loss: int


class ErrorReport(TypedDict):
    """An exception a bolt raised (the newest 50 are kept)."""

    time: float
    worker: str
    component: str
    task: int
    error: str


class WriterCounts(TypedDict):
    """What a worker counted of one Spark query's writers."""

    query_id: str
    last_batch_id: int
    rows: int
    groups: int
    replays: int
    failed: int


class WriterMetrics(WriterCounts):
    """A Spark query's writers as ``/health`` reports them: the counts and the ack latency."""

    ack_latency_p50_ms: float | None
    ack_latency_p99_ms: float | None


class ComponentInfo(TypedDict):
    """A component of the topology as the worker runs it."""

    source: bool
    spout: bool
    bolt: str
    parallelism: int
    tasks: list[int]


class WorkerMetrics(TypedDict):
    """Everything countable about a worker (``Worker.metrics()``, ``GET /health``).

    ``server`` and ``connections`` are the transport's own metrics (their keys depend on
    the transport).  Readers of ``/health`` may meet a worker of another version: they read
    every key but ``worker``, ``topology`` and ``executors`` with ``.get``.
    """

    worker: str
    topology: str
    host: str
    port: int
    pid: int
    active: bool
    uptime_s: float
    rss_bytes: int | None
    counters: dict[str, int]
    backpressure_tasks: list[int]
    acker: AckerMetrics
    held: int
    server: dict[str, Any]
    connections: dict[str, dict[str, Any]]
    transfer_queue: QueueMetrics
    executors: dict[str, ExecutorMetrics]
    errors: list[ErrorReport]
    writers: list[WriterMetrics]
    components: dict[str, ComponentInfo]
    checkpoint: CheckpointMetrics | None  # topologies with a stateful component only


def parse_worker_metrics(data: bytes | str, origin: str) -> WorkerMetrics:
    """Read a worker's metrics from the JSON ``GET /health`` returned.

    Checks what every reader relies on: a JSON object naming its ``worker`` and
    ``topology``, with an object of ``executors``.

    Raises
    ------
    ReportFormatError
        Not JSON, not an object, or one of those keys missing or of the wrong type.
    """
    raw = _json_object(data, origin, "worker's /health")
    for key, kind in (("worker", str), ("topology", str), ("executors", dict)):
        if not isinstance(raw.get(key), kind):
            msg = f"{origin} is not a worker's /health: {key!r} is {raw.get(key)!r}, not a {kind.__name__}"
            raise ReportFormatError(msg)
    return cast(WorkerMetrics, raw)


def read_worker_metrics(host: str, port: int, timeout: float) -> WorkerMetrics:
    """``GET http://host:port/health`` and read it (the one place a worker's ``/health`` is fetched).

    Raises
    ------
    OSError
        The endpoint did not answer within ``timeout`` seconds (``urllib.error.URLError`` is one).
    ReportFormatError
        The answer is not a worker's ``/health``.
    """
    url = f"http://{host}:{port}/health"
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return parse_worker_metrics(r.read(), f"GET {url}")


def request_savepoint(
    host: str, port: int, parent: str, *, commit_first: bool = False, hold: bool = False, timeout: float = 120.0
) -> dict[str, Any]:
    """``POST http://host:port/savepoint``: the worker there coordinates a savepoint of its topology under ``parent``.

    Returns the worker's answer: ``path``, ``epoch``, ``id``, ``components`` ({id: tasks}), ``batches``.

    Raises
    ------
    SavepointError
        The worker refused or failed (its reason), or did not answer within ``timeout`` seconds.
    """
    url = f"http://{host}:{port}/savepoint"
    body = json.dumps({"dir": parent, "commit_first": commit_first, "hold": hold}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            answer = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        try:
            reason = json.loads(exc.read()).get("errorMessage", str(exc))
        except ValueError:
            reason = str(exc)
        msg = f"savepoint refused by the worker at {host}:{port}: {reason}"
        raise SavepointError(msg) from exc
    except (OSError, ValueError) as exc:
        msg = f"savepoint: the worker at {host}:{port} did not answer POST /savepoint within {timeout:.0f}s ({exc})"
        raise SavepointError(msg) from exc
    if not isinstance(answer, dict) or "path" not in answer:
        msg = f"savepoint: POST {url} answered {answer!r}, not a savepoint"
        raise SavepointError(msg)
    return answer
