"""An executor's emits, held until the end of its batch (Storm's ``ExecutorTransfer``).

Bolts emit through their collectors into the executor's :class:`Emitter`, keyed by
(emitting task, stream, destination task); at the end of the executor's batch
:meth:`Emitter.flush` publishes tuples for local tasks as one queue item per destination,
encodes those for remote tasks (:class:`~spark_storm.codec.Encoder`: one message per
destination, split to fit a frame) for the transfer path, and sends the batch's acker
updates per worker.  Per tuple the hot path is a dict lookup and a list append; locks,
wake-ups, encoding and counters are per batch.

A value no codec can carry fails the tuple that holds it (its trees fail, so a delivery
group is replayed) with an error naming the component, stream, field and type; the
other tuples go on and the executor keeps running.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.encoder import Encoded, Encoder
from spark_storm.codec.tuples import NO_ANCHORS, Anchor, Barrier, Tuple
from spark_storm.messaging import TaskMessage
from spark_storm.worker.acker import FAIL_OP, split_edges
from spark_storm.worker.queue import BatchQueue, QueueItem
from spark_storm.worker.stats import TaskStats

if TYPE_CHECKING:
    import pyarrow as pa

    from spark_storm.worker.state import WorkerState

__all__ = ["EmitKey", "Emitter"]

logger = logging.getLogger(__name__)

#: (emitting task, stream, destination task)
EmitKey = tuple[int, str, int]
_Local = dict[int, tuple[BatchQueue[QueueItem], list[QueueItem], list[int]]]


class Emitter:
    """Emits and acker updates of one executor, flushed at the end of each of its batches.

    Only the owning executor thread adds to it; a bolt that emits from a thread of its
    own gets a fresh emitter flushed at once (see the collectors).
    """

    def __init__(self, host: WorkerState, component: str, stats: Mapping[int, TaskStats]) -> None:
        self._host = host
        self._component = component
        self._stats = stats  # emitted tuples are counted here, per emitting task and flush
        self._encoder = Encoder(host.serializer, host.max_payload_bytes, self._split_anchors)
        self.owner: int | None = None
        self.rows: dict[EmitKey, list[list[Any]]] = {}
        self.anchors: dict[EmitKey, list[list[Anchor]]] = {}
        self.batches: list[tuple[int, str, int, pa.RecordBatch, list[Anchor]]] = []
        self.acks: dict[int, list[list[Any]]] = {}
        #: The generation what is emitted belongs to: the worker's when the executor took the
        #: batch being processed (docs/design/state.md).  A rollback that starts mid-batch makes the
        #: batch's output stale, so peers drop it instead of counting it besides the replay.
        #: None: the worker's current generation (an emitter outside any executor batch).
        self.generation: int | None = None

    @property
    def stats(self) -> Mapping[int, TaskStats]:
        return self._stats

    def fork(self) -> Emitter:
        """Return a fresh emitter for a bolt's own thread (flushed by the caller right after its emit)."""
        emitter = Emitter(self._host, self._component, self._stats)
        emitter.generation = self.generation  # the bolt's thread answers the executor's last batch
        return emitter

    def add_anchored(self, key: EmitKey, values: list[Any], anchors: list[Anchor]) -> None:
        rows = self.rows.setdefault(key, [])
        tracked = self.anchors.get(key)
        if tracked is None:
            tracked = self.anchors[key] = [NO_ANCHORS] * len(rows)
        rows.append(values)
        tracked.append(anchors)

    def acker_op(self, worker_id: int, op: list[Any]) -> None:
        self.acks.setdefault(worker_id, []).append(op)

    def send_barrier(self, source_task: int, epoch: int, generation: int, dests: list[int]) -> None:
        """Send checkpoint barrier ``epoch`` from ``source_task`` to ``dests``, behind everything emitted so far."""
        self.flush()
        host = self._host
        remote: list[TaskMessage] = []
        for dest in dests:
            queue = host.queue_of(dest)
            barrier = Barrier(epoch, generation, source_task)
            if queue is not None:
                if not queue.publish([(dest, barrier)], [0], wait=False):
                    host.reroute([(dest, barrier)], [0])
            else:
                remote.append(self._encoder.barrier(dest, source_task, epoch, generation))
        if remote:
            host.send_remote(remote, [0] * len(remote))

    def _split_anchors(self, anchors: list[Anchor], pieces: int) -> list[list[Anchor]]:
        return split_edges(anchors, pieces, self.acker_op)

    def flush(self) -> None:
        """Publish local emits (one item per destination task), hand remote ones to the transfer path."""
        if not (self.rows or self.batches or self.acks):
            return
        host = self._host
        self._encoder.generation = host.generation if self.generation is None else self.generation
        local: _Local = {}
        remote = Encoded([], [], [])
        rows_out, self.rows = self.rows, {}
        anchors_out, self.anchors = self.anchors, {}
        stats = self._stats
        for key, rows in rows_out.items():
            src, stream, dest = key
            stats[src].emitted += len(rows)
            anchors = anchors_out.get(key)
            queue = host.queue_of(dest)
            if queue is not None:
                source = host.source_of(src, stream)
                tuples = [Tuple(v, source) for v in rows]
                if anchors is not None:
                    for tup, anchor in zip(tuples, anchors, strict=True):
                        tup.anchors = anchor
                self._local(local, queue, dest, tuples, len(tuples))
                continue
            bad_before = len(remote.bad)
            self._encoder.tuples(dest, src, stream, rows, anchors, remote)
            if len(remote.bad) > bad_before:
                self._refused(key, rows, anchors, remote.bad[bad_before:])
        if self.batches:
            batches, self.batches = self.batches, []
            for src, stream, dest, data, edge in batches:
                stats[src].emitted += data.num_rows
                queue = host.queue_of(dest)
                if queue is not None:
                    batch = ColumnarBatch(data, host.source_of(src, stream))
                    batch.anchors = edge
                    self._local(local, queue, dest, batch, data.num_rows)
                else:
                    self._encoder.columnar(dest, src, stream, data, edge, remote)
        for queue, items, item_weights in local.values():
            if not queue.publish(items, item_weights):  # its executor stopped (a refresh moved it)
                host.reroute(items, item_weights)
        if remote.messages:
            host.send_remote(remote.messages, remote.weights)
        if self.acks:
            acks, self.acks = self.acks, {}
            for worker_id, ops in acks.items():
                host.acker_ops(worker_id, ops)

    @staticmethod
    def _local(local: _Local, queue: BatchQueue[QueueItem], dest: int, payload: Any, weight: int) -> None:
        entry = local.get(id(queue))
        if entry is None:
            entry = local[id(queue)] = (queue, [], [])
        entry[1].append((dest, payload))
        entry[2].append(weight)

    def _refused(self, key: EmitKey, rows: list[list[Any]], anchors: list[list[Anchor]] | None, bad: list[Any]) -> None:
        """Tuples a codec could not carry: fail their trees, count and report them."""
        src, stream, dest = key
        host = self._host
        fields = host.plan.topology.components[self._component].fields_of(stream)
        self._stats[src].errors += len(bad)
        for row in bad:
            if anchors is not None:
                for worker, root, _edge in anchors[row.index]:
                    self.acker_op(worker, [FAIL_OP, root, 0])
        first = bad[0]
        msg = (
            f"component {self._component!r} task {src} stream {stream!r}: {len(bad)} emitted tuple(s) to task {dest} "
            f"not sent: {first.describe(fields)}; emit values of the types tuples carry (see "
            "spark_storm.codec.serializer), or convert it first"
        )
        logger.error("%s (first: %r)", msg, rows[first.index])
        host.report_error(self._component, src, msg)
