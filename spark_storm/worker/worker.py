"""The worker process's lifecycle: start, activate, refresh, heartbeat, ordered stop.

One worker runs the executors the plan assigns to its slot (``host:port``).  Its parts,
each in its own module, under Storm's names:

* :class:`~spark_storm.worker.state.WorkerState` — plan, queues, executors, connections;
* receive — :class:`~spark_storm.worker.receive.DeserializingConnectionCallback` (push,
  Storm 2.x) or a receive thread (pull, Storm 0.8) into ``Receiver.transfer_local``;
* :class:`~spark_storm.worker.transfer.WorkerTransfer` — remote emits grouped by
  destination worker, held (never dropped) for backpressured tasks;
* :class:`~spark_storm.worker.timer.WorkerTimer` — heartbeats and load metrics;
* executors (:mod:`spark_storm.worker.executor`).

This module wires them and runs the lifecycle: connections first, executors activate
when every connection is ready, :meth:`Worker.refresh` follows a new plan (new
connections first, an atomic swap, removed executors drained through their bolts, new
ones started), and :meth:`Worker.stop` runs the ordered shutdown under one deadline.
Any worker thread that dies stops the worker with the error (never a half-running
worker that looks healthy).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_storm.codec.tuples import CLIENT_COMPONENT
from spark_storm.config import Config
from spark_storm.errors import CheckpointError, ConfigError, ConnectionClosedError
from spark_storm.messaging import ConnectionStatus, IClient, IServer
from spark_storm.reports import HeartbeatFileWriter, WorkerHeartbeat, WorkerMetrics
from spark_storm.topology.assignment import ExecutorSpec, Plan, Slot
from spark_storm.worker.acker import worker_id
from spark_storm.worker.affinity import pin_worker
from spark_storm.worker.checkpoint import CheckpointManager, IntervalCheckpoints, take_savepoint
from spark_storm.worker.diagnostics import log_thread_stacks
from spark_storm.worker.executor import Executor
from spark_storm.worker.receive import DeserializingConnectionCallback
from spark_storm.worker.settings import WorkerSettings
from spark_storm.worker.state import WorkerState
from spark_storm.worker.timer import WorkerTimer

__all__ = ["CLIENT_COMPONENT", "Worker"]

logger = logging.getLogger(__name__)

_LIVE: weakref.WeakSet[Worker] = weakref.WeakSet()  # added, removed and read under _HOOK_LOCK
_HOOK_LOCK = threading.Lock()
_previous_hook: Callable[[threading.ExceptHookArgs], Any] | None = None


def _thread_died(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook``: a dead thread stops the worker it belonged to."""
    if _previous_hook is not None:
        _previous_hook(args)
    name = args.thread.name if args.thread is not None else "?"
    with _HOOK_LOCK:
        live = [w for w in list(_LIVE) if not w.stopping.is_set()]
    owners = [w for w in live if w.owns_thread(name)] or (live if len(live) == 1 else [])
    for worker in owners:
        worker.request_stop(f"thread {name} died: {args.exc_type.__name__}: {args.exc_value}")


def _install_thread_hook() -> None:
    global _previous_hook
    with _HOOK_LOCK:
        if threading.excepthook is not _thread_died:
            _previous_hook = threading.excepthook
            threading.excepthook = _thread_died


