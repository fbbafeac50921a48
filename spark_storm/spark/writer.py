"""The writer that runs in each Spark task: route, pack, send groups, wait for acks.

One call of :func:`write_partition` is one Spark task (partition) of one micro-batch:

1. the batch id / query id come from the task's local properties
   (``streaming.sql.batchId``, ``sql.streaming.queryId``) unless given explicitly;
2. Spark's Arrow record batches are joined up to ``maxRowsPerMessage`` x tasks rows
   (:func:`coalesce`), then each is routed to task ids with numpy
   (:mod:`spark_storm.topology.routing`), split per task, and packed into Arrow IPC
   payloads of at most ``maxRowsPerMessage`` rows (no per-row Python work);
3. per destination worker the messages of a joined batch form one *group*, tagged
   (query, batch, partition, sequence) — the sequence counts groups in send order, so
   a retried task sends the very same groups and the workers drop the ones they have;
4. the task returns its commit message only when every group is acknowledged at the
   requested level (``accepted`` / ``processed``) within ``ackTimeoutMs``; otherwise it
   raises, Spark retries it, and the replays are deduplicated.

Connections are pooled per Python worker process (Spark reuses Python workers), so a
micro-batch does not pay a connect and handshake per task.

Cluster mode (``option("zookeeper", ...)``): the plan comes from the assignment the driver
read for this micro-batch; a retried task (attempt > 0: its worker may have died) reads the
current assignment again, and the pool closes its connections to workers that a newer
assignment no longer names.  A task waiting for acks gives up early when a newer
assignment drops one of its plan's workers (trees through it never complete).  Groups are
made per source task there, keyed by (joined batch, task) — ``index << 16 | position of the
task`` — not per worker: a retry on another assignment routes each task's rows to the
task's new worker under the key they had, so a worker that has them (a task that did not
move, or the input log of one that did) drops them as replays, and a worker never takes
other rows for a replay (:func:`delivery_groups`).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from spark_storm.codec.encoder import Encoder
from spark_storm.codec.serializer import MsgpackSerializer
from spark_storm.config import STORM_MAX_FRAME_BYTES, Config
from spark_storm.errors import DeliveryError, StormError, WireFormatError
from spark_storm.messaging import ConnectionStatus, IClient, IContext, TaskMessage
from spark_storm.messaging.wire import FAILED, BatchHeader
from spark_storm.spark.options import StormOptions
from spark_storm.state.protocol import Coordinator
from spark_storm.topology import Slot
from spark_storm.topology.routing import Router, split_by_task
from spark_storm.transport import make_context

__all__ = [
    "POOL",
    "DeliveryError",
    "StormCommitMessage",
    "await_acks",
    "coalesce",
    "commit_batch",
    "delivery_groups",
    "route_batch",
    "write_partition",
]

logger = logging.getLogger(__name__)


@dataclass
class StormCommitMessage:
    """What a writer task reports to the driver's commit/abort."""

    query_id: str
    batch_id: int
    partition: int
    rows: int = 0
    messages: int = 0
    groups: int = 0
    per_worker: dict[str, int] = field(default_factory=dict)


