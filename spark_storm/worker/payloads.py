"""Arrow IPC payloads: many rows for one source task in one message (the Spark fast path).

A Spark writer groups an Arrow record batch's rows by task and sends each group as one
Arrow IPC stream (vectorised on the Spark side, no per-row Python).  Such a payload
starts with the IPC continuation marker ``FF FF FF FF``, which no msgpack array does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from spark_storm.errors import WireFormatError

__all__ = ["ARROW_STREAM_MAGIC", "arrow_rows"]

ARROW_STREAM_MAGIC: Final = b"\xff\xff\xff\xff"


def arrow_rows(payload: bytes, fields: Sequence[str]) -> list[list[Any]]:
    """Decode an Arrow IPC stream into rows of ``fields`` (by column name).

    Raises
    ------
    WireFormatError
        Not a readable Arrow stream, or a declared field is missing from it.
    """
    import pyarrow as pa  # only workers that receive Arrow payloads need it

    try:
        table = pa.ipc.open_stream(pa.py_buffer(payload)).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        msg = f"payload of {len(payload)} bytes is not a valid Arrow IPC stream: {exc}"
        raise WireFormatError(msg) from exc
    missing = [f for f in fields if f not in table.column_names]
    if missing:
        msg = f"Arrow payload lacks fields {missing} (it has {table.column_names}); send the source's fields"
        raise WireFormatError(msg)
    columns = [table.column(f).to_pylist() for f in fields]
    return list(map(list, zip(*columns, strict=True))) if columns else [[] for _ in range(table.num_rows)]
