"""Tuple payloads on the wire (documented in docs/reference/protocol.md, "Tuple payloads").

The messaging layer treats payloads as opaque; these are the byte layouts of the codec
(:mod:`spark_storm.codec.encoder` and :mod:`~spark_storm.codec.decoder` decide which to use):

* to a **source** task (from Spark or any client): the values of one tuple as an array
  (``topology.serializer``, msgpack by default), or an **Arrow IPC stream** (starts with
  the continuation marker ``FF FF FF FF``, which no msgpack array does) carrying many rows,
  columns matched to the source's fields by name — what the Spark writer sends;
* between bolts, tuples: ``[source_task, stream, [values, ...], anchors]`` — every tuple a
  task emitted to one destination task in one executor batch, in emit order; ``anchors``
  is nil (untracked) or one list of ``[worker id, root, edge]`` triples per tuple (the
  worker id names the worker whose acker holds the root).  The
  single-tuple form ``[source_task, stream, values]`` is accepted too (clients, broadcast);
* between bolts, columnar batches: an Arrow IPC stream whose schema metadata
  ``storm`` holds ``[source_task, stream, anchors, generation]`` (msgpack; anchors nil or
  one list of triples for the whole batch, which is one edge of its tuple trees);
* between bolts, a checkpoint barrier: ``[source_task, "$checkpoint", [epoch, generation]]``.

Bolt payloads carry the sender's *generation* (the tuple batch form as a fifth element):
after a rollback, whatever the old generation still had in flight is dropped on arrival
(docs/design/state.md).  A payload without one is generation 0.
"""

from __future__ import annotations

from typing import Any, Final

import msgpack
import pyarrow as pa

from spark_storm.codec.serializer import Serializer
from spark_storm.codec.tuples import CHECKPOINT_STREAM, Anchor
from spark_storm.errors import WireFormatError

__all__ = [
    "ARROW_STREAM_MAGIC",
    "STORM_METADATA_KEY",
    "BoltPayload",
    "arrow_payload",
    "arrow_stream",
    "barrier_payload",
    "columnar_metadata",
    "pack_tuples",
    "read_arrow",
    "salvage_anchors",
    "unpack_bolt",
]

ARROW_STREAM_MAGIC: Final = b"\xff\xff\xff\xff"
STORM_METADATA_KEY: Final = b"storm"

#: (source task, stream, rows of values, anchors per row or None, generation)
BoltPayload = tuple[int, str, list[list[Any]], list[list[Anchor]] | None, int]


def pack_tuples(
    serializer: Serializer,
    source_task: int,
    stream: str,
    rows: list[list[Any]],
    anchors: list[list[Anchor]] | None,
    generation: int = 0,
) -> bytes:
    """Encode the tuples one task emitted to one destination (in order)."""
    if generation:
        return serializer.dumps([source_task, stream, rows, anchors, generation])
    return serializer.dumps([source_task, stream, rows, anchors])


def unpack_bolt(serializer: Serializer, payload: bytes) -> BoltPayload:
    """Decode a bolt-to-bolt tuple payload (batch or single-tuple form).

    Raises
    ------
    WireFormatError
        Not one of the two forms, or the parts have the wrong types.
    """
    decoded = serializer.loads(payload)
    if not isinstance(decoded, list) or len(decoded) not in (3, 4, 5):
        msg = (
            "a bolt tuple payload must be [source_task, stream, values] or "
            "[source_task, stream, rows, anchors(, generation)]"
        )
        raise WireFormatError(msg)
    src, stream = decoded[0], decoded[1]
    if type(src) is not int or type(stream) is not str:
        msg = f"a bolt tuple payload starts with source task (int) and stream (str), got {src!r}, {stream!r}"
        raise WireFormatError(msg)
    if len(decoded) == 3:
        values = decoded[2]
        if type(values) is not list:
            msg = f"tuple values must be an array, got {type(values).__name__}"
            raise WireFormatError(msg)
        return src, stream, [values], None, 0
    rows, anchors = decoded[2], decoded[3]
    generation = decoded[4] if len(decoded) == 5 else 0
    if type(generation) is not int or generation < 0:
        msg = f"a bolt tuple payload's generation must be a non-negative int, got {generation!r}"
        raise WireFormatError(msg)
    if type(rows) is not list or not set(map(type, rows)) <= {list}:
        msg = "the rows of a bolt tuple payload must be an array of arrays"
        raise WireFormatError(msg)
    if anchors is not None:
        if type(anchors) is not list or len(anchors) != len(rows):
            msg = "the anchors of a bolt tuple payload must be nil or one entry per row"
            raise WireFormatError(msg)
        try:
            anchors = [[(int(s), int(r), int(e)) for s, r, e in a] for a in anchors]
        except (TypeError, ValueError) as exc:
            msg = f"bad anchors in a bolt tuple payload: {exc}"
            raise WireFormatError(msg) from exc
    return src, stream, rows, anchors, generation


def barrier_payload(serializer: Serializer, source_task: int, epoch: int, generation: int) -> bytes:
    """Encode checkpoint barrier ``epoch`` from ``source_task`` (the single-tuple form on ``$checkpoint``)."""
    return serializer.dumps([source_task, CHECKPOINT_STREAM, [epoch, generation]])


