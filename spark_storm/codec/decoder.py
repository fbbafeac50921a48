"""The two decoders: what clients send to source tasks, and what bolts send each other.

Both take the payloads one network read holds for one task and return, in order, the
executor-queue payloads they make: a list of :class:`~spark_storm.codec.tuples.Tuple`
or one :class:`~spark_storm.codec.columnar.ColumnarBatch`, each with its weight in rows.
Every check on bytes that came off a socket happens here (magic bytes, shapes, arity,
declared fields); the receive path only routes what comes out.  A bad payload is handed
to ``on_bad`` (which may raise, to reject a whole delivery group) and the rest go on.

* :class:`SourceDecoder` — rows for a source task: msgpack arrays of values (one tuple
  each) and/or Arrow IPC streams (many rows, columns matched to the source's fields by
  name), turned into the shape the task's executor runs (tuples, or columnar batches);
* :class:`BoltDecoder` — tuples and batches from another worker's bolts, with their
  origin (source task, stream) and tuple-tree anchors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import pyarrow as pa

from spark_storm.codec.columnar import ColumnarBatch, batch_from_rows, rows_of, select_fields
from spark_storm.codec.payloads import ARROW_STREAM_MAGIC, read_arrow, unpack_bolt
from spark_storm.codec.serializer import Serializer
from spark_storm.codec.tuples import CHECKPOINT_STREAM, Barrier, Tuple, TupleSource
from spark_storm.errors import WireFormatError

__all__ = ["BadPayload", "BoltDecoder", "Decoded", "SourceDecoder"]

#: An executor-queue payload and its weight in rows (a barrier weighs 0).
Decoded = tuple[list[Tuple] | ColumnarBatch | Barrier, int]
#: ``on_bad(error, payload)``: told about each payload that cannot be decoded (may raise to stop).
BadPayload = Callable[[Exception, bytes], None]

_PAYLOAD: Final = "an Arrow payload"
_SEND_FIELDS: Final = "send a column per declared field (extra columns are ignored)"


class SourceDecoder:
    """Payloads a client (Spark, or any program) sent to a source task."""

    def __init__(self, serializer: Serializer) -> None:
        self._serializer = serializer

    def decode(self, payloads: list[bytes], source: TupleSource, columnar: bool, on_bad: BadPayload) -> list[Decoded]:
        """Decode in order; ``columnar``: the task runs a batch bolt (else tuples).

        Runs of msgpack rows become one item each; every Arrow payload becomes one item.
        """
        nfields = len(source.fields)
        out: list[Decoded] = []
        if payloads[0][:4] != ARROW_STREAM_MAGIC:
            try:  # the usual case for msgpack clients: all rows, all well formed
                rows = self._serializer.loads_many(payloads)
            except WireFormatError:
                rows = None
            well_formed = rows is not None and set(map(type, rows)) <= {list}
            if well_formed and (not nfields or set(map(len, rows)) <= {nfields}):  # type: ignore[arg-type]
                self._rows(rows, source, columnar, out)  # type: ignore[arg-type]
                return out
        pending: list[list[Any]] = []
        for payload in payloads:
            try:
                if payload[:4] == ARROW_STREAM_MAGIC:
                    data, _origin = read_arrow(payload)
                    data = select_fields(data, source.fields, _PAYLOAD, _SEND_FIELDS)
                    if pending:
                        self._rows(pending, source, columnar, out)
                        pending = []
                    self._arrow(data, source, columnar, out)
                    continue
                values = self._serializer.loads(payload)
                if type(values) is not list:
                    msg = f"a source tuple must be an array of values, got {type(values).__name__}"
                    raise WireFormatError(msg)
                if nfields and len(values) != nfields:
                    msg = f"a source tuple for {list(source.fields)} has {len(values)} values"
                    raise WireFormatError(msg)
                pending.append(values)
            except WireFormatError as exc:
                on_bad(exc, payload)
        if pending:
            self._rows(pending, source, columnar, out)
        return out

    @staticmethod
    def _rows(rows: list[list[Any]], source: TupleSource, columnar: bool, out: list[Decoded]) -> None:
        if columnar:
            out.append((ColumnarBatch(batch_from_rows(rows, source.fields), source), len(rows)))
        else:
            out.append(([Tuple(v, source) for v in rows], len(rows)))

    @staticmethod
    def _arrow(data: pa.RecordBatch, source: TupleSource, columnar: bool, out: list[Decoded]) -> None:
        if columnar:
            out.append((ColumnarBatch(data, source), data.num_rows))
        else:
            out.append(([Tuple(v, source) for v in rows_of(data)], data.num_rows))


class BoltDecoder:
    """Tuples and columnar batches another worker's bolts sent to a bolt task.

    Parameters
    ----------
    serializer : Serializer
    source_of : callable
        ``source_of(source_task, stream)`` -> the shared :class:`TupleSource` (raises
        WireFormatError for a task or stream the topology does not have).
    generation : callable, optional
        The receiving worker's generation: payloads of an older one are dropped (counted
        in :attr:`stale`): a rollback made them void (docs/design/state.md).
    on_stale : callable, optional
        Told about each dropped tuple list or batch (the worker fails their trees, so the
        sender's delivery groups end now instead of at the message timeout).
    """

    def __init__(
        self,
        serializer: Serializer,
        source_of: Callable[[int, str], TupleSource],
        generation: Callable[[], int] = lambda: 0,
        on_stale: Callable[[list[Tuple] | ColumnarBatch], None] | None = None,
    ) -> None:
        self._serializer = serializer
        self._source_of = source_of
        self._generation = generation
        self._on_stale = on_stale
        self.stale = 0

    def decode(self, payloads: list[bytes], on_bad: BadPayload) -> list[Decoded]:
        """Decode in order; tuples keep their anchors, a batch its one edge, barriers come as :class:`Barrier`."""
        out: list[Decoded] = []
        current = self._generation()
        for payload in payloads:
            try:
                item, generation = self._one(payload)
            except (WireFormatError, KeyError) as exc:
                on_bad(exc, payload)
                continue
            if generation < current:
                self.stale += item[1] or 1
                dropped = item[0]
                if self._on_stale is not None and not isinstance(dropped, Barrier):
                    self._on_stale(dropped)
                continue
            out.append(item)
        return out

    def _one(self, payload: bytes) -> tuple[Decoded, int]:
        if payload[:4] == ARROW_STREAM_MAGIC:
            data, origin = read_arrow(payload)
            if origin is None:
                msg = "an Arrow payload for a bolt task needs storm metadata (source task, stream)"
                raise WireFormatError(msg)
            src, stream, anchors, generation = origin
            source = self._source_of(src, stream)
            batch = ColumnarBatch(select_fields(data, source.fields, _PAYLOAD, _SEND_FIELDS), source)
            if anchors:
                batch.anchors = anchors
            return (batch, data.num_rows), generation
        src, stream, rows, row_anchors, generation = unpack_bolt(self._serializer, payload)
        if stream == CHECKPOINT_STREAM:
            return self._barrier(src, rows), rows[0][1] if rows and len(rows[0]) == 2 else 0
        source = self._source_of(src, stream)
        n = len(source.fields)
        if n and not set(map(len, rows)) <= {n}:
            msg = f"tuples from {source} must have {n} values"
            raise WireFormatError(msg)
        tuples = [Tuple(v, source) for v in rows]
        if row_anchors is not None:
            for tup, anchors_ in zip(tuples, row_anchors, strict=True):
                if anchors_:
                    tup.anchors = anchors_
        return (tuples, len(tuples)), generation

    def _barrier(self, src: int, rows: list[list[Any]]) -> Decoded:
        values = rows[0] if len(rows) == 1 else None
        if values is None or len(values) != 2 or not all(type(v) is int and v >= 0 for v in values) or src < 1:
            msg = f"a checkpoint barrier is [source_task >= 1, '$checkpoint', [epoch, generation]], got {rows!r}"
            raise WireFormatError(msg)
        self._source_of(src, "default")  # a task the topology has
        return Barrier(values[0], values[1], src), 0
