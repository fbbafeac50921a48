"""The tuple codec: tuples and columnar batches, their payloads on the wire, one encoder, two decoders.

Below ``spark/`` and ``worker/`` and above ``messaging/``: the Spark writer and the worker
share it, and importing it loads no worker machinery.

* :mod:`~spark_storm.codec.tuples` — :class:`Tuple`, :class:`TupleSource`, reserved ids;
* :mod:`~spark_storm.codec.columnar` — :class:`ColumnarBatch` and Arrow helpers;
* :mod:`~spark_storm.codec.serializer` — values <-> bytes (msgpack with Spark's types);
* :mod:`~spark_storm.codec.payloads` — the byte layouts (docs/reference/protocol.md, "Tuple payloads");
* :mod:`~spark_storm.codec.encoder` — :class:`Encoder`: anything -> messages that fit a frame;
* :mod:`~spark_storm.codec.decoder` — :class:`SourceDecoder`, :class:`BoltDecoder`.
"""

from __future__ import annotations

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.decoder import BoltDecoder, SourceDecoder
from spark_storm.codec.encoder import BadRow, Encoded, Encoder
from spark_storm.codec.serializer import MsgpackSerializer, Serializer, make_serializer
from spark_storm.codec.tuples import (
    BROADCAST_TASK,
    CHECKPOINT_STREAM,
    CLIENT_COMPONENT,
    Anchor,
    Barrier,
    Tuple,
    TupleSource,
)

__all__ = [
    "BROADCAST_TASK",
    "CHECKPOINT_STREAM",
    "CLIENT_COMPONENT",
    "Anchor",
    "BadRow",
    "Barrier",
    "BoltDecoder",
    "ColumnarBatch",
    "Encoded",
    "Encoder",
    "MsgpackSerializer",
    "Serializer",
    "SourceDecoder",
    "Tuple",
    "TupleSource",
    "make_serializer",
]
