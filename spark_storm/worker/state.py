"""Storm's ``WorkerState``: the hub every part of a worker shares.

As in Storm, one object holds what the receive path, the transfer path and the
executors share — the plan and where this worker is in it, the task -> queue map, the
connections, the codec, the acker — and they all take it directly: there is one
implementation and no second one to hide behind a protocol.  It builds its parts at
construction (the :class:`~spark_storm.worker.receive.Receiver`, the
:class:`~spark_storm.worker.transfer.WorkerTransfer`, the
:class:`~spark_storm.worker.transfer.BackPressureTracker`), so a unit test gets a whole
worker's paths, without threads or processes, from ``WorkerState(plan, slot, conf,
settings, request_stop)``.  A plan change swaps the plan, the task maps and the
connections under one lock (:meth:`WorkerState.swap`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from spark_storm.codec.encoder import Encoder
from spark_storm.codec.serializer import Serializer, make_serializer
from spark_storm.codec.tuples import CLIENT_COMPONENT, Anchor, TupleSource
from spark_storm.config import Config
from spark_storm.errors import ConfigError, WireFormatError
from spark_storm.messaging import IClient, IContext, IServer, TaskMessage
from spark_storm.reports import ErrorReport
from spark_storm.topology.assignment import ExecutorSpec, Plan, Slot
from spark_storm.topology.model import DEFAULT_STREAM, resolve_class
from spark_storm.transport import make_context
from spark_storm.worker.acker import ACK_OP, ACKER_TASK, FAIL_OP, Acker, anchors_of, split_edges, worker_id
from spark_storm.worker.checkpoint import CheckpointManager, Checkpoints, NoCheckpoints, topology_is_stateful
from spark_storm.worker.executor import Executor
from spark_storm.worker.factory import make_executor
from spark_storm.worker.queue import BatchQueue, QueueItem
from spark_storm.worker.receive import Receiver
from spark_storm.worker.settings import WorkerSettings
from spark_storm.worker.transfer import BackPressureTracker, WorkerTransfer

__all__ = ["WorkerState"]

logger = logging.getLogger(__name__)

_MAX_CLIENT_STREAMS = 256


def _stream_fields(plan: Plan, task: int, stream: str) -> tuple[str, ...]:
    """Return the declared fields of ``task``'s component on ``stream`` (WireFormatError if none)."""
    component = plan.task_component.get(task)
    if component is None:
        msg = f"tuples claim to come from task {task}, which this topology does not have"
        raise WireFormatError(msg)
    fields = plan.topology.components[component].fields_of(stream)
    if not fields and stream != DEFAULT_STREAM:
        msg = f"tuples claim stream {stream!r} of {component!r}, which it does not declare"
        raise WireFormatError(msg)
    return fields


def _task_workers(plan: Plan, here: Slot) -> dict[int, int]:
    """Map each task another worker runs to that worker's id."""
    ids = {slot: worker_id(slot) for slot in plan.slots if slot != here}
    return {task: ids[slot] for task, slot in plan.task_slot.items() if slot in ids}


def _worker_ids(plan: Plan) -> dict[int, Slot]:
    """Map the plan's slots by worker id (ConfigError if two slots share one)."""
    ids = {worker_id(s): s for s in plan.slots}
    if len(ids) != len(plan.slots):
        clash = sorted(map(str, plan.slots))
        msg = f"two worker slots of {plan.topology.name!r} hash to one worker id ({', '.join(clash)}); change a port"
        raise ConfigError(msg)
    return ids