class _Pool:
    """One messaging context and one client per worker slot, per Python process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._contexts: dict[str, IContext] = {}
        self._conns: dict[tuple[str, str, Slot], IClient] = {}
        self._versions: dict[tuple[str, str], int] = {}
        atexit.register(self.close)

    def context_key(self, options: StormOptions) -> str:
        """Return the key naming the context (and connections) ``options`` use."""
        return self._ckey(options)

    @staticmethod
    def _ckey(options: StormOptions) -> str:
        # The user's keys name the context: the defaults under them are the same in every call.
        return repr(sorted((k, repr(v)) for k, v in options.conf.items()))

    def follow(self, options: StormOptions) -> None:
        """Cluster mode: on a newer assignment, close the connections to workers it no longer names.

        They are closed on a thread of their own: a connection to a dead worker may wait its
        flush timeout, and a task must not.
        """
        if not options.assignment_version:
            return
        ckey = self._ckey(options)
        with self._lock:
            seen = self._versions.get((ckey, options.topology_id), 0)
            if options.assignment_version <= seen:
                return
            self._versions[(ckey, options.topology_id)] = options.assignment_version
            keep = set(options.plan.slots)
            stale = [k for k in self._conns if k[0] == ckey and k[1] == options.topology_id and k[2] not in keep]
            closing = [self._conns.pop(k) for k in stale]
        if closing:
            logger.info(
                "storm writer: assignment v%d of %s: closing connections to %s",
                options.assignment_version,
                options.topology_id,
                ", ".join(str(k[2]) for k in stale),
            )
            threading.Thread(target=lambda: [c.close() for c in closing], name="storm-pool-close", daemon=True).start()

    def connection(self, options: StormOptions, slot: Slot) -> IClient:
        ckey = self._ckey(options)
        key = (ckey, options.topology_id, slot)
        with self._lock:
            conn = self._conns.get(key)
            if conn is not None and conn.status is not ConnectionStatus.CLOSED:
                return conn
            ctx = self._contexts.get(ckey)
            if ctx is None:
                ctx = self._contexts[ckey] = make_context(options.messaging_conf())
            conn = self._conns[key] = ctx.connect(options.topology_id, slot.host, slot.port)
            return conn

    def close(self) -> None:
        with self._lock:
            contexts, self._contexts, self._conns = list(self._contexts.values()), {}, {}
        for ctx in contexts:
            ctx.term()


POOL = _Pool()


def _ids(options: StormOptions) -> tuple[str, int, int, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    query_id = options.query_id
    batch_id = options.batch_id
    if ctx is not None:
        query_id = query_id or ctx.getLocalProperty("sql.streaming.queryId")
        if batch_id is None:
            raw = ctx.getLocalProperty("streaming.sql.batchId")
            batch_id = int(raw) if raw is not None else None
    if query_id is None or batch_id is None:
        msg = (
            "storm writer: no query id / batch id (not a streaming micro-batch and none were given); "
            "use writeStream, storm_sink in foreachBatch, or df.write with the driver-made ids"
        )
        raise DeliveryError(msg)
    return query_id, batch_id, partition, attempt


def _encoder(options: StormOptions) -> Encoder:
    frame = Config.of(options.conf).get_int(STORM_MAX_FRAME_BYTES, minimum=1)
    return Encoder(MsgpackSerializer(), max(1024, frame // 2))


def _messages(task: int, rows: pa.RecordBatch, options: StormOptions, encoder: Encoder) -> list[TaskMessage]:
    if options.serializer == "msgpack":  # per row: the opt-in non-vectorised format
        columns = [rows.column(c).to_pylist() for c in options.columns]
        encoded = encoder.source_rows(task, [list(values) for values in zip(*columns, strict=True)])
        if encoded.bad:
            bad = encoded.bad[0]
            msg = (
                f"storm writer: {len(encoded.bad)} row(s) for task {task} cannot be sent with serializer=msgpack: "
                f"{bad.describe(options.columns)}; use the default serializer (arrow), or cast the column"
            )
            raise WireFormatError(msg)
        return encoded.messages
    return encoder.source_arrow(task, rows, options.max_rows).messages


def route_batch(options: StormOptions, router: Router, rb: pa.RecordBatch) -> dict[Slot, list[TaskMessage]]:
    """Route one record batch to the source's tasks and pack it: the messages per destination worker.

    The one routing of every Spark writer (``format("storm")``, ``storm_sink``, ``storm_foreach``).
    """
    payload_cols = rb.select(list(options.columns))
    if router.grouping == "direct" or router.grouping == "fields":  # routing columns may not be sent
        pieces = split_by_task(payload_cols, router.route(rb), options.tasks)
    else:
        pieces = router.split(payload_cols)
    task_slot = options.plan.task_slot
    encoder = _encoder(options)
    by_slot: dict[Slot, list[TaskMessage]] = {}
    for task, rows in pieces:
        by_slot.setdefault(task_slot[task], []).extend(_messages(task, rows, options, encoder))
    return by_slot


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """``pa.concat_batches`` (pyarrow >= 19), also on pyarrow 18 (the floor: a runtime's own pyarrow)."""
    if hasattr(pa, "concat_batches"):
        return pa.concat_batches(batches)
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def coalesce(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Join consecutive record batches until each holds at least ``rows`` rows (the last may hold fewer).

    Spark hands a writer batches of ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows
    (10,000), which routing cuts into one piece per task: joined first, the pieces reach
    ``maxRowsPerMessage`` and a partition is sent in fewer, fuller groups.  Deterministic in
    the batches it is given, so a retried task sends the same groups.  Empty batches go.
    """
    held: list[pa.RecordBatch] = []
    count = 0
    for rb in batches:
        if rb.num_rows == 0:
            continue
        if not held and rb.num_rows >= rows:
            yield rb
            continue
        held.append(rb)
        count += rb.num_rows
        if count >= rows:
            yield held[0] if len(held) == 1 else _concat(held)
            held, count = [], 0
    if held:
        yield held[0] if len(held) == 1 else _concat(held)


#: Cluster mode: a group's sequence is ``joined batch index << _TASK_BITS | position of its task``.
_TASK_BITS = 16


def delivery_groups(
    options: StormOptions, index: int, sequence: int, messages: list[TaskMessage]
) -> list[tuple[int, list[TaskMessage]]]:
    """Split what one worker gets from joined batch ``index`` into delivery groups: (sequence, messages).

    Static mode: one group, numbered in send order (``sequence``: the groups sent so far);
    the plan never changes, so a retry makes the same groups under the same keys.  Cluster
    mode: one group per source task, numbered by (``index``, the task's position among the
    component's tasks), whatever the assignment: the rows of a task in a joined batch are
    the same in every attempt (the routing depends on the tasks, not on the workers), so a
    retry on a newer assignment sends them under the key they had, wherever the task now
    runs — a worker that has them logged (a stateful topology's input log moves with its
    task) or delivered drops them as a replay.
    """
    if not options.assignment_version:
        return [(sequence, messages)]
    by_task: dict[int, list[TaskMessage]] = {}
    for message in messages:
        by_task.setdefault(message.task, []).append(message)
    position = {task: i for i, task in enumerate(options.tasks)}
    return [((index << _TASK_BITS) | position[task], group) for task, group in sorted(by_task.items())]


def write_partition(options: StormOptions, batches: Iterable[pa.RecordBatch]) -> StormCommitMessage:
    """Send one partition of one micro-batch; return only once it is acknowledged."""
    query_id, batch_id, partition, attempt = _ids(options)
    if attempt > 0 and options.zookeeper is not None:
        before = options.assignment_version
        options = options.with_current_assignment()
        if options.assignment_version != before:
            logger.info(
                "storm writer: retry %d of batch %d partition %d uses assignment v%d of %s (was v%d)",
                attempt,
                batch_id,
                partition,
                options.assignment_version,
                options.topology_id,
                before,
            )
    POOL.follow(options)
    router = Router(options.tasks, options.grouping, options.key_columns, options.task_column, partition)
    result = StormCommitMessage(query_id, batch_id, partition)
    pending: dict[Slot, list[tuple[str, int, int, int]]] = {}
    sequence = 0
    started = time.monotonic()
    conns: dict[Slot, IClient] = {}
    for index, rb in enumerate(coalesce(batches, options.max_rows * len(options.tasks))):
        by_slot = route_batch(options, router, rb)
        for slot in sorted(by_slot):
            msgs = by_slot[slot]
            conn = conns.get(slot) or conns.setdefault(slot, POOL.connection(options, slot))
            if options.delivery:
                for number, group in delivery_groups(options, index, sequence, msgs):
                    header = BatchHeader(
                        query_id, batch_id, partition, number, len(group), options.delivery, coordinated=True
                    )
                    conn.send_group(header, group)
                    pending.setdefault(slot, []).append(header.key)
                    sequence += 1
            else:
                conn.send(msgs)
            result.messages += len(msgs)
            result.per_worker[str(slot)] = result.per_worker.get(str(slot), 0) + len(msgs)
        result.rows += rb.num_rows
    result.groups = sequence
    if options.delivery:
        await_acks(options, pending, query_id, batch_id, partition)
    else:
        for name in result.per_worker:
            host, _, port = name.rpartition(":")
            POOL.connection(options, Slot(host, int(port))).flush(options.ack_timeout_s)
    logger.info(
        "storm writer: query %s batch %d partition %d attempt %d sent %d rows in %d groups in %.3fs",
        query_id,
        batch_id,
        partition,
        attempt,
        result.rows,
        result.groups,
        time.monotonic() - started,
    )
    return result


def _final(status: int | None, required: int) -> bool:
    return status is not None and (status >= required or status == FAILED)


def _dropped_workers(options: StormOptions) -> list[Slot]:
    """Cluster mode: workers of the task's plan that the current assignment no longer has (dead, moved)."""
    from spark_storm.errors import ZooKeeperUnavailableError

    try:
        current = options.with_current_assignment(settle=False)
    except ZooKeeperUnavailableError:
        return []  # ZooKeeper away: keep waiting for the acks
    if current.assignment_version <= options.assignment_version:
        return []
    return sorted(set(options.plan.slots) - set(current.plan.slots))


def await_acks(
    options: StormOptions,
    pending: dict[Slot, list[tuple[str, int, int, int]]],
    query_id: str,
    batch_id: int,
    partition: int,
) -> None:
    """Wait, within ``ackTimeoutMs``, until every pending group is acknowledged at the delivery level.

    In cluster mode the wait also ends early when a newer assignment drops a worker of this
    task's plan while acks are still missing: tuple trees through a lost worker never
    complete, so the retry (on the new assignment) starts now rather than at ``ackTimeoutMs``.

    Raises
    ------
    DeliveryError
        A worker reported a group FAILED, an ack did not come in time, or (cluster mode) a worker
        the task sent to was dropped from the assignment (Spark retries the task).
    """
    deadline = time.monotonic() + options.ack_timeout_s
    level = "processed" if options.delivery == 2 else "accepted"
    for slot, keys in pending.items():
        conn = POOL.connection(options, slot)
        got: dict[tuple[str, int, int, int], int] = {}
        while True:
            waiting = [k for k in keys if not _final(got.get(k), options.delivery)]
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0:
                break
            step = remaining if options.zookeeper is None else min(remaining, 1.0)
            got.update(conn.wait_acks(waiting, options.delivery, step))
            if options.zookeeper is None or all(_final(got.get(k), options.delivery) for k in waiting):
                continue
            dropped = _dropped_workers(options)
            if dropped:
                missing = [k for k in keys if not _final(got.get(k), options.delivery)]
                msg = (
                    f"a new assignment of {options.topology_id} dropped worker(s) {', '.join(map(str, dropped))} "
                    f"while {len(missing)} of {len(keys)} groups of query {query_id} batch {batch_id} partition "
                    f"{partition} sent to {slot} wait for their {level} ack; Spark will retry the task on the new "
                    "assignment and the workers drop what they already have"
                )
                raise DeliveryError(msg)
        failed = [k for k, s in got.items() if s == FAILED]
        missing = [k for k in keys if k not in got or (got[k] < options.delivery and got[k] != FAILED)]
        if failed:
            msg = (
                f"worker {slot} reported FAILED for {len(failed)} of {len(keys)} groups of query {query_id} "
                f"batch {batch_id} partition {partition} (a bolt failed a tuple, a payload was rejected, or the "
                "worker restarted and lost them; see that worker's log); Spark will retry the task"
            )
            raise DeliveryError(msg)
        if missing:
            msg = (
                f"no {level} ack from worker {slot} for {len(missing)} of {len(keys)} groups of query {query_id} "
                f"batch {batch_id} partition {partition} within ackTimeoutMs={options.ack_timeout_s * 1000:.0f} "
                f"(connection {conn.status.value}, last error: {conn.metrics().get('last_error')}); "
                "Spark will retry the task and the worker drops what it already has"
            )
            raise DeliveryError(msg)


def commit_batch(options: StormOptions, messages: Iterable[Any], batch_id: int) -> None:
    """Driver side: tell every worker the batch is final so it can forget its dedupe state.

    The workers are the plan's and those the tasks report having sent to (in cluster mode
    the plan may have changed meanwhile).  Best effort, under one deadline: a worker that is
    not reachable forgets the batch when it is replaced or its ledger is full.
    """
    done = [m for m in messages if isinstance(m, StormCommitMessage)]
    POOL.follow(options)
    for query_id in sorted({m.query_id for m in done}):
        checkpoint_batch(options, query_id, batch_id)
    slots = set(options.plan.slots)
    for m in done:
        for name in m.per_worker:
            host, _, port = name.rpartition(":")
            slots.add(Slot(host, int(port)))
    conns = {slot: POOL.connection(options, slot) for slot in sorted(slots)}
    for query_id in sorted({m.query_id for m in done}):
        for slot, conn in conns.items():
            try:
                conn.send_commit(query_id, batch_id)
            except StormError as exc:
                logger.warning(
                    "storm commit of %s/%d to %s failed (%s); the worker keeps its state longer",
                    query_id,
                    batch_id,
                    slot,
                    exc,
                )
    deadline = time.monotonic() + 5.0
    for conn in conns.values():
        # A new connection is ready in milliseconds; one to a dead worker must not hold the commit.
        if conn.wait_ready(min(1.0, max(0.0, deadline - time.monotonic()))):
            conn.flush(max(0.0, deadline - time.monotonic()))


#: Topologies (by connection key and name) found to have no stateful component, and when.
_STATELESS: dict[tuple[str, str], float] = {}
_STATELESS_TTL_S = 60.0


def checkpoint_batch(options: StormOptions, query_id: str, batch_id: int) -> None:
    """Driver side, before the commit returns: make every stateful task's state durable with this batch.

    The sink's ``commit(batchId)`` is the coordinator of the checkpoint protocol
    (docs/design/state.md): it rolls the topology back first if a worker failed during the
    batch, and returns only once every stateful task has written the epoch holding the
    batch.  A topology without stateful components answers in one round trip (and is
    remembered for a minute).

    Raises
    ------
    CheckpointError
        The round did not complete (the reason says why); Spark fails the query, whose
        restart from its checkpoint replays the batch exactly.
    """
    ckey = (POOL.context_key(options), options.topology_id)
    known = _STATELESS.get(ckey)
    if known is not None and time.monotonic() - known < _STATELESS_TTL_S:
        return
    conf = Config.of({**options.plan.topology.conf, **dict(options.conf)})

    def endpoints() -> dict[str, IClient]:
        # Cluster mode: the workers of the assignment now (a rebalance or a reassignment may
        # have moved tasks since the batch was planned), asked again for every attempt.
        current = options.with_current_assignment(settle=False) if options.zookeeper is not None else options
        POOL.follow(current)
        return {str(slot): POOL.connection(current, slot) for slot in current.plan.slots}

    coordinator = Coordinator(
        f"spark query {query_id} (driver pid {os.getpid()})",
        endpoints,
        conf.get_int("topology.state.commit.timeout.ms", minimum=1) / 1000,
        conf.get_int("topology.state.commit.retries", minimum=1),
    )
    result = coordinator.checkpoint({query_id: batch_id})
    if not result.stateful:
        _STATELESS[ckey] = time.monotonic()
        return
    logger.info(
        "storm commit: query %s batch %d is in epoch %d (%.3fs%s)",
        query_id,
        batch_id,
        result.epoch,
        result.duration_s,
        f", after a rollback to epoch {result.rolled_back_to}" if result.rolled_back_to is not None else "",
    )


def rows_of(messages: Iterable[Any]) -> int:
    """Total rows in a list of commit messages."""
    return sum(m.rows for m in messages if isinstance(m, StormCommitMessage))
