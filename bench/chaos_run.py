"""Running one bench.chaos scenario: its workers, its feed, its faults, and the checker.

bench/chaos.py draws the scenarios and reports; this module runs one (:func:`run_scenario`)
and returns its :class:`Record`.  The parts:

* :class:`ChaosCluster` — spark_storm's LocalCluster whose workers start through
  ``bench.chaos_worker`` (the switch interval) and, for the network family, inside a network
  namespace each (``ip netns exec``);
* the feeds — :class:`ClientFeed` (delivery groups keyed like Spark's, resent until
  PROCESSED, and a priority-1 :class:`~spark_storm.state.protocol.Coordinator` that commits
  each batch as the driver's ``commit(batchId)`` does) and :class:`SparkFeed`
  (``writeStream.format("storm")`` or ``foreachBatch(storm_sink(...))`` over JSON files, one
  per micro-batch, ``trigger(availableNow=True)``);
* :class:`Faults` — one thread per scheduled fault, each undone (SIGCONT, heal, window closed,
  worker restarted) when its time is up or the scenario ends;
* :class:`Sampler` — every worker's ``/health`` twice a second (rollbacks, replays, losses it
  detected), kept per process so a SIGKILL does not reset the sums;
* the checker — the committed state read from the backend's files after the workers
  stopped, compared key by key (and window by window) with the answer computed from the
  rows that were fed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import pyarrow as pa
import yaml

from bench.chaos_bolts import TYPED_FIELDS, TYPED_SCHEMA, typed_amount, typed_key, typed_rows
from bench.chaos_plan import Injection, count_injections, write_injection
from bench.chaos_transport import CONTROL_KEY
from spark_storm.cluster.local_cluster import LocalCluster
from spark_storm.codec.payloads import arrow_payload
from spark_storm.codec.serializer import pack_value
from spark_storm.errors import StormError
from spark_storm.messaging import IClient, TaskMessage
from spark_storm.messaging.wire import FAILED, PROCESSED, BatchHeader
from spark_storm.state.protocol import Coordinator
from spark_storm.topology import Slot, plan
from spark_storm.transport import make_context
from tests.support.ledger import expected, ledger_state, rows_for
from tests.support.netns import Network
from tests.support.windows import flush_rows, rows_of, spark_sessions, spark_windows, window_results

__all__ = ["Fault", "Record", "Scenario", "run_scenario"]

logger = logging.getLogger("bench.chaos")
T = TypeVar("T")

QUERY: Final = "q-chaos"
#: Worker settings of every scenario: quick reconnects, a short tuple timeout, short ordered shutdown.
OVERRIDES: Final[dict[str, Any]] = {
    "storm.messaging.tcp.min_wait_ms": 20,
    "storm.messaging.tcp.max_wait_ms": 200,
    "topology.message.timeout.secs": 15,
    "topology.worker.shutdown.timeout.ms": 5000,
}
#: The network family binds every address of its namespace (each worker has its own).
NETNS_OVERRIDES: Final[dict[str, Any]] = {
    "storm.messaging.bind.host": "0.0.0.0",
    "topology.worker.metrics.host": "0.0.0.0",
}
NETNS_PORT: Final = 6700
PASS_BOLT: Final = "spark_storm.worker.bolt:PassThroughBolt"
PASS_BATCH_BOLT: Final = "spark_storm.worker.bolt:PassThroughBatchBolt"
WINDOWS: Final = "spark_storm.examples.windows"
T0_MS: Final = 1_780_000_000_000  # tests/support/windows.py's T0
SPAN_MS: Final = 2000  # tests/support/windows.py's SPAN: a batch's event time
ROOT: Final = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class Fault:
    """One fault of a schedule, ``at`` seconds after the feed starts.

    ``kind``: kill | pause | netcut | fsync | corrupt | query_restart | rebalance.
    ``duration``: the restart delay (kill), the pause, the cut, the injection window, the
    query's time stopped.  ``mode``: netcut pair|isolate, fsync slow|fail|fail-commit,
    corrupt truncate|garbage|frame, rebalance term|kill.  ``p``: chance per operation (fsync,
    corrupt).  ``worker``/``other``: indices into the current workers (modulo their number).
    """

    kind: str
    at: float
    worker: int = 0
    other: int = 0
    duration: float = 0.0
    mode: str = ""
    p: float = 0.0

    def describe(self) -> str:
        what = {
            "kill": f"SIGKILL worker {self.worker}, restart after {self.duration:.1f}s",
            "pause": f"SIGSTOP worker {self.worker} for {self.duration:.1f}s",
            "netcut": (
                f"cut workers {self.worker}<->{self.other} for {self.duration:.1f}s"
                if self.mode == "pair"
                else f"isolate worker {self.worker} for {self.duration:.1f}s"
            ),
            "fsync": f"fsync {self.mode} p={self.p:.2f} for {self.duration:.1f}s",
            "corrupt": f"corrupt {self.mode} p={self.p:.2f} for {self.duration:.1f}s",
            "query_restart": f"stop the query, restart it after {self.duration:.1f}s",
            "rebalance": f"redeploy on another worker count ({self.mode})",
        }[self.kind]
        return f"{self.at:5.1f}s {what}"


@dataclass(frozen=True)
class Scenario:
    """Everything one scenario is, drawn from (seed, index) by bench.chaos.draw."""

    seed: int
    index: int
    topology: str  # ledger | columnar | windows | typed
    feed: str  # client | format | foreach
    workers: int
    sources: int
    mid_parallelism: int
    stateful_parallelism: int
    stateful_tasks: int
    batches: int
    rows: int
    keys: int
    pace_s: float
    window: Mapping[str, Any] | None
    window_bolt: str
    spark_millis: bool
    interval_ms: int
    switch: bool
    netns: bool
    faults: tuple[Fault, ...]

    @property
    def columnar(self) -> bool:
        return self.topology == "columnar" or self.window_bolt == "WindowCountBatch"

    @property
    def spark(self) -> bool:
        return self.feed != "client"

    def command(self) -> str:
        return f"python -m bench.chaos --seed {self.seed} --only {self.index}"


@dataclass
class Record:
    """What one scenario did and how it ended (a line of the report, a record of ``--json``)."""

    seed: int
    index: int
    topology: str
    feed: str
    workers: int
    switch: bool
    netns: bool
    planned: list[str]
    faults: dict[str, int] = field(default_factory=dict)
    injections: dict[str, int] = field(default_factory=dict)
    rollbacks: int = 0
    replays: int = 0
    replayed_groups: int = 0
    detected_losses: int = 0
    protocol_errors: int = 0
    commit_failures: int = 0
    query_failures: int = 0
    batches: int = 0
    rows: int = 0
    duration_s: float = 0.0
    verdict: str = "FAIL"
    reasons: list[str] = field(default_factory=list)
    wrong_keys: int = 0
    wrong_sample: list[str] = field(default_factory=list)
    lost_rows: int = 0
    extra_rows: int = 0
    kept: str | None = None
    command: str = ""
    log_lines: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class Aborted(Exception):
    """The scenario's deadline passed (or it is being torn down): stop feeding."""