class WorkerState:
    """The shared state of one worker, and its receive, transfer and backpressure parts.

    Parameters
    ----------
    plan : Plan
    slot : Slot
    conf : Config
        Worker configuration (topology conf already merged).
    settings : WorkerSettings
    request_stop : callable
        The worker's ``request_stop(reason, failure=...)``.
    """

    def __init__(
        self,
        plan: Plan,
        slot: Slot,
        conf: Config,
        settings: WorkerSettings,
        request_stop: Callable[..., None],
    ) -> None:
        self._plan = plan
        self._slot = slot
        self.conf = conf
        self.settings = settings
        self.topology_id = plan.topology.name
        self._serializer = make_serializer(conf)
        self._worker_id = worker_id(slot)
        self._workers = _worker_ids(plan)
        self._task_workers = _task_workers(plan, slot)
        self._local_tasks = frozenset(plan.tasks_of(slot))
        self._acker = Acker()
        self._max_payload = max(1024, conf.get_int("storm.messaging.max.frame.bytes", minimum=1) // 2)
        self._encoder = Encoder(self._serializer, self._max_payload, self._split_anchors)
        self._request_stop = request_stop
        self.lock = threading.RLock()  # the plan swap, the source cache's misses, the reroute encoder
        self.context: IContext = make_context(conf)
        self.server: IServer | None = None
        self._connections: dict[Slot, IClient] = {}
        self.executors: dict[ExecutorSpec, Executor] = {}
        self._task_queue: dict[int, BatchQueue[QueueItem]] = {}
        self._task_kind: dict[int, str] = {}
        self._sources: dict[tuple[int, str], TupleSource] = {}
        self._client_sources: dict[int, TupleSource] = {}
        self.errors: deque[ErrorReport] = deque(maxlen=50)
        #: Checkpoints, input logs and rollbacks (a stand-in that does nothing without state).
        self.checkpoints: Checkpoints = NoCheckpoints(self)
        bolts = {c.id: resolve_class(c.bolt, f"component {c.id!r} bolt") for c in plan.topology.components.values()}
        if topology_is_stateful(bolts):
            if settings.receiver_mode != "push":
                msg = (
                    f"topology {plan.topology.name!r} has stateful components, whose checkpoints need "
                    "topology.receiver.mode: push (it is pull)"
                )
                raise ConfigError(msg)
            self.checkpoints = CheckpointManager(self, conf)
        self.receiver = Receiver(self, settings.dead_letter_file)
        self.transfer = WorkerTransfer(self, settings)
        self.backpressure = BackPressureTracker(str(slot), lambda: self.server)

    # --- what the protocols read ------------------------------------------------------
    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def slot(self) -> Slot:
        return self._slot

    @property
    def worker_id(self) -> int:
        return self._worker_id

    @property
    def local_tasks(self) -> frozenset[int]:
        return self._local_tasks

    @property
    def serializer(self) -> Serializer:
        return self._serializer

    @property
    def generation(self) -> int:
        """The topology's generation as this worker knows it (0 unless a rollback happened; docs/design/state.md)."""
        return self.checkpoints.generation

    @property
    def acker(self) -> Acker:
        return self._acker

    @property
    def max_payload_bytes(self) -> int:
        return self._max_payload

    @property
    def connections(self) -> Mapping[Slot, IClient]:
        return self._connections

    def queue_of(self, task: int) -> BatchQueue[QueueItem] | None:
        return self._task_queue.get(task)

    def remote_worker_of(self, task: int) -> int:
        """Return the id of the other worker that runs ``task``; -1 when it runs here (or nowhere).

        Every tracked emit asks (one dict lookup: the ids are made once per plan).
        """
        return self._task_workers.get(task, -1)

    def kind_of(self, task: int) -> str | None:
        return self._task_kind.get(task)

    def all_queues(self) -> list[BatchQueue[QueueItem]]:
        return [e.queue for e in self.executors.values()]

    def source_of(self, task: int, stream: str) -> TupleSource:
        source = self._sources.get((task, stream))
        if source is not None:
            return source
        with self.lock:  # a miss: the receive thread and executor threads fill the cache (docs/design/threads.md)
            sources = self._sources
            source = sources.get((task, stream))
            if source is not None:
                return source
            if task == -1:  # a client using the bolt form (a broadcast): no declared fields
                source = TupleSource(CLIENT_COMPONENT, -1, stream, ())
                if sum(1 for t, _ in sources if t == -1) >= _MAX_CLIENT_STREAMS:
                    return source  # do not let clients grow the cache without bound
            else:
                fields = _stream_fields(self._plan, task, stream)
                source = TupleSource(self._plan.task_component[task], task, stream, fields)
            sources[(task, stream)] = source
            return source

    def client_source(self, task: int) -> TupleSource:
        component = self._plan.task_component[task]
        source = self._client_sources.get(task)
        if source is None:
            fields = self._plan.topology.components[component].fields_of(DEFAULT_STREAM)
            source = self._client_sources[task] = TupleSource(CLIENT_COMPONENT, -1, DEFAULT_STREAM, fields)
        return source

    # --- what the protocols call ------------------------------------------------------
    def send_remote(self, messages: list[TaskMessage], weights: list[int]) -> None:
        """Hand messages for tasks on other workers to the transfer path (waits while it is full)."""
        self.transfer.publish(messages, weights)

    def forward(self, messages: list[TaskMessage]) -> None:
        """Pass on messages for tasks that moved to another worker."""
        self.transfer.publish(messages, [1] * len(messages))

    def reroute(self, items: list[QueueItem], weights: list[int]) -> None:
        for (task, payload), weight in zip(items, weights, strict=True):
            queue = self.queue_of(task)
            if queue is not None and queue.publish([(task, payload)], [weight]):
                continue
            where = self._plan.task_slot.get(task)
            if where is None or where == self._slot:  # gone, or its executor stopped with the worker
                self.data_lost(
                    f"{weight} tuples for task {task} dropped: its executor has stopped",
                    task=task,
                    tuples=weight,
                    anchors=anchors_of(payload),
                )
                continue
            with self.lock:  # the receive thread and executor threads reroute; one encoder
                self._encoder.generation = self.generation  # what is rerouted is of the generation now
                encoded = self._encoder.item(task, payload)
            if encoded.bad:
                logger.error(
                    "worker %s: %d tuples for task %d that moved to %s cannot be encoded (%s); dropped",
                    self._slot,
                    len(encoded.bad),
                    task,
                    where,
                    encoded.bad[0].reason,
                )
                self._fail_rows(payload, [b.index for b in encoded.bad])
            if encoded.messages:
                self.send_remote(encoded.messages, encoded.weights)

    def _split_anchors(self, anchors: list[Any], pieces: int) -> list[list[Any]]:
        return split_edges(anchors, pieces, lambda worker, op: self.acker_ops(worker, [op]))

    def _fail_rows(self, payload: Any, rows: list[int]) -> None:
        if isinstance(payload, list):
            for i in rows:
                for worker, root, _edge in payload[i].anchors:
                    self.acker_ops(worker, [[FAIL_OP, root, 0]])

    def unknown(self, messages: list[TaskMessage]) -> None:
        """Messages the transfer path found no worker for: counted, logged, dropped or dead-lettered."""
        self.receiver.unknown(messages)
        # this worker's own emits: a hole in the state
        self.checkpoints.mark_dirty(f"{len(messages)} emitted messages for tasks no worker runs were dropped")

    def data_lost(
        self,
        what: str,
        *,
        task: int,
        payloads: int = 0,
        tuples: int = 0,
        anchors: Iterable[Anchor] = (),
    ) -> None:
        """Something that entered the topology is gone: fail what it belonged to, never leave a silent gap.

        ``what`` says what was lost and why (a payload from another worker that no decoder
        reads, acker updates that cannot be read, tuples for an executor that stopped).
        The tuple trees it belonged to (``anchors``, where known) fail now, so their
        delivery groups end at once instead of at the message timeout; a stateful worker
        marks itself dirty, so the next checkpoint round rolls every worker back and
        replays the input logs instead of committing past the hole (docs/design/state.md).  It is
        counted (``lost_payloads`` and ``lost_tuples`` in ``/health``, Prometheus and the UI),
        logged, and reported among the worker's errors.
        """
        self.receiver.count("lost_payloads", payloads)
        self.receiver.count("lost_tuples", tuples)
        roots: dict[int, set[int]] = {}
        for worker, root, _edge in anchors:
            roots.setdefault(worker, set()).add(root)
        for worker, of_worker in roots.items():
            self.acker_ops(worker, [[FAIL_OP, root, 0] for root in sorted(of_worker)])
        failed = sum(map(len, roots.values()))
        checkpoints = self.checkpoints
        checkpoints.mark_dirty(what)
        component = self._plan.task_component.get(task, "?")
        self.report_error(component, task, f"lost: {what}")
        logger.error(
            "worker %s: %s; %d tuple trees failed%s",
            self._slot,
            what,
            failed,
            "; state marked dirty (the next round rolls back)" if checkpoints.stateful else "",
        )

    def messages_lost(self) -> dict[IClient, int]:
        """Messages each open connection to another worker counted as lost."""
        out: dict[IClient, int] = {}
        for conn in list(self._connections.values()):
            lost = conn.metrics().get("lost", 0)
            out[conn] = int(lost) if isinstance(lost, int | float) else 0
        return out

    def deliver_local(self, messages: list[TaskMessage]) -> None:
        """Messages queued for a remote task that a refresh has since moved here."""
        self.receiver.transfer_local([m.task for m in messages], [m.payload for m in messages])

    def acker_ops(self, worker: int, ops: list[list[Any]]) -> None:
        if worker == self._worker_id:
            acker = self._acker
            for op in ops:
                if op[0] == ACK_OP:
                    acker.update(op[1], op[2], op[3] if len(op) > 3 else ())
                else:
                    acker.fail(op[1])
            return
        slot = self._workers.get(worker)
        conn = self._connections.get(slot) if slot is not None else None
        if conn is None:
            # its root worker left the plan (its trees fail there, or time out): nothing to tell
            logger.warning(
                "worker %s: no connection to the worker with id %d (%s) for %d acker updates",
                self._slot,
                worker,
                slot or "not in the plan",
                len(ops),
            )
            return
        conn.send([TaskMessage(ACKER_TASK, self._serializer.dumps(ops))])

    def get_load(self, tasks: Iterable[int]) -> Mapping[int, float]:
        wanted = list(tasks)
        queues = self._task_queue
        out = {t: queues[t].load for t in wanted if t in queues}
        task_slot = self._plan.task_slot
        for slot, conn in self._connections.items():
            remote = [t for t in wanted if task_slot.get(t) == slot]
            if remote:
                out.update(conn.get_load(remote))
        return out

    def task_loads(self) -> dict[int, float]:
        """Load of every local task: its executor queue's fill (0..1)."""
        return {t: q.load for t, q in self._task_queue.items()}

    def request_stop(self, reason: str, *, failure: bool = True) -> None:
        self._request_stop(reason, failure=failure)

    def report_error(self, component: str, task: int, error: str) -> None:
        self.errors.append(
            {"time": time.time(), "worker": str(self._slot), "component": component, "task": task, "error": error[:500]}
        )

    # --- building and swapping ------------------------------------------------------------
    def build_executor(self, spec: ExecutorSpec) -> Executor:
        """Build an executor (and its queue) for ``spec``, not yet started nor routed to."""
        s = self.settings
        queue: BatchQueue[QueueItem] = BatchQueue(
            s.executor_queue_size,
            str(spec),
            s.bp_high,
            s.bp_low,
            on_high=lambda: self.backpressure.update(spec, queue),
            on_low=lambda: self.backpressure.update(spec, queue),
        )
        return make_executor(self, spec, queue, s, self.conf)

    def route_to(self, executors: Mapping[ExecutorSpec, Executor]) -> None:
        """Make ``executors`` (and only they) the local destinations of their tasks."""
        queues: dict[int, BatchQueue[QueueItem]] = {}
        kinds: dict[int, str] = {}
        for spec, executor in executors.items():
            for task in spec.tasks:
                queues[task] = executor.queue
                kinds[task] = executor.kind
        self._task_queue, self._task_kind = queues, kinds
        self.executors = dict(executors)

    def swap(self, plan: Plan, connections: dict[Slot, IClient], executors: Mapping[ExecutorSpec, Executor]) -> None:
        """Switch to a new plan, connections and local executors at once."""
        with self.lock:
            self._plan = plan
            self._workers = {**self._workers, **_worker_ids(plan)}  # old ids stay known for late acks
            self._task_workers = _task_workers(plan, self._slot)
            self._local_tasks = frozenset(plan.tasks_of(self._slot))
            self._sources = {}
            self._client_sources = {}
            self._connections = connections
            self.route_to(executors)

    def set_connections(self, connections: dict[Slot, IClient]) -> None:
        with self.lock:
            self._connections = connections
