"""Columnar batches: what batch bolts get and emit (Arrow record batches with an origin).

A :class:`ColumnarBatch` is to a batch bolt what a :class:`~spark_storm.codec.tuples.Tuple`
is to a tuple bolt: data (a ``pyarrow.RecordBatch`` whose columns are the stream's
declared fields), where it came from, and the tuple trees it belongs to.  A batch is one
edge of a tuple tree: acking it acks every row at once.

Where the two bolt kinds meet, the receiving executor converts: a tuple bolt downstream
of a batch bolt gets one tuple per row, a batch bolt downstream of tuple bolts gets the
tuples of one executor batch as one record batch (:func:`batch_from_rows`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from spark_storm.codec.tuples import NO_ANCHORS, Anchor, FromSource, TupleSource
from spark_storm.errors import WireFormatError

__all__ = ["ColumnarBatch", "as_record_batch", "batch_from_rows", "rows_of", "select_fields"]


class ColumnarBatch(FromSource):
    """Rows of one origin as Arrow columns.

    Attributes
    ----------
    data : pyarrow.RecordBatch
        Columns named after the stream's fields, in declared order.
    source : TupleSource
    source_component, source_task, stream, fields
        As on a tuple.
    """

    __slots__ = ("anchors", "data", "pending", "source")

    def __init__(self, data: pa.RecordBatch, source: TupleSource) -> None:
        self.data = data
        self.source = source
        self.anchors: list[Anchor] = NO_ANCHORS
        self.pending: dict[tuple[int, int], Any] | None = None

    @property
    def num_rows(self) -> int:
        return int(self.data.num_rows)

    def __len__(self) -> int:
        return int(self.data.num_rows)

    def column(self, field: str) -> pa.Array:
        """Return the column of ``field`` (KeyError naming the fields when absent)."""
        index = self.source.index.get(field)
        if index is None:
            msg = f"batch from {self.source.component!r} has no field {field!r}; fields are {list(self.fields)}"
            raise KeyError(msg)
        return self.data.column(index)

    def __repr__(self) -> str:
        s = self.source
        return f"ColumnarBatch({s.component}:{s.task}/{s.stream} {self.num_rows} rows {list(s.fields)})"


def rows_of(data: pa.RecordBatch) -> list[list[Any]]:
    """Return the rows of a record batch as lists of Python values (column by column, then zipped).

    Values are what pyspark gives for each type (``datetime``, ``date``, ``Decimal``,
    ``bytes``, lists, dicts for structs), and maps become dicts as in pyspark (pyarrow
    alone gives lists of pairs); a map whose keys are not hashable stays a list of pairs.
    """
    columns = [_pylist(c) for c in data.columns]
    if not columns:
        return [[] for _ in range(data.num_rows)]
    return list(map(list, zip(*columns, strict=True)))


def _pylist(column: pa.Array) -> list[Any]:
    values: list[Any] = column.to_pylist()
    if not _has_map(column.type):
        return values
    return [_maps_as_dicts(v, column.type) for v in values]


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    return any(_has_map(t.field(i).type) for i in range(t.num_fields))


def _maps_as_dicts(value: Any, t: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_map(t):
        pairs = [(_maps_as_dicts(k, t.key_type), _maps_as_dicts(v, t.item_type)) for k, v in value]
        try:
            return dict(pairs)
        except TypeError:  # unhashable keys (structs, lists): keep the pairs
            return pairs
    if pa.types.is_struct(t):
        return {t.field(i).name: _maps_as_dicts(value[t.field(i).name], t.field(i).type) for i in range(t.num_fields)}
    if t.num_fields == 1:  # list, large list, fixed-size list
        item = t.field(0).type
        return [_maps_as_dicts(v, item) for v in value]
    return value


def batch_from_rows(rows: Sequence[Sequence[Any]], fields: Sequence[str]) -> pa.RecordBatch:
    """Columns from tuples' values (Arrow infers each column's type).

    Raises
    ------
    WireFormatError
        A column mixes values Arrow cannot put in one type (names the field).
    """
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in fields]
    arrays = []
    for name, values in zip(fields, columns, strict=True):
        try:
            arrays.append(pa.array(values))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            msg = f"field {name!r}: its values cannot form one Arrow column ({exc}); emit one type per field"
            raise WireFormatError(msg) from exc
    return pa.RecordBatch.from_arrays(arrays, names=list(fields))


def select_fields(data: pa.RecordBatch, fields: Sequence[str], what: str, fix: str) -> pa.RecordBatch:
    """Pick the declared ``fields`` of a batch, by name and in declared order (no copy).

    Raises
    ------
    WireFormatError
        A declared field is missing: "{what} lacks fields [...] (it has [...]); {fix}".
    """
    names = data.schema.names
    if list(names) == list(fields):
        return data
    missing = [f for f in fields if f not in names]
    if missing:
        msg = f"{what} lacks fields {missing} (it has {names}); {fix}"
        raise WireFormatError(msg)
    return pa.RecordBatch.from_arrays([data.column(f) for f in fields], names=list(fields))


def as_record_batch(data: Any, fields: Sequence[str], where: str) -> pa.RecordBatch:
    """Normalise what a batch bolt emits to a record batch of exactly ``fields``.

    Accepts a ``pyarrow.RecordBatch`` or ``Table`` (columns picked by name, in declared
    order) or a mapping of field -> array-like (pyarrow array, numpy array, list).

    Raises
    ------
    WireFormatError
        A declared field is missing, or the columns differ in length.
    """
    if isinstance(data, pa.Table):
        data = data.combine_chunks().to_batches()[0] if data.num_rows else pa.RecordBatch.from_pylist([], data.schema)
    if isinstance(data, pa.RecordBatch):
        return select_fields(data, fields, f"{where}: the batch", "emit the declared fields")
    if isinstance(data, Mapping):
        missing = [f for f in fields if f not in data]
        if missing:
            msg = f"{where}: the columns lack declared fields {missing} (got {sorted(data)})"
            raise WireFormatError(msg)
        try:
            arrays = [
                v if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(v) for v in (data[f] for f in fields)
            ]
            arrays = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
            return pa.RecordBatch.from_arrays(arrays, names=list(fields))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            msg = f"{where}: cannot build a record batch from the columns: {exc}"
            raise WireFormatError(msg) from exc
    kind = type(data).__name__
    msg = f"{where}: emit_batch takes a pyarrow.RecordBatch, Table or a mapping of field -> array, got {kind}"
    raise WireFormatError(msg)