# --------------------------------------------------------------------------------- the cluster
class ChaosCluster(LocalCluster):
    """LocalCluster whose workers run through ``bench.chaos_worker`` (and in namespaces for the network family)."""

    def __init__(
        self, topology: Path, n: int, *, work_dir: Path, switch_s: float, net: Network | None, overrides: dict[str, Any]
    ) -> None:
        super().__init__(str(topology), n, overrides=overrides, work_dir=work_dir)
        self.switch_s = switch_s
        self.net = net
        if net is not None:
            self.slots = [Slot(net.addr[f"w{i}"], NETNS_PORT + i) for i in range(n)]
            self.ports = [s.port for s in self.slots]
            self.workers_arg = ",".join(str(s) for s in self.slots)
            self.plan = plan(self.topology, self.slots)

    def host_of(self, slot: Slot) -> str:
        """The namespace host name (``w<i>``) of a slot."""
        return f"w{self.slots.index(slot)}"

    def _command(self, slot: Slot) -> list[str]:
        cmd = super()._command(slot)
        at = cmd.index("spark_storm.cli")
        cmd[at : at + 1] = ["bench.chaos_worker", repr(self.switch_s)]
        if self.net is not None:
            cmd = ["ip", "netns", "exec", self.net.ns[self.host_of(slot)], *cmd]
        return cmd

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values() if p.poll() is None]

    def hard_stop(self) -> None:
        """SIGCONT then SIGKILL every worker still running (by PID), and reap them."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def ordered_stop(self, timeout: float) -> None:
        """SIGCONT (a paused worker cannot stop), then LocalCluster's SIGTERM, SIGKILL after ``timeout``."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
        self.stop(timeout)


