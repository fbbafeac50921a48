"""The one encoder: rows and columnar batches -> task messages that fit a frame.

Every producer of tuple payloads uses it: the Spark writer (rows for source tasks), an
executor's emits (tuples and batches for bolt tasks on other workers) and a worker
rerouting queue items whose task moved away.  It owns the payload layouts
(:mod:`spark_storm.codec.payloads`) and the frame-size rule: a payload is at most
``max_payload_bytes`` (half of ``storm.messaging.max.frame.bytes`` in a worker), so

* tuples are packed per destination and, when too big, split in halves (order kept)
  until each piece fits or holds one row;
* Arrow batches are sliced so each slice's buffers take at most half the limit;
* a batch that is one edge of tuple trees gets one edge per slice, through the
  ``split_anchors`` hook the worker's acker supplies (the codec knows no acker).

A value no codec can carry does not stop the others: :meth:`Encoder.tuples` leaves its
row out and reports it (:class:`BadRow`), so the caller fails that one tuple.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.payloads import arrow_payload, barrier_payload, columnar_metadata, pack_tuples
from spark_storm.codec.serializer import Serializer, pack_value
from spark_storm.codec.tuples import CLIENT_COMPONENT, Anchor, Barrier, Tuple
from spark_storm.errors import WireFormatError
from spark_storm.messaging import TaskMessage

__all__ = ["BadRow", "Encoded", "Encoder", "SplitAnchors"]

#: ``split_anchors(anchors, n)``: replace one edge per tree by ``n`` new ones (one per piece).
SplitAnchors = Callable[[list[Anchor], int], list[list[Anchor]]]


@dataclass(frozen=True)
class BadRow:
    """A row left out because one of its values cannot be encoded.

    Attributes
    ----------
    index : int
        Position of the row in what was given.
    position : int
        Position of the first bad value in the row (-1: the row as a whole).
    type_name : str
        The bad value's type, ``module.QualName``.
    reason : str
    """

    index: int
    position: int
    type_name: str
    reason: str

    def describe(self, fields: Sequence[str]) -> str:
        """Say which field holds what, e.g. ``field 'ts' holds a zoneinfo.ZoneInfo``."""
        if 0 <= self.position < len(fields):
            where = f"field {fields[self.position]!r}"
        elif self.position >= 0:
            where = f"value #{self.position}"
        else:
            where = "the row"
        return f"{where} holds a {self.type_name}, which {self.reason}"


@dataclass
class Encoded:
    """Messages in send order, the rows each carries, and rows left out."""

    messages: list[TaskMessage]
    weights: list[int]
    bad: list[BadRow]

    def extend(self, other: Encoded) -> None:
        """Append another result (keeps the order)."""
        self.messages.extend(other.messages)
        self.weights.extend(other.weights)
        self.bad.extend(other.bad)


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _find_bad(row: Sequence[Any], index: int) -> BadRow:
    for position, value in enumerate(row):
        try:
            pack_value(value)
        except (TypeError, ValueError, OverflowError) as exc:
            return BadRow(index, position, _type_name(value), f"no codec can carry ({exc})")
    return BadRow(index, -1, _type_name(row), "cannot be encoded as a whole")


class Encoder:
    """Encodes for one sender; reusable, not thread-safe (one per thread, or per call).

    Parameters
    ----------
    serializer : Serializer
        ``topology.serializer`` (tuples in msgpack by default).
    max_payload_bytes : int
        Largest payload to make (a frame's body holds one).
    split_anchors : SplitAnchors, optional
        Needed only to slice a tracked columnar batch (see the module doc).
    """

    def __init__(
        self, serializer: Serializer, max_payload_bytes: int, split_anchors: SplitAnchors | None = None
    ) -> None:
        if max_payload_bytes < 64:
            msg = f"max_payload_bytes must be at least 64, got {max_payload_bytes}"
            raise ValueError(msg)
        self.serializer = serializer
        self.max_payload_bytes = max_payload_bytes
        self._split_anchors = split_anchors
        #: The generation bolt payloads carry (docs/design/state.md); the worker keeps it current.
        self.generation = 0

    # --- to source tasks (clients) --------------------------------------------------------
    def source_rows(self, task: int, rows: Sequence[Sequence[Any]]) -> Encoded:
        """One message per row: the values as an array (the source form any client can send)."""
        out = Encoded([], [], [])
        dumps = self.serializer.dumps
        for i, values in enumerate(rows):
            try:
                payload = dumps(list(values))
            except WireFormatError:
                out.bad.append(_find_bad(values, i))
                continue
            if len(payload) > self.max_payload_bytes:
                out.bad.append(BadRow(i, -1, "row", f"takes {len(payload)} bytes, over the {self.max_payload_bytes}"))
                continue
            out.messages.append(TaskMessage(task, payload))
            out.weights.append(1)
        return out

    def source_arrow(self, task: int, data: pa.RecordBatch, max_rows: int) -> Encoded:
        """Arrow IPC streams of at most ``max_rows`` rows each (what the Spark writer sends)."""
        return self._arrow(task, data, None, None, max_rows, None)

    # --- between bolts --------------------------------------------------------------------
    def tuples(
        self,
        dest: int,
        source_task: int,
        stream: str,
        rows: list[list[Any]],
        anchors: list[list[Anchor]] | None,
        out: Encoded | None = None,
    ) -> Encoded:
        """Encode the tuples one task emitted to ``dest``, in order, in as few messages as fit (into ``out``)."""
        if out is None:
            out = Encoded([], [], [])
        self._tuples(dest, source_task, stream, rows, anchors, 0, out)
        return out

    def _tuples(
        self,
        dest: int,
        src: int,
        stream: str,
        rows: list[list[Any]],
        anchors: list[list[Anchor]] | None,
        offset: int,
        out: Encoded,
    ) -> None:
        try:
            payload = pack_tuples(self.serializer, src, stream, rows, anchors, self.generation)
        except WireFormatError:
            if len(rows) == 1:
                out.bad.append(_find_bad(rows[0], offset))
                return
            payload = None
        if payload is not None and (len(payload) <= self.max_payload_bytes or len(rows) == 1):
            if len(payload) > self.max_payload_bytes:
                out.bad.append(BadRow(offset, -1, "row", f"takes {len(payload)} bytes, over the frame limit"))
                return
            out.messages.append(TaskMessage(dest, payload))
            out.weights.append(len(rows))
            return
        half = len(rows) // 2  # too big for one frame, or a bad value somewhere: halve, keeping the order
        self._tuples(dest, src, stream, rows[:half], anchors[:half] if anchors else None, offset, out)
        self._tuples(dest, src, stream, rows[half:], anchors[half:] if anchors else None, offset + half, out)

    def columnar(
        self,
        dest: int,
        source_task: int,
        stream: str,
        data: pa.RecordBatch,
        anchors: list[Anchor] | None,
        out: Encoded | None = None,
    ) -> Encoded:
        """Encode a batch for a task on another worker: Arrow IPC slices that fit a frame (into ``out``)."""
        return self._arrow(dest, data, (source_task, stream), anchors or None, None, out)

    def _arrow(
        self,
        task: int,
        data: pa.RecordBatch,
        origin: tuple[int, str] | None,
        anchors: list[Anchor] | None,
        max_rows: int | None,
        out: Encoded | None,
    ) -> Encoded:
        if out is None:
            out = Encoded([], [], [])
        n = data.num_rows
        step = n if max_rows is None else max(1, min(n, max_rows))
        budget = self.max_payload_bytes // 2  # buffers plus IPC framing, with room to spare
        if n > 1 and data.nbytes > budget * n / max(1, step):
            step = max(1, min(step, int(n * budget / data.nbytes)))
        starts = range(0, n, step) if n else range(1)
        pieces = [data.slice(start, step) for start in starts]
        per_piece: list[list[Anchor] | None]
        if anchors and len(pieces) > 1:
            if self._split_anchors is None:
                msg = "a tracked batch over a frame needs split_anchors to be sliced"
                raise WireFormatError(msg)
            per_piece = list(self._split_anchors(anchors, len(pieces)))
        else:
            per_piece = [anchors] * len(pieces)
        for piece, piece_anchors in zip(pieces, per_piece, strict=True):
            meta = None if origin is None else columnar_metadata(origin[0], origin[1], piece_anchors, self.generation)
            out.messages.append(TaskMessage(task, arrow_payload(piece, meta)))
            out.weights.append(piece.num_rows)
        return out

    def barrier(self, dest: int, source_task: int, epoch: int, generation: int) -> TaskMessage:
        """Checkpoint barrier ``epoch`` from ``source_task`` for ``dest`` on another worker."""
        return TaskMessage(dest, barrier_payload(self.serializer, source_task, epoch, generation))

    # --- a queue item leaving after all -------------------------------------------------------
    def item(self, task: int, payload: list[Tuple] | ColumnarBatch | Barrier) -> Encoded:
        """Encode an executor-queue item as the message(s) another worker would have received for it.

        Client rows go in the source form (without tuple trees: a tracked client tuple
        rerouted this way times out and its group is replayed); tuples and batches from
        bolts keep their origin and anchors.
        """
        if isinstance(payload, Barrier):
            return Encoded([self.barrier(task, payload.source_task, payload.epoch, payload.generation)], [0], [])
        if isinstance(payload, ColumnarBatch):
            src = payload.source
            if src.component == CLIENT_COMPONENT:
                return self._arrow(task, payload.data, None, None, None, None)
            return self.columnar(task, src.task, src.stream, payload.data, payload.anchors)
        if not payload:
            return Encoded([], [], [])
        src = payload[0].source
        if src.component == CLIENT_COMPONENT:
            return self.source_rows(task, [t.values for t in payload])
        anchors = [t.anchors for t in payload] if any(t.anchors for t in payload) else None
        return self.tuples(task, src.task, src.stream, [t.values for t in payload], anchors)