def arrow_payload(data: pa.RecordBatch, metadata: bytes | None = None) -> bytes:
    """One record batch as an Arrow IPC stream, with ``storm`` schema metadata if given.

    The stream is assembled from its three parts (schema message, record batch message,
    end-of-stream marker): the bytes ``pyarrow.ipc.new_stream`` writes, at half its cost.
    """
    schema = data.schema if metadata is None else data.schema.with_metadata({STORM_METADATA_KEY: metadata})
    return b"".join((schema.serialize(), data.serialize(), _END_OF_STREAM))  # joined from Arrow's buffers: one copy


def arrow_stream(batches: list[pa.RecordBatch]) -> bytes:
    """Record batches of one schema as one Arrow IPC stream (one schema message, then each batch)."""
    if not batches:
        msg = "an Arrow stream needs at least one record batch (for its schema)"
        raise ValueError(msg)
    schema = batches[0].schema
    for batch in batches[1:]:
        if not batch.schema.equals(schema):
            msg = f"record batches of one stream must share a schema: {batch.schema} is not {schema}"
            raise ValueError(msg)
    return b"".join([schema.serialize(), *(b.serialize() for b in batches), _END_OF_STREAM])


_END_OF_STREAM: Final = ARROW_STREAM_MAGIC + b"\x00\x00\x00\x00"


def columnar_metadata(source_task: int, stream: str, anchors: list[Anchor] | None, generation: int = 0) -> bytes:
    """Encode the ``storm`` metadata of a bolt-to-bolt Arrow payload."""
    packed = [list(a) for a in anchors] if anchors else None
    return bytes(
        msgpack.packb([source_task, stream, packed, generation] if generation else [source_task, stream, packed])
    )


def read_arrow(payload: bytes) -> tuple[pa.RecordBatch, tuple[int, str, list[Anchor] | None, int] | None]:
    """Decode an Arrow IPC payload: its rows as one record batch, and its ``storm`` origin.

    The batch is validated in full (offsets, UTF-8): the bytes came off a socket.  The
    stream must end with its end-of-stream marker (every writer here, and pyarrow's stream
    writer once closed, puts it there): a stream cut at a message boundary still parses, with
    fewer rows or none, and only the missing marker tells.

    Raises
    ------
    WireFormatError
        Not a readable, valid Arrow stream, one cut short, or bad ``storm`` metadata.
    """
    if not payload.endswith(_END_OF_STREAM):
        msg = (
            f"payload of {len(payload)} bytes is an Arrow IPC stream without its end-of-stream marker: "
            "it was cut short (a writer closes its stream, which writes the marker)"
        )
        raise WireFormatError(msg)
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(payload))
        schema = reader.schema
        batches = list(reader)
        if len(batches) == 1:
            data = batches[0]
        elif not batches:
            data = pa.RecordBatch.from_pylist([], schema=schema)
        else:
            data = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
        data.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        msg = f"payload of {len(payload)} bytes is not a valid Arrow IPC stream: {exc}"
        raise WireFormatError(msg) from exc
    meta = schema.metadata or {}
    raw = meta.get(STORM_METADATA_KEY)
    if raw is None:
        return data, None
    try:
        parts = msgpack.unpackb(raw)
        src, stream, anchors = parts[:3]
        generation = int(parts[3]) if len(parts) > 3 else 0
        origin = (
            int(src),
            str(stream),
            [(int(s), int(r), int(e)) for s, r, e in anchors] if anchors else None,
            generation,
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        msg = f"bad storm metadata in an Arrow payload: {exc}"
        raise WireFormatError(msg) from exc
    return data.replace_schema_metadata(None), origin


def _anchor_list(raw: Any) -> list[Anchor]:
    out: list[Anchor] = []
    if type(raw) is not list:
        return out
    for anchor in raw:
        if type(anchor) is list and len(anchor) == 3 and all(type(v) is int for v in anchor):
            out.append((anchor[0], anchor[1], anchor[2]))
    return out


def salvage_anchors(serializer: Serializer, payload: bytes) -> list[Anchor]:
    """Return the tuple-tree anchors a bad bolt payload still shows (never raises).

    A payload whose rows cannot be used (a wrong arity, an unknown stream, bytes cut short
    after the anchors) may still name the trees it belonged to: failing them at once makes
    their senders replay now instead of at the message timeout.  Nothing readable: ``[]``.
    """
    try:
        if payload[:4] == ARROW_STREAM_MAGIC:
            schema = pa.ipc.open_stream(pa.py_buffer(payload)).schema
            raw = (schema.metadata or {}).get(STORM_METADATA_KEY)
            parts = msgpack.unpackb(raw) if raw is not None else None
            return _anchor_list(parts[2]) if type(parts) is list and len(parts) > 2 else []
        decoded = serializer.loads(payload)
    except Exception:  # bytes that are not ours in any way: nothing to salvage
        return []
    if type(decoded) is not list or len(decoded) < 4 or type(decoded[3]) is not list:
        return []
    return [a for row in decoded[3] for a in _anchor_list(row)]