class Run:
    """One scenario's live parts, shared by the feed, the faults and the sampler."""

    def __init__(self, sc: Scenario, directory: Path, net: Network | None) -> None:
        self.sc = sc
        self.dir = directory
        self.state_dir = directory / "state"
        self.control = directory / "control"
        self.work = directory / "workers"
        self.topology_path = directory / "topology.yaml"
        self.net = net
        self.lock = threading.RLock()  # the cluster's processes: one fault (or the rebalance) at a time
        self.abort = threading.Event()
        self.clusters: list[ChaosCluster] = []
        self.cluster: ChaosCluster | None = None
        self.t0 = time.monotonic()
        self.step = "starting the workers"
        self._requests: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        for d in (self.state_dir, self.control, self.work):
            d.mkdir(parents=True, exist_ok=True)
        self.topology_path.write_text(yaml.safe_dump(topology(sc, self.state_dir, self.control)))

    def new_cluster(self, n: int) -> ChaosCluster:
        overrides = dict(OVERRIDES)
        if self.net is not None:
            overrides.update(NETNS_OVERRIDES)
        cluster = ChaosCluster(
            self.topology_path,
            n,
            work_dir=self.work,
            switch_s=1e-6 if self.sc.switch else 0.0,
            net=self.net,
            overrides=overrides,
        )
        self.clusters.append(cluster)
        self.launch(lambda: cluster.start(90))
        self.cluster = cluster
        return cluster

    # Workers start with the parent-death signal of the *thread* that starts them
    # (spark_storm.cluster.launch): a worker started from a fault's thread would get SIGTERM when
    # that thread ends.  So every start runs on the main thread, which lives through the scenario
    # and serves these requests while it waits for the rest.
    def launch(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (which starts worker processes) on the main thread, and return what it returns."""
        if threading.current_thread() is threading.main_thread():
            return fn()
        future: Future[Any] = Future()
        self._requests.put((fn, future))
        result: T = future.result(timeout=300)
        return result

    def serve(self, timeout: float) -> None:
        """Main thread: run the launch requests that come within ``timeout`` s; other threads: sleep."""
        if threading.current_thread() is not threading.main_thread():
            time.sleep(timeout)
            return
        end = time.monotonic() + timeout
        while True:
            try:
                fn, future = self._requests.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                return
            try:
                future.set_result(fn())
            except Exception as exc:  # handed to the thread that asked (a SIGTERM's SystemExit goes on up)
                future.set_exception(exc)

    def refuse_requests(self) -> None:
        """Fail every request still queued (the scenario is being torn down)."""
        while True:
            try:
                _, future = self._requests.get_nowait()
            except queue.Empty:
                return
            future.set_exception(Aborted("the scenario is being torn down"))

    def current(self) -> ChaosCluster:
        assert self.cluster is not None
        return self.cluster

    def check(self) -> None:
        if self.abort.is_set():
            msg = f"aborted at: {self.step}"
            raise Aborted(msg)


# --------------------------------------------------------------------------------- topologies
def topology(sc: Scenario, state_dir: Path, control: Path) -> dict[str, Any]:
    """The scenario's topology: in (source) -> mid (pass-through) -> stateful component (-> results)."""
    conf: dict[str, Any] = {
        "topology.state.provider": "bench.chaos_backend:ChaosBackend",
        "topology.state.provider.config": {"dir": str(state_dir), "chaos": str(control)},
        "topology.state.checkpoint.interval.ms": sc.interval_ms,
        "topology.state.commit.timeout.ms": 30_000,  # a Spark commit that cannot complete fails the query sooner
        "storm.messaging.transport": "bench.chaos_transport:Context",
        CONTROL_KEY: str(control),
    }
    mid_bolt = PASS_BATCH_BOLT if sc.columnar else PASS_BOLT
    if sc.topology == "windows":
        fields = ["ts", "user", "v"]
        window = dict(sc.window or {})
        stateful: dict[str, Any] = {
            "id": "stateful",
            "bolt": f"{WINDOWS}:{sc.window_bolt}",
            "fields": ["start", "end", "key", "count", "id"],
            "window": window,
            "inputs": [{"from": "mid", "grouping": "fields", "fields": ["user"]}],
        }
        if sc.window_bolt == "WindowCountBatch":
            stateful["conf"] = {"count.by": "user"}
        else:
            window["key"] = "user"
    else:
        fields = list(TYPED_FIELDS) if sc.topology == "typed" else ["key", "n"]
        bolt = {
            "ledger": "tests.integration.bolts:LedgerBolt",
            "columnar": "tests.integration.bolts:LedgerBatchBolt",
            "typed": "bench.chaos_bolts:TypedLedgerBolt",
        }[sc.topology]
        stateful = {
            "id": "stateful",
            "bolt": bolt,
            "inputs": [{"from": "mid", "grouping": "fields", "fields": ["key"]}],
        }
    stateful.update(parallelism=sc.stateful_parallelism, tasks=sc.stateful_tasks)
    components: list[dict[str, Any]] = [
        {"id": "in", "source": True, "fields": fields, "parallelism": sc.sources},
        {
            "id": "mid",
            "bolt": mid_bolt,
            "fields": fields,
            "parallelism": sc.mid_parallelism,
            "inputs": [{"from": "in", "grouping": "shuffle"}],
        },
        stateful,
    ]
    if sc.topology == "windows":
        components.append(
            {
                "id": "results",
                "bolt": f"{WINDOWS}:WindowResults",
                "parallelism": 2,
                "inputs": [{"from": "stateful", "grouping": "fields", "fields": ["id"]}],
            }
        )
    return {"name": f"chaos-{sc.seed}-{sc.index}", "conf": conf, "components": components}


# --------------------------------------------------------------------------------- the data
def batch_rows(sc: Scenario, batch: int) -> list[list[Any]]:
    """Batch ``batch``'s rows (the same on every replay of the scenario)."""
    n = sc.rows - (batch * 7919 + sc.index) % max(1, sc.rows // 3)
    if sc.topology == "windows":
        return rows_of(batch, n, users=max(4, sc.keys // 4))  # tests/support/windows.py: event times within the lag
    if sc.topology == "typed":
        return typed_rows(batch, n, sc.keys, sc.seed * 1000 + sc.index)
    return rows_for(batch, n, sc.keys)


def flush_batch(sc: Scenario) -> list[list[Any]]:
    """One event per user an hour after the data: every window of the data fires."""
    return flush_rows(sc.batches, users=max(4, sc.keys // 4))


# --------------------------------------------------------------------------------- health
class Sampler:
    """Every worker's /health twice a second; the figures of each process are kept, then summed."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.seen: dict[tuple[str, int], dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self.sample()

    def sample(self) -> None:
        cluster = self.run.cluster
        if cluster is None:
            return
        for slot in list(cluster.slots):
            try:
                health = cluster.health(slot, timeout=1.0)
            except (OSError, StormError, ValueError):
                continue
            cp: Mapping[str, Any] = health.get("checkpoint") or {}
            counters: Mapping[str, Any] = health.get("counters") or {}
            server: Mapping[str, Any] = health.get("server") or {}
            figures = {
                "rollbacks": int(cp.get("rollbacks", 0)),
                "replays": int(cp.get("replayed_records", 0)),
                "replayed_groups": int(server.get("replayed_groups", 0)),
                "detected_losses": int(counters.get("lost_payloads", 0)) + int(counters.get("bad_acker_updates", 0)),
                "protocol_errors": int(server.get("protocol_errors", 0)),
            }
            key = (str(slot), int(health.get("pid", 0)))
            old = self.seen.setdefault(key, {})
            for name, value in figures.items():
                old[name] = max(old.get(name, 0), value)

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        per_slot_rollbacks: dict[str, int] = {}
        for (slot, _pid), figures in self.seen.items():
            for name, value in figures.items():
                if name != "rollbacks":
                    out[name] = out.get(name, 0) + value
            per_slot_rollbacks[slot] = per_slot_rollbacks.get(slot, 0) + figures.get("rollbacks", 0)
        out["rollbacks"] = max(per_slot_rollbacks.values(), default=0)
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


# --------------------------------------------------------------------------------- feeds
class Feed:
    """What the faults ask of a feed (a restart of its query, a redeploy) and what the checker needs."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.fed: dict[int, list[list[Any]]] = {}  # batch -> rows, once committed
        self.complete = False
        self.commit_failures = 0
        self.query_failures = 0
        self.rebalance_mode: str | None = None
        self.restart_delay: float | None = None
        self.inflight: tuple[int, list[list[Any]]] | None = None  # the batch sent, not yet committed
        #: Called once when the data starts to flow: the runner starts the fault schedule's clock there.
        self.on_flowing: Callable[[], None] = lambda: None
        self.performed: dict[str, int] = {}  # the faults the feed itself carries out (rebalance, query_restart)

    def did(self, kind: str) -> None:
        self.performed[kind] = self.performed.get(kind, 0) + 1

    def request_rebalance(self, mode: str) -> bool:
        return False

    def request_restart(self, delay: float) -> bool:
        return False

    def run_all(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release connections (any thread, idempotent)."""

    def abort(self) -> None:
        """Stop at once (the deadline passed)."""


def _header(batch: int, part: int, seq: int, count: int) -> BatchHeader:
    """A group's header, marked coordinated as Spark's writer marks its groups (its driver commits each batch)."""
    try:
        return BatchHeader(QUERY, batch, part, seq, count, PROCESSED, True)
    except TypeError:  # a checkout from before coordinated groups (a run against an older commit)
        return BatchHeader(QUERY, batch, part, seq, count, PROCESSED)


class ClientFeed(Feed):
    """A plain client that behaves like Spark: keyed delivery groups resent until PROCESSED, and the driver's commit."""

    def __init__(self, run: Run) -> None:
        super().__init__(run)
        self.ctx = make_context({"storm.messaging.transport": "tcp", **OVERRIDES})
        self.conns: dict[Slot, IClient] = {}
        self.coordinator: Coordinator | None = None
        self.partitions = 3

    # the driver's side
    def _connect(self) -> None:
        cluster = self.run.current()
        for conn in self.conns.values():
            with contextlib.suppress(Exception):
                conn.close()
        self.conns = {s: self.ctx.connect(cluster.topology.name, s.host, s.port) for s in cluster.slots}
        for conn in self.conns.values():
            conn.wait_ready(30)
        self.coordinator = Coordinator(
            "bench-chaos-driver", lambda: {str(s): c for s, c in self.conns.items()}, 20.0, 3, 5.0, priority=1
        )

    def request_rebalance(self, mode: str) -> bool:
        self.rebalance_mode = mode
        return True

    def _rebalance(self, mode: str) -> None:
        """Stop every worker and start the topology on the other worker count: tasks move between processes."""
        run = self.run
        with run.lock:
            old = run.current()
            self.run.step = f"rebalance ({mode}) from {len(old.slots)} workers"
            if mode == "kill":
                old.hard_stop()
            else:
                old.ordered_stop(20)
            for conn in self.conns.values():
                with contextlib.suppress(Exception):
                    conn.close()
            self.conns = {}
            run.new_cluster(5 - len(old.slots))
        self._connect()

    def _groups(self, batch: int, rows: list[list[Any]]) -> list[tuple[Slot, BatchHeader, list[TaskMessage]]]:
        """tests/support/ledger.py GroupWriter's groups; Arrow payloads (one per task and partition) when columnar."""
        cluster = self.run.current()
        the_plan = cluster.plan
        sources = list(the_plan.component_tasks["in"])
        fields = list(the_plan.topology.components["in"].fields_of())
        out = []
        for part in range(self.partitions):
            mine = rows[part :: self.partitions]
            by_task: dict[int, list[list[Any]]] = {}
            for i, row in enumerate(mine):
                by_task.setdefault(sources[(part + i) % len(sources)], []).append(row)
            per_slot: dict[Slot, list[TaskMessage]] = {}
            for task, task_rows in sorted(by_task.items()):
                msgs = per_slot.setdefault(the_plan.task_slot[task], [])
                if self.run.sc.columnar:
                    for at in range(0, len(task_rows), 64):
                        chunk = task_rows[at : at + 64]
                        data = pa.record_batch([pa.array(list(c)) for c in zip(*chunk, strict=True)], names=fields)
                        msgs.append(TaskMessage(task, arrow_payload(data)))
                else:
                    msgs.extend(TaskMessage(task, pack_value(row)) for row in task_rows)
            for seq, slot in enumerate(sorted(per_slot)):
                msgs = per_slot[slot]
                out.append((slot, _header(batch, part, seq, len(msgs)), msgs))
        return out

    def _send(self, batch: int, rows: list[list[Any]]) -> None:
        """Send a batch; resend what is not PROCESSED within 3 s (a worker may be dead, paused or cut off)."""
        pending = self._groups(batch, rows)
        while pending:
            self.run.check()
            for slot, header, msgs in pending:
                with contextlib.suppress(StormError):  # closed or refused: resent next turn
                    self.conns[slot].send_group(header, msgs)
            still = []
            by_slot: dict[Slot, list[tuple[Slot, BatchHeader, list[TaskMessage]]]] = {}
            for item in pending:
                by_slot.setdefault(item[0], []).append(item)
            deadline = time.monotonic() + 3.0
            for slot, items in by_slot.items():
                got = self.conns[slot].wait_acks(
                    [h.key for _, h, _ in items], PROCESSED, max(0.05, deadline - time.monotonic())
                )
                for item in items:
                    status = got.get(item[1].key)
                    if status is None or status == FAILED:
                        still.append(item)
            pending = still

    def _commit(self, batch: int, rows: list[list[Any]]) -> None:
        """The driver's commit(batch); a failed one is retried after the batch is sent again (Spark's restart)."""
        while True:
            self.run.check()
            assert self.coordinator is not None
            try:
                self.coordinator.checkpoint({QUERY: batch})
                return
            except StormError as exc:
                self.commit_failures += 1
                logger.info(
                    "scenario %d: commit of batch %d failed (%s); sending it again", self.run.sc.index, batch, exc
                )
                self.run.step = f"batch {batch}: resending after a failed commit"
                self._send(batch, rows)

    def run_all(self) -> None:
        self._connect()
        self.on_flowing()
        sc = self.run.sc
        plan_of: list[tuple[int, list[list[Any]]]] = [(b, batch_rows(sc, b)) for b in range(sc.batches)]
        if sc.topology == "windows":
            plan_of.append((sc.batches, flush_batch(sc)))
        # A batch every pace_s at least, and the data spread until the last fault has ended (a
        # second after), so that every fault of the schedule lands while batches flow.
        last = max((f.at + f.duration for f in sc.faults), default=0.0) + 1.0
        every = max(sc.pace_s, last / sc.batches)
        for batch, rows in plan_of:
            if self.rebalance_mode is not None:
                mode, self.rebalance_mode = self.rebalance_mode, None
                self._rebalance(mode)
                self.did("rebalance")
            self.run.step = f"batch {batch}: sending {len(rows)} rows"
            self.inflight = (batch, rows)
            self._send(batch, rows)
            self.run.step = f"batch {batch}: commit"
            self._commit(batch, rows)
            self.fed[batch] = rows
            self.inflight = None
            pause = self.run.t0 + (batch + 1) * every - time.monotonic()
            if pause > 0 and batch + 1 < sc.batches:
                self.run.abort.wait(pause)
        self.complete = True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ctx.term()

    def abort(self) -> None:
        self.close()


_SPARK: Any = None


def spark_session() -> Any:
    """The harness process's one SparkSession (local[2,4]: 2 cores, a failed task retried as on a cluster)."""
    global _SPARK
    if _SPARK is None:
        from spark_storm.spark import register
        from spark_storm.spark.session import local_session

        _SPARK = local_session(
            "bench-chaos",
            quiet=True,
            conf={
                "spark.sql.execution.arrow.maxRecordsPerBatch": "100",  # several Arrow batches per partition
                "spark.sql.streaming.stopTimeout": "30s",  # a stop() that cannot finish raises, never hangs
            },
        )
        _SPARK.sparkContext.setLogLevel("WARN" if logger.isEnabledFor(logging.INFO) else "FATAL")
        register(_SPARK)
    return _SPARK


def stop_spark() -> None:
    global _SPARK
    if _SPARK is not None:
        _SPARK.stop()
        _SPARK = None


class SparkFeed(Feed):
    """``format("storm")`` or ``foreachBatch(storm_sink(...))`` over one JSON file per micro-batch, availableNow."""

    def __init__(self, run: Run) -> None:
        super().__init__(run)
        self.src = run.dir / "in"
        self.ck = run.dir / "ck"
        self.query: Any = None
        self.stopping = threading.Event()
        self.batches_rows: dict[int, list[list[Any]]] = {}
        self._write_files()

    def _write_files(self) -> None:
        sc = self.run.sc
        self.src.mkdir(parents=True, exist_ok=True)
        for b in range(sc.batches):
            self.batches_rows[b] = batch_rows(sc, b)
        if sc.topology == "windows":
            self.batches_rows[sc.batches] = flush_batch(sc)
        for b, rows in self.batches_rows.items():
            path = self.src / f"part{b:04d}.json"
            path.write_text("".join(self._json(row) + "\n" for row in rows))
            os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))  # the file source takes oldest first

    def _json(self, row: list[Any]) -> str:
        sc = self.run.sc
        if sc.topology == "windows":
            ts: Any = row[0]
            if not sc.spark_millis:
                ts = dt.datetime.fromtimestamp(row[0] / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")
            return json.dumps({"ts": ts, "user": row[1], "v": row[2]})
        if sc.topology == "typed":
            key, ts, d, dec, st, arr = row
            text = json.dumps(
                {
                    "key": key,
                    "ts": ts.isoformat(timespec="milliseconds"),
                    "d": d.isoformat(),
                    "dec": "@DEC@",
                    "st": {"x": st["x"], "y": st["y"], "when": st["when"].isoformat()},
                    "arr": arr,
                }
            )
            return text.replace('"@DEC@"', str(dec))
        return json.dumps({"key": row[0], "n": row[1]})

    def _schema(self) -> str:
        sc = self.run.sc
        if sc.topology == "windows":
            return f"ts {'long' if sc.spark_millis else 'timestamp'}, user string, v long"
        if sc.topology == "typed":
            return TYPED_SCHEMA
        return "key string, n long"

    def _start(self) -> Any:
        from spark_storm.spark import storm_sink

        cluster = self.run.current()
        spark = spark_session()
        # The JVM's active session is per thread, and Spark looks Python data sources up through it:
        # from a thread without one, format("storm") is DATA_SOURCE_NOT_FOUND even once registered.
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        stream = spark.readStream.schema(self._schema()).option("maxFilesPerTrigger", 1).json(str(self.src))
        options = {
            "topology": str(self.run.topology_path),
            "workers": cluster.workers_arg,
            "delivery": "processed",
        }
        if self.run.sc.feed == "format":
            writer = stream.writeStream.format("storm").options(**options)
        else:
            writer = stream.writeStream.foreachBatch(storm_sink(**options))
        return writer.option("checkpointLocation", str(self.ck)).trigger(availableNow=True).start()

    def request_restart(self, delay: float) -> bool:
        self.restart_delay = delay
        return True

    def run_all(self) -> None:
        started = False
        while True:
            self.run.check()
            self.run.step = f"spark query ({self.query_failures} failures so far): running"
            self.query = self._start()
            stopped_by_us = False
            while self.query.isActive:
                if not started and (self.ck / "offsets" / "0").exists():  # the first micro-batch is planned
                    started = True
                    self.on_flowing()
                if self.run.abort.is_set() or self.stopping.is_set():
                    self._stop_query()
                    self.run.check()
                    return
                if self.restart_delay is not None:
                    delay, self.restart_delay = self.restart_delay, None
                    self.run.step = "spark query: stopped by the query_restart fault"
                    self._stop_query()
                    self.did("query_restart")
                    stopped_by_us = True
                    self.run.abort.wait(delay)
                    break
                time.sleep(0.1)
            if stopped_by_us:
                continue
            error = self.query.exception()
            if error is None:
                break
            self.query_failures += 1
            logger.info(
                "scenario %d: the query failed (%s); restarting it from its checkpoint", self.run.sc.index, error
            )
            if self.query_failures > 8:
                msg = f"the query failed {self.query_failures} times; last: {str(error)[:500]}"
                raise StormError(msg)
        self.fed = dict(self.batches_rows)
        self.complete = True

    def _stop_query(self) -> None:
        """Stop the query (bounded: from another thread, joined for at most 60 s)."""
        query = self.query
        if query is None:
            return

        def stop() -> None:
            with contextlib.suppress(Exception):
                query.stop()

        stopper = threading.Thread(target=stop, name="chaos-query-stop", daemon=True)
        stopper.start()
        stopper.join(60)

    def abort(self) -> None:
        self.stopping.set()
        self._stop_query()


# --------------------------------------------------------------------------------- faults
class Faults:
    """The schedule: a thread per fault, started at its time; :meth:`finish` ends every one (undoing it)."""

    def __init__(self, run: Run, feed: Feed) -> None:
        self.run = run
        self.feed = feed
        self.fired: dict[str, int] = {}
        self.skipped: list[str] = []
        self._end = threading.Event()
        self._threads: list[threading.Thread] = []
        self._windows = {"fsync": threading.Lock(), "corrupt": threading.Lock()}
        self._count_lock = threading.Lock()

    def start(self) -> None:
        for fault in self.run.sc.faults:
            thread = threading.Thread(target=self._one, args=(fault,), name=f"chaos-{fault.kind}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _one(self, fault: Fault) -> None:
        if self._end.wait(max(0.0, self.run.t0 + fault.at - time.monotonic())):
            return  # the data was all fed before its time
        try:
            done = getattr(self, f"_{fault.kind}")(fault)
        except Exception as exc:
            logger.exception("scenario %d: fault %s failed", self.run.sc.index, fault.describe())
            self.skipped.append(f"{fault.describe()}: {exc}")
            return
        if done:
            with self._count_lock:
                self.fired[fault.kind] = self.fired.get(fault.kind, 0) + 1

    def _slot(self, index: int) -> tuple[ChaosCluster, Slot]:
        cluster = self.run.current()
        return cluster, cluster.slots[index % len(cluster.slots)]

    def _kill(self, fault: Fault) -> bool:
        with self.run.lock:
            cluster, slot = self._slot(fault.worker)
            proc = cluster.procs[slot]
            if proc.poll() is not None:
                return False
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        self._end.wait(fault.duration)
        with self.run.lock:
            if self.run.cluster is cluster and cluster.procs[slot] is proc:
                self.run.launch(lambda: cluster.start_worker(slot))
        return True

    def _pause(self, fault: Fault) -> bool:
        with self.run.lock:
            _, slot = self._slot(fault.worker)
            proc = self.run.current().procs[slot]
            if proc.poll() is not None:
                return False
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            self._end.wait(fault.duration)
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
        return True

    def _netcut(self, fault: Fault) -> bool:
        net = self.run.net
        if net is None:
            self.skipped.append(f"{fault.describe()}: the workers are not in network namespaces")
            return False
        cluster = self.run.current()
        n = len(cluster.slots)
        a = f"w{fault.worker % n}"
        b = f"w{fault.other % n}"
        if fault.mode == "pair" and a != b:
            net.block(a, b)
            try:
                self._end.wait(fault.duration)
            finally:
                net.unblock(a, b)
        else:
            net.cut(a)
            try:
                self._end.wait(fault.duration)
            finally:
                net.restore(a)
        return True

    def _window(self, kind: str, fault: Fault) -> bool:
        with self._windows[kind]:
            if self._end.is_set():
                return False
            seed = self.run.sc.seed * 100_003 + self.run.sc.index * 101 + int(fault.at * 10)
            write_injection(self.run.control, kind, Injection(fault.mode, fault.p, seed, 0.2, 2.5))
            try:
                self._end.wait(fault.duration)
            finally:
                write_injection(self.run.control, kind, None)
        return True

    def _fsync(self, fault: Fault) -> bool:
        return self._window("fsync", fault)

    def _corrupt(self, fault: Fault) -> bool:
        return self._window("corrupt", fault)

    def _query_restart(self, fault: Fault) -> bool:
        self.feed.request_restart(fault.duration)
        return False  # counted by the feed when it stops the query

    def _rebalance(self, fault: Fault) -> bool:
        self.feed.request_rebalance(fault.mode)
        return False  # counted by the feed when it redeploys, at the next batch boundary

    def finish(self) -> None:
        """End every fault now (each undoes itself), and wait for them."""
        self._end.set()
        deadline = time.monotonic() + 60
        for thread in self._threads:
            while thread.is_alive() and time.monotonic() < deadline:
                self.run.serve(0.05)  # a kill's restart asks the main thread
        for kind in self._windows:
            write_injection(self.run.control, kind, None)


# --------------------------------------------------------------------------------- the checker
def _rows_of(value: Any, counted: bool) -> int:
    """How many rows a key's value says it holds ([count, sum] or a count; None: none)."""
    if value is None:
        return 0
    return int(value[0] if counted else value)


def compare(want: Mapping[Any, Any], got: Mapping[Any, Any], record: Record, *, counted: bool) -> None:
    """Fill ``record``'s wrong keys, lost and extra rows (``counted``: values are [count, sum], else counts)."""
    wrong = []
    lost = extra = 0
    for key in sorted(set(want) | set(got), key=repr):
        w, g = want.get(key), got.get(key)
        if w == g:
            continue
        wrong.append(f"{key!r}: want {w}, got {g}")
        wn, gn = _rows_of(w, counted), _rows_of(g, counted)
        lost += max(0, wn - gn)
        extra += max(0, gn - wn)
    record.wrong_keys = len(wrong)
    record.wrong_sample = wrong[:12]
    record.lost_rows = lost
    record.extra_rows = extra


def check(run: Run, feed: Feed, record: Record) -> None:
    """Compare the committed state with the answer computed from the rows fed (committed batches only)."""
    sc = run.sc
    cluster = run.current()
    name = cluster.topology.name
    batches = feed.fed
    record.batches = len(batches)
    record.rows = sum(len(r) for r in batches.values())
    if sc.topology == "windows":
        got_windows, conflicts = window_results(run.state_dir, name, cluster.plan)
        data = [r for rows in batches.values() for r in rows if r[2] >= 0]
        window = sc.window or {}
        if "session_gap" in window:
            gap = int(str(window["session_gap"]).removesuffix("ms"))
            want_windows = spark_sessions(data, gap)
        else:
            length = int(str(window["length"]).removesuffix("s")) * 1000
            slide = int(str(window.get("sliding", window["length"])).removesuffix("s")) * 1000
            want_windows = spark_windows(data, length, slide)
        if not feed.complete:  # only windows the committed batches closed can be judged: skip the rest
            want_windows = {}
            got_windows = {}
        compare(want_windows, got_windows, record, counted=False)
        if conflicts:
            record.reasons.append(f"{conflicts} window(s) emitted again with other values")
        return
    got = ledger_state(run.state_dir, name, cluster.plan, "stateful")
    want: dict[Any, list[int]]
    if sc.topology == "typed":
        want = {}
        for rows in batches.values():
            for row in rows:
                entry = want.setdefault(typed_key(row), [0, 0])
                entry[0] += 1
                entry[1] += typed_amount(row)
    else:
        want = expected(batches)
    compare(want, got, record, counted=True)


_LOG_LINE: Final = re.compile(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) (\S+): (.*)$")


def log_lines(work: Path, limit: int = 20) -> list[str]:
    """The distinct WARNING/ERROR messages of the workers' logs (digits masked), most frequent first."""
    counts: dict[str, int] = {}
    for path in sorted(work.glob("worker-*.log")):
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                m = _LOG_LINE.match(line)
                if m:
                    text = re.sub(r"\d+", "N", f"{m.group(1)} {m.group(2)}: {m.group(3)}")[:220]
                    counts[text] = counts.get(text, 0) + 1
    return [f"{n:5d} x {text}" for text, n in sorted(counts.items(), key=lambda kv: -kv[1])[:limit]]


# --------------------------------------------------------------------------------- one scenario
def _body(run: Run, feed: Feed, faults: Faults, outcome: dict[str, Any]) -> None:
    try:
        run.new_cluster(run.sc.workers)
        run.step = "feeding"

        def flowing() -> None:
            run.t0 = time.monotonic()
            faults.start()

        feed.on_flowing = flowing
        feed.run_all()
        faults.finish()
        outcome["ok"] = True
    except Aborted as exc:
        outcome["error"] = str(exc)
    except Exception as exc:
        logger.exception("scenario %d failed", run.sc.index)
        outcome["error"] = f"{type(exc).__name__}: {exc}"


def run_scenario(sc: Scenario, workdir: Path, deadline_s: float, *, keep: bool, net: Network | None = None) -> Record:
    """Run one scenario to its verdict within ``deadline_s`` (a hang is a FAIL, never a hung harness)."""
    started = time.monotonic()
    record = Record(
        seed=sc.seed,
        index=sc.index,
        topology=sc.topology,
        feed=sc.feed,
        workers=sc.workers,
        switch=sc.switch,
        netns=sc.netns,
        planned=[f.describe() for f in sc.faults],
        command=sc.command(),
    )
    directory = workdir / f"seed{sc.seed}-{sc.index}"
    shutil.rmtree(directory, ignore_errors=True)
    run = Run(sc, directory, net)
    feed: Feed = ClientFeed(run) if sc.feed == "client" else SparkFeed(run)
    faults = Faults(run, feed)
    sampler = Sampler(run)
    outcome: dict[str, Any] = {}
    body = threading.Thread(target=_body, args=(run, feed, faults, outcome), name="chaos-body", daemon=True)
    body.start()
    deadline = time.monotonic() + deadline_s
    while body.is_alive() and time.monotonic() < deadline:
        run.serve(0.1)
    hung = body.is_alive()
    if hung:
        record.reasons.append(f"hang: no end within {deadline_s:.0f}s (at: {run.step})")
        run.abort.set()
        feed.abort()
        faults.finish()
        run.refuse_requests()
        for cluster in run.clusters:
            cluster.hard_stop()
        end = time.monotonic() + 60
        while body.is_alive() and time.monotonic() < end:
            run.serve(0.1)
        run.refuse_requests()
    else:
        faults.finish()
    sampler.sample()
    sampler.stop()
    feed.close()
    for cluster in run.clusters:
        if cluster is run.cluster and not hung:
            cluster.ordered_stop(20)
        cluster.hard_stop()
    totals = sampler.totals()
    record.rollbacks = totals.get("rollbacks", 0)
    record.replays = totals.get("replays", 0)
    record.replayed_groups = totals.get("replayed_groups", 0)
    record.detected_losses = totals.get("detected_losses", 0)
    record.protocol_errors = totals.get("protocol_errors", 0)
    record.faults = {**faults.fired, **feed.performed}
    if sc.switch:
        record.faults["switch"] = 1
    record.injections = count_injections(run.control)
    record.commit_failures = feed.commit_failures
    record.query_failures = feed.query_failures
    if "error" in outcome and not hung:
        record.reasons.append(f"the feed stopped: {outcome['error'][:800]}")
    for note in faults.skipped:
        logger.info("scenario %d: fault not run: %s", sc.index, note)
    if run.cluster is not None:
        try:
            check(run, feed, record)
        except Exception as exc:
            record.reasons.append(f"the committed state is unreadable: {type(exc).__name__}: {exc}")
    if not feed.complete and not record.reasons:
        record.reasons.append("the feed did not finish")
    if record.wrong_keys:
        record.reasons.append(
            f"{record.wrong_keys} wrong key(s), {record.lost_rows} lost row(s), {record.extra_rows} extra"
        )
    record.verdict = "FAIL" if record.reasons else "PASS"
    record.duration_s = round(time.monotonic() - started, 1)
    if record.verdict == "FAIL":
        record.log_lines = log_lines(run.work)
    if record.verdict == "FAIL" or keep:
        record.kept = str(directory)
    else:
        shutil.rmtree(directory, ignore_errors=True)
    return record