class Worker:
    """One worker: the state, threads and connections of a slot of a topology.

    Parameters
    ----------
    plan : Plan
        The topology's assignment (the same on every worker and on the Spark side).
    slot : Slot
        Which slot this worker is.
    conf : Config
        Messaging and ``topology.*`` configuration.

    Raises
    ------
    ConfigError
        The slot is not in the plan, a setting is invalid (named), or a bolt cannot be loaded.
    """

    def __init__(self, plan: Plan, slot: Slot, conf: Config) -> None:
        if slot not in plan.slots:
            msg = f"worker {slot} is not one of the plan's slots ({', '.join(map(str, plan.slots))})"
            raise ConfigError(msg)
        self.conf = conf.with_overrides(plan.topology.conf) if plan.topology.conf else conf
        self.settings = WorkerSettings.from_conf(self.conf)
        self.slot = slot
        self.topology_id = plan.topology.name
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self.stop_reason: str | None = None
        self.failed = False
        self._stop_lock = threading.Lock()  # request_stop from any thread: the first reason, a failure wins
        self.state = WorkerState(plan, slot, self.conf, self.settings, self.request_stop)
        self.receiver = self.state.receiver
        self.transfer = self.state.transfer
        self.backpressure = self.state.backpressure
        self.state.route_to({spec: self.state.build_executor(spec) for spec in plan.executors_of(slot)})
        self._threads: list[threading.Thread] = []
        self._active = False
        self.metrics_port: int | None = None
        self._http: Any = None
        hb_dir = self.settings.heartbeat_dir or tempfile.gettempdir()
        self._heartbeat = HeartbeatFileWriter(Path(hb_dir), self.topology_id, slot.port)
        self.heartbeat_path = self._heartbeat.path
        self.timer = WorkerTimer(self._stopping)
        self.timer.every("heartbeat", self.settings.heartbeat_every_s, self._beat)
        self.timer.every("load-metrics", self.settings.load_interval_s, self._send_load)
        self.timer.every("message-timeout", min(1.0, self.settings.message_timeout_s / 10), self._expire_trees)
        self.timer.every("peers", 0.1, self._watch_peers)
        self.timer.every("rates", 1.0, self._update_rates)
        self.timer.every("backpressure", 0.5, self.backpressure.resend)  # a missed status is corrected
        self._ready_peers: set[Slot] = set()
        self.started_at = time.time()
        self.interval_checkpoints: IntervalCheckpoints | None = None

    # ------------------------------------------------------------------ views
    @property
    def plan(self) -> Plan:
        return self.state.plan

    @property
    def local_tasks(self) -> frozenset[int]:
        return self.state.local_tasks

    @property
    def executors(self) -> dict[ExecutorSpec, Executor]:
        return self.state.executors

    @property
    def connections(self) -> dict[Slot, IClient]:
        return dict(self.state.connections)

    @property
    def server(self) -> IServer | None:
        return self.state.server

    @property
    def acker(self) -> Any:
        return self.state.acker

    @property
    def counters(self) -> dict[str, int]:
        return self.receiver.counters

    @property
    def active(self) -> bool:
        return self._active

    @property
    def stopping(self) -> threading.Event:
        return self._stopping

    def owns_thread(self, name: str) -> bool:
        """Whether thread ``name`` is one of this worker's (or of its server's transport)."""
        return name.endswith(f"-{self.slot.port}") or any(name.endswith(f"-{spec}") for spec in self.executors)

    # ------------------------------------------------------------------ lifecycle
    def tune_process(self) -> None:
        """Tune the interpreter for a worker *process* (the CLI calls it; not for embedded workers).

        * garbage collection: freeze what start-up allocated and collect young objects less
          often — the hot path allocates a few objects per tuple that die young, and the
          default threshold (700) makes the cyclic collector walk them thousands of times a
          second (``topology.worker.gc.threshold``; 0 leaves the default);
        * the GIL's switch interval (``topology.worker.switch.interval.ms``; null leaves
          Python's 5 ms): how long a thread that became runnable may wait for another that
          holds the interpreter — lower it for latency, at some cost in throughput.  The
          environment's ``SPARK_STORM_SWITCH_INTERVAL_US`` overrides it (the race tier).
        """
        if self.settings.gc_threshold:
            gc.collect()
            gc.freeze()
            _, gen1, gen2 = gc.get_threshold()
            gc.set_threshold(self.settings.gc_threshold, gen1, gen2)
        if self.settings.switch_interval_s is not None:
            sys.setswitchinterval(self.settings.switch_interval_s)
            logger.info("worker %s: GIL switch interval %g s", self.slot, sys.getswitchinterval())
        if self.settings.cpu_affinity is not None:
            here = [s.port for s in self.plan.slots if s.host == self.slot.host]
            cpus = pin_worker(self.settings.cpu_affinity, self.slot.port, self.settings.host_ports, here)
            logger.info("worker %s: pinned to CPUs %s", self.slot, sorted(cpus))

    def start(self) -> None:
        """Bind, connect, start threads; executors activate once connections are ready."""
        with _HOOK_LOCK:
            _LIVE.add(self)
        _install_thread_hook()
        state = self.state
        state.checkpoints.open()  # the epoch and the logs first: input may arrive as soon as we bind
        if self.settings.receiver_mode == "push":
            state.server = state.context.bind(
                self.topology_id, self.slot.port, DeserializingConnectionCallback(self.receiver)
            )
        else:
            state.server = state.context.bind(self.topology_id, self.slot.port)
            self._spawn(lambda: self.receiver.pull_loop(state.server, self.settings.receiver_buffer_size), "receive")  # type: ignore[arg-type]
        logger.info(
            "worker %s of %s listening (%s receive); tasks %s",
            self.slot,
            self.topology_id,
            self.settings.receiver_mode,
            sorted(self.local_tasks),
        )
        for executor in self.executors.values():
            executor.start()
        state.set_connections(self._connect(self.plan, {}))
        self._spawn(self.transfer.run, "transfer")
        self._start_metrics_http()  # before the timer: the first heartbeat names the metrics port
        self._spawn(self.timer.run, "timer")
        self._spawn(self._activate_when_ready, "activate")
        if isinstance(state.checkpoints, CheckpointManager):
            self.interval_checkpoints = IntervalCheckpoints(state.checkpoints, self._stopping)
            if self.interval_checkpoints.enabled:
                self._spawn(self.interval_checkpoints.run, "checkpoint-interval")

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        t = threading.Thread(target=target, name=f"spark-storm-{name}-{self.slot.port}", daemon=True)
        t.start()
        self._threads.append(t)
        return t

    def _connect(self, plan: Plan, current: dict[Slot, IClient]) -> dict[Slot, IClient]:
        """Return connections to every other worker that runs tasks (reusing ``current`` ones)."""
        conns = {}
        hosting = set(plan.task_slot.values())
        for slot in plan.slots:
            if slot != self.slot and slot in hosting:
                conns[slot] = current.get(slot) or self.state.context.connect(self.topology_id, slot.host, slot.port)
        return conns

    def _activate_when_ready(self) -> None:
        timeout = self.settings.ready_timeout_s
        deadline = time.monotonic() + timeout
        for slot, conn in self.connections.items():
            remaining = max(0.0, deadline - time.monotonic())
            if not conn.wait_ready(remaining) and not self._stopping.is_set():
                logger.warning(
                    "worker %s: connection to %s not ready after %.0fs; activating anyway", self.slot, slot, timeout
                )
        if not self._stopping.is_set():
            self.activate()

    def activate(self) -> None:
        """Let executors consume (Storm's activate)."""
        self._active = True
        self._set_active(list(self.executors.values()), True)
        logger.info("worker %s: executors active", self.slot)

    def savepoint(self, parent: str, commit_first: bool = False, hold: bool = False) -> dict[str, Any]:
        """Write a savepoint of the whole topology under ``parent``, coordinated from here (``POST /savepoint``).

        Returns ``{"path": ..., "epoch": ..., "components": {...}}``.

        Raises
        ------
        CheckpointError
            The topology has no state, or the workers could not write one (the reason says why).
        """
        checkpoints = self.state.checkpoints
        if not isinstance(checkpoints, CheckpointManager):
            msg = f"topology {self.state.plan.topology.name!r} has no stateful component: there is nothing to save"
            raise CheckpointError(msg)
        root, manifest = take_savepoint(checkpoints, parent, commit_first, hold)
        return {
            "path": str(root),
            "epoch": manifest.epoch,
            "id": manifest.id,
            "version": manifest.version,
            "components": {c: m.tasks for c, m in manifest.components.items()},
            "batches": manifest.batches,
        }

    def deactivate(self) -> None:
        """Pause executors; their queues fill and hold back senders (Storm's deactivate)."""
        self._active = False
        self._set_active(list(self.executors.values()), False)
        logger.info("worker %s: executors deactivated", self.slot)

    def _set_active(self, executors: list[Executor], on: bool) -> None:
        """Switch executors, through the checkpoints when a rollback may own them (docs/design/threads.md)."""
        self.state.checkpoints.set_active(executors, on)

    def refresh(self, plan: Plan) -> None:
        """Follow a new plan of the same topology (JStorm's RefreshConnections).

        New connections are made first and waited on; then the plan, connections and
        local executors swap at once; executors no longer assigned here drain what they
        hold through their bolts and stop (``cleanup``); newly assigned ones start; old
        connections close.  Tuples that still arrive for a task that moved are forwarded
        to its new worker, so nothing accepted is dropped.

        Raises
        ------
        ConfigError
            The plan is for another topology or other tasks, or leaves this slot out.
        """
        old = self.plan
        _check_same_topology(old, plan, self.slot)
        current = self.connections
        merged = self._connect(plan, current)
        for slot, conn in merged.items():
            if slot not in current and not conn.wait_ready(self.settings.ready_timeout_s):
                logger.warning("worker %s: new connection to %s not ready yet; swapping anyway", self.slot, slot)
        wanted = set(plan.executors_of(self.slot))
        kept = {spec: e for spec, e in self.executors.items() if spec in wanted}
        removed = [e for spec, e in self.executors.items() if spec not in wanted]
        added = {spec: self.state.build_executor(spec) for spec in wanted if spec not in kept}
        self.state.swap(plan, merged, {**kept, **added})
        self.state.checkpoints.executors_moved([str(s) for s in added], [str(e.spec) for e in removed])
        deadline = time.monotonic() + self.settings.shutdown_timeout_s
        for executor in removed:
            executor.activate()  # drain what it holds, even if deactivated
            executor.stop()
        for executor in removed:
            executor.join(max(0.0, deadline - time.monotonic()))
            if executor.alive:
                logger.error("worker %s: executor %s did not drain before the deadline", self.slot, executor.spec)
        checkpoints = self.state.checkpoints
        if removed and not checkpoints.drain_writes(max(0.0, deadline - time.monotonic())):
            logger.error("worker %s: changelog writes of moved executors still running", self.slot)
        for executor in added.values():
            executor.start()
        if self._active:
            self._set_active(list(added.values()), True)
        for slot, conn in current.items():
            if slot not in merged:
                conn.close()
        logger.info(
            "worker %s: plan refreshed: executors %s (+%d -%d), connections %s",
            self.slot,
            ", ".join(map(str, sorted(self.executors))) or "none",
            len(added),
            len(removed),
            ", ".join(map(str, sorted(merged))) or "none",
        )

    def request_stop(self, reason: str, *, failure: bool = True) -> None:
        """Ask for an ordered shutdown (from any thread: a failing bolt, a dead thread, a signal).

        The first request names the reason; a failure after a clean request (a thread that
        dies while a SIGTERM is handled) still makes the exit a failure.
        """
        with self._stop_lock:
            if self._stopping.is_set():
                if not failure or self.failed:
                    return
                self.failed = True
                self.stop_reason = f"{self.stop_reason}; then {reason}"
                first = False
            else:
                self.stop_reason = reason
                self.failed = failure
                self._stopping.set()
                first = True
        log = logger.error if failure else logger.info
        log("worker %s: stopping: %s", self.slot, reason if first else f"{reason} (while stopping)")

    def stop(self, timeout: float | None = None) -> bool:
        """Ordered shutdown under one deadline; returns False if the deadline cut it short.

        1. drain with the server still open until the worker is quiet: queues empty,
           transfer queue empty, every outbound message acknowledged, and nothing new
           arrived for ``topology.worker.shutdown.quiet.ms`` (so the workers of a topology
           that stop together still deliver what they send each other);
        2. stop accepting (close the server: unacknowledged client data stays with the
           clients, who resend it to the restarted worker);
        3. drain what is left through the bolts, stop the executors (bolt ``cleanup``);
        4. flush the transfer queue and the connections, then ``term()`` the context.
        """
        if self._stopped.is_set():
            return True
        self._stopping.set()
        if timeout is None:
            timeout = self.settings.shutdown_timeout_s
        deadline = time.monotonic() + timeout
        if not self.active:
            self.activate()  # a deactivated worker still drains what it accepted
        for executor in self.executors.values():
            if executor.kind == "spout":
                executor.stop()  # spouts stop making tuples first, so the rest can drain
        clean = self._wait_quiet(deadline, self.settings.quiet_s)
        server = self.state.server
        if server is not None:
            server.close()
        clean &= self._wait_quiet(deadline, 0.0)
        if not clean:
            log_thread_stacks(f"worker {self.slot}: not quiet at its shutdown deadline")
        for executor in self.executors.values():
            executor.stop()
        for executor in self.executors.values():
            executor.join(max(0.0, deadline - time.monotonic()))
            clean &= not executor.alive
        self.transfer.queue.close()
        for t in self._threads:
            t.join(max(0.0, min(5.0, deadline - time.monotonic())))
        for conn in self.connections.values():
            clean &= conn.flush(max(0.0, deadline - time.monotonic()))
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        self.state.context.term()
        self.state.checkpoints.close()
        self._beat("stopped")
        self._stopped.set()
        with _HOOK_LOCK:
            _LIVE.discard(self)
        if not clean:
            logger.error("worker %s: shutdown deadline of %.1fs passed before everything drained", self.slot, timeout)
        logger.info("worker %s stopped", self.slot)
        return clean

    def _idle(self) -> bool:
        server = self.state.server
        return (
            not self.receiver.busy
            and (server is None or server.metrics().get("pending", 0) == 0)
            and all(e.idle for e in self.executors.values())
            and self.transfer.idle
            and all(c.metrics().get("pending", 0) == 0 for c in self.connections.values())
        )

    def _wait_quiet(self, deadline: float, quiet_s: float) -> bool:
        """Wait until idle with no new arrivals for ``quiet_s`` (and at least 3 checks)."""
        calm_since: float | None = None
        checks = 0
        seen = self.counters["received"]
        while time.monotonic() < deadline:
            now = time.monotonic()
            arrived = self.counters["received"] != seen
            seen = self.counters["received"]
            if self._idle() and not arrived:
                calm_since = calm_since if calm_since is not None else now
                checks += 1
                if checks >= 3 and now - calm_since >= quiet_s:
                    return True
            else:
                calm_since, checks = None, 0
            time.sleep(0.01)
        return False

    # ------------------------------------------------------------------ timer duties
    def _beat(self, status: str | None = None) -> None:
        self._heartbeat.write(self.heartbeat_record(status))

    def heartbeat_record(self, status: str | None = None) -> WorkerHeartbeat:
        """Return the heartbeat record (the local file; cluster mode also writes it to ZooKeeper)."""
        return {
            "topology": self.topology_id,
            "worker": str(self.slot),
            "pid": os.getpid(),
            "status": status or ("running" if self.active else "inactive"),
            "time": time.time(),
            "uptime_s": round(time.time() - self.started_at, 3),
            "executors": [str(e) for e in self.executors],
            "received": self.counters["received"],
            "metrics_port": self.metrics_port,
            "metrics_host": self.settings.metrics_host if self.metrics_port is not None else None,
        }

    def _send_load(self) -> None:
        server = self.state.server
        if server is not None:
            try:
                server.send_load_metrics(self.state.task_loads())
            except ConnectionClosedError:
                return  # stopping

    def _update_rates(self) -> None:
        for executor in list(self.executors.values()):
            executor.update_rates()

    def _expire_trees(self) -> None:
        expired = self.state.acker.expire(self.settings.message_timeout_s)
        if expired:
            logger.warning(
                "worker %s: %d tuple trees not acked within topology.message.timeout.secs=%g failed (replayed)",
                self.slot,
                expired,
                self.settings.message_timeout_s,
            )

    def _watch_peers(self) -> None:
        """Fail the trees that passed through another worker when the connection to it drops (and roll back).

        Only connections of the current plan count: one closed by a refresh is not a loss.
        """
        connections = self.connections
        ready = {slot for slot, conn in connections.items() if conn.status is ConnectionStatus.READY}
        lost = (self._ready_peers & set(connections)) - ready
        self._ready_peers = ready
        if lost and not self._stopping.is_set():
            failed = sum(self.state.acker.peer_lost(worker_id(s)) for s in lost)
            # The peer may have died: what its stateful tasks did since the last commit is gone, even
            # for trees that completed (their groups were acked), and a task that restarts before any
            # commit restores nothing it could call a restart.  The next round rolls back and replays
            # (bench.chaos seed 1000 #169: a SIGKILL before the first commit lost 210 rows).
            self.state.checkpoints.mark_dirty(f"lost the connection to {', '.join(map(str, sorted(lost)))}")
            logger.warning(
                "worker %s: lost the connection to %s; failed %d pending tuple trees that passed through it "
                "(their groups are replayed)",
                self.slot,
                ", ".join(map(str, sorted(lost))),
                failed,
            )

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> WorkerMetrics:
        """Everything countable: worker counters, connections, queues, bolts, errors, Spark writers."""
        state = self.state
        acker = state.acker
        server = state.server
        return {
            "worker": str(self.slot),
            "topology": self.topology_id,
            "host": self.slot.host,
            "port": self.slot.port,
            "pid": os.getpid(),
            "active": self.active,
            "uptime_s": round(time.time() - self.started_at, 3),
            "rss_bytes": _rss_bytes(),
            "counters": dict(self.counters),
            "backpressure_tasks": self.backpressure.tasks,
            "acker": {
                "pending": len(acker),
                "completed": acker.completed,
                "failed": acker.failed,
                "timed_out": acker.timed_out,
                "failed_on_peer_loss": acker.failed_on_peer_loss,
            },
            "held": self.transfer.held,
            "server": server.metrics() if server is not None else {},
            "connections": {str(s): c.metrics() for s, c in self.connections.items()},
            "transfer_queue": self.transfer.queue.metrics(),
            "executors": {str(spec): e.metrics() for spec, e in self.executors.items()},
            "errors": list(state.errors),
            "writers": self.receiver.writers.snapshot(),
            "checkpoint": state.checkpoints.metrics(),
            "components": {
                cid: {
                    "source": c.source,
                    "spout": c.spout,
                    "bolt": c.bolt,
                    "parallelism": c.parallelism,
                    "tasks": list(state.plan.component_tasks[cid]),
                }
                for cid, c in state.plan.topology.components.items()
            },
        }

    def _start_metrics_http(self) -> None:
        port = self.settings.metrics_port
        if port < 0:
            return
        from spark_storm.worker.http import start_metrics_server

        host = self.settings.metrics_host
        try:
            self._http, self.metrics_port = start_metrics_server(self, host, port)
        except OSError as exc:
            msg = (
                f"topology.worker.metrics.port {port} on {host}: cannot listen ({exc.strerror}); "
                "pick a free port, 0 for any, or -1 to turn it off"
            )
            raise ConfigError(msg) from exc
        logger.info("worker %s: metrics on http://%s:%d/metrics", self.slot, host, self.metrics_port)


def _check_same_topology(old: Plan, new: Plan, slot: Slot) -> None:
    if old.topology.name != new.topology.name:
        msg = f"cannot refresh {old.topology.name!r} with a plan for {new.topology.name!r}"
        raise ConfigError(msg)
    if old.component_tasks != new.component_tasks:
        msg = (
            f"the new plan of {new.topology.name!r} has other components or task ids; a refresh moves "
            "executors between workers but keeps the tasks (kill and resubmit the topology to change them)"
        )
        raise ConfigError(msg)
    if slot not in new.slots:
        msg = f"the new plan of {new.topology.name!r} does not include this worker's slot {slot}; stop this worker"
        raise ConfigError(msg)


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
