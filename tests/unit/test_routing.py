"""Vectorised routing (topology.routing) against its scalar twin (topology.grouping/hashing)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_storm.topology import Input, TopologyBuilder, fields_hash
from spark_storm.topology.grouping import FieldsGrouper, make_grouper
from spark_storm.topology.routing import Router, make_batch_router, spark_hash, split_by_task


def _tasks(router: Router, batch: pa.RecordBatch, tasks: object = None) -> list[int]:
    routed = router.route(batch, tasks)
    assert routed is not None
    return list(routed.tolist())


_VALUES = {
    "long": (pa.int64(), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    "string": (pa.string(), st.text(max_size=40)),
    "double": (pa.float64(), st.floats(allow_nan=False, width=64)),
    "bool": (pa.bool_(), st.booleans()),
    "binary": (pa.binary(), st.binary(max_size=40)),
}


@st.composite
def _columns(draw: st.DrawFn) -> tuple[list[pa.Array], list[list[object]]]:
    n = draw(st.integers(min_value=1, max_value=30))
    kinds = draw(st.lists(st.sampled_from(sorted(_VALUES)), min_size=1, max_size=3))
    columns, rows = [], [[] for _ in range(n)]  # type: ignore[var-annotated]
    for kind in kinds:
        arrow_type, values = _VALUES[kind]
        col = draw(st.lists(st.one_of(st.none(), values), min_size=n, max_size=n))
        columns.append(pa.array(col, type=arrow_type))
        for row, value in zip(rows, col, strict=True):
            row.append(value)
    return columns, rows


@settings(max_examples=300, deadline=None)
@given(_columns())
def test_vectorised_spark_hash_equals_the_scalar_one_row_by_row(
    data: tuple[list[pa.Array], list[list[object]]],
) -> None:
    columns, rows = data
    assert spark_hash(columns).tolist() == [fields_hash(row) for row in rows]


def test_sliced_and_chunked_columns_hash_like_fresh_ones() -> None:
    words = pa.array(["a", "bb", "ccc", "dddd", "eeeee", None, "ünï"])
    assert spark_hash([words.slice(2, 4)]).tolist() == [fields_hash([w]) for w in ["ccc", "dddd", "eeeee", None]]
    chunked = pa.chunked_array([words.slice(0, 3), words.slice(3)])
    assert spark_hash([chunked]).tolist() == [fields_hash([w]) for w in words.to_pylist()]


def test_fields_router_picks_the_task_the_tuple_grouper_picks() -> None:
    topo = (
        TopologyBuilder("t")
        .source("s", ["word", "n"])
        .bolt("c", "x:Y", inputs=[Input("s", "fields", fields=("word",))])
        .build()
    )
    source, inp = topo.components["s"], topo.components["c"].inputs[0]
    targets = [4, 5, 6]
    words = [f"w{i}" for i in range(200)]
    batch = pa.record_batch({"word": words, "n": list(range(200))})
    routed = _tasks(make_batch_router(inp, source, targets), batch)
    grouper = make_grouper(inp, source, targets)
    assert routed == [grouper.choose([w, i])[0] for i, w in enumerate(words)]


def test_shuffle_spreads_evenly_and_continues_across_batches() -> None:
    router = Router([1, 2, 3], "shuffle", start=1)
    first = _tasks(router, pa.record_batch({"x": list(range(5))}))
    second = _tasks(router, pa.record_batch({"x": list(range(4))}))
    assert first + second == [2, 3, 1, 2, 3, 1, 2, 3, 1]


def test_global_all_direct_and_their_errors() -> None:
    batch = pa.record_batch({"x": [1, 2, 3]})
    assert _tasks(Router([7, 5, 9], "global"), batch) == [5, 5, 5]
    assert Router([7, 5], "all").route(batch) is None
    direct = Router([5, 6], "direct")
    assert _tasks(direct, batch, tasks=6) == [6, 6, 6]
    assert _tasks(direct, batch, tasks=[5, 6, 5]) == [5, 6, 5]
    with pytest.raises(ValueError, match=r"task ids \[8\] outside"):
        direct.route(batch, tasks=[5, 8, 5])
    with pytest.raises(ValueError, match="one per row"):
        direct.route(batch, tasks=[5, 6])
    with pytest.raises(ValueError, match="pass the task ids"):
        direct.route(batch)
    column = Router([5, 6], "direct", task_column="t")
    with pytest.raises(ValueError, match="null task ids"):
        column.route(pa.record_batch({"t": [5, None]}))


def test_local_or_shuffle_stays_local_and_load_aware_avoids_the_loaded_task() -> None:
    topo = TopologyBuilder("t").source("s", ["x"]).build()
    source = topo.components["s"]
    batch = pa.record_batch({"x": list(range(100))})
    local = make_batch_router(Input("s", "local_or_shuffle"), source, [1, 2, 3, 4], local_tasks=[2, 4])
    assert set(_tasks(local, batch)) == {2, 4}
    loads = {1: 0.9, 2: 0.0}
    aware = make_batch_router(
        Input("s", "load_aware"), source, [1, 2], load=lambda tasks: {t: loads[t] for t in tasks}, rng=random.Random(3)
    )
    assert set(_tasks(aware, batch)) == {2}


def test_split_by_task_keeps_row_order_and_does_not_copy_a_single_destination() -> None:
    batch = pa.record_batch({"x": list(range(6))})
    pieces = split_by_task(batch, np.array([2, 1, 2, 1, 2, 2]), [1, 2])
    assert [(t, p.column(0).to_pylist()) for t, p in pieces] == [(1, [1, 3]), (2, [0, 2, 4, 5])]
    [(task, same)] = split_by_task(batch, np.array([3] * 6), [3])
    assert task == 3
    assert same is batch
    assert Counter(t for t, _ in split_by_task(batch, None, [1, 2])) == Counter({1: 1, 2: 1})


def test_shuffle_split_cuts_zero_copy_slices_and_rotates_the_first_target() -> None:
    router = Router([1, 2, 3], "shuffle", start=2)
    batch = pa.record_batch({"x": list(range(7))})
    first = router.split(batch)
    assert [(t, p.column(0).to_pylist()) for t, p in first] == [(3, [0, 1]), (1, [2, 3]), (2, [4, 5, 6])]
    assert first[1][1].column(0).buffers()[1].address == batch.column(0).buffers()[1].address  # a view
    assert [t for t, _ in router.split(pa.record_batch({"x": [9]}))] == [1]
    assert [t for t, _ in router.split(pa.record_batch({"x": [9]}))] == [2]
    assert Router([4, 5], "none").grouping == "shuffle"


def test_the_writer_joins_sparks_small_batches_in_order_and_the_same_way_each_time() -> None:
    from spark_storm.spark.writer import coalesce

    sizes = [3, 0, 4, 10, 2, 1]
    starts = np.cumsum([0, *sizes])
    batches = [pa.record_batch({"n": np.arange(s, s + k)}) for s, k in zip(starts, sizes, strict=False)]
    joined = list(coalesce(batches, 6))
    assert [b.num_rows for b in joined] == [7, 10, 3]  # 3+4 (the empty one gone), 10 alone, the rest
    assert [v for b in joined for v in b.column("n").to_pylist()] == list(range(20))
    assert [b.num_rows for b in coalesce(batches, 6)] == [7, 10, 3]
    assert list(coalesce([], 6)) == []


def test_fields_and_global_with_one_target_pass_the_batch_through_unhashed() -> None:
    batch = pa.record_batch({"w": pa.array(["a", "b", None]), "n": pa.array([1, 2, 3])})
    for router in (Router([4], "fields", ["w"]), Router([4], "global")):
        [(task, piece)] = router.split(batch)
        assert task == 4
        assert piece is batch  # no hash, no gather, no copy
        assert _tasks(router, batch) == [4, 4, 4]
    assert Router([4], "fields", ["w"]).split(batch.slice(0, 0)) == []
    grouper = FieldsGrouper([4], [0])  # the tuple path
    assert grouper.choose(["a", 1]) == [4]
    first = grouper.choose(["b", 2])
    first.append(99)  # a bolt may keep or change what emit() returned
    assert grouper.choose(["c", 3]) == [4]
