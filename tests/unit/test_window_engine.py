"""The window engine as a seam of its own: the executor holds it, it saves and loads the windows alone, and
what the previous engines (on the bolt, before worker/windows/) checkpointed restores to the same windows.

tests/unit/test_windows.py checks the windows themselves against Spark's semantics.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pyarrow as pa
import pytest

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.tuples import Tuple
from spark_storm.errors import ConfigError, WindowError
from spark_storm.examples.windows import WindowCount
from spark_storm.state.kv import KeyValueState
from spark_storm.topology.model import resolve_class
from spark_storm.worker.bolt import TopologyContext
from spark_storm.worker.windows import window_engine
from spark_storm.worker.windows.arrow import ArrowEngine
from spark_storm.worker.windows.rows import RowEngine
from tests.support import ROOT
from tests.support.windows import Harness, Recorder

EX = "spark_storm.examples.windows"
SLIDING = {"length": "3s", "sliding": "1s", "timestamp_field": "ts", "lag": "500ms"}
SESSIONS = {"session_gap": "700ms", "timestamp_field": "ts", "lag": "500ms", "key": "user"}
COUNTS = {"length": "5 tuples", "sliding": "2 tuples", "timestamp_field": "ts", "lag": "500ms"}
#: Written by the engines of aa38561 (tests/data/windows/: the cases, the changelog entry of a
#: full checkpoint at epoch 2, and what those engines emitted after a restart from it).
PREVIOUS = msgpack.unpackb(
    (ROOT / "tests/data/windows/checkpoints-aa38561.msgpack").read_bytes(), raw=False, strict_map_key=False
)


class OverridesExecute(WindowCount):
    def execute(self, tup: Tuple) -> None:
        super().execute(tup)


def _rows(seed: int, n: int = 150) -> list[list[Any]]:
    rng = random.Random(seed)
    t, out = 1_700_000_000_000, []
    for i in range(n):
        t += rng.randrange(0, 120)
        out.append([t - rng.randrange(0, 400), f"u{rng.randrange(3)}", i])
    return out


@pytest.mark.parametrize(
    ("bolt", "engine"),
    [("WindowCount", RowEngine), ("WindowCountTuples", RowEngine), ("WindowCountBatch", ArrowEngine)],
)
def test_the_executor_holds_the_engine_and_the_bolt_none_of_it(bolt: str, engine: type) -> None:
    h = Harness(f"{EX}:{bolt}", SLIDING, conf={"count.by": "user"})
    held = h.executor.windows[h.task]
    assert type(held) is engine
    for name in ("_windows", "_anchoring", "_raw_collector", "window_spec"):
        assert not hasattr(h.bolt, name)
    assert h.bolt.collector is held.anchoring  # emits without anchors are anchored by the engine
    assert h.bolt.state is h.state  # the user's init_state hook still gets the task's state
    with pytest.raises(WindowError, match="goes to its window engine"):
        h.bolt.execute(Tuple([1, "u", 0], h.source))


def test_a_windowed_bolt_that_overrides_execute_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"OverridesExecute overrides execute.*put the work in execute_window"):
        Harness(f"{__name__}:OverridesExecute", SLIDING)


def _engine(h: Harness, name: str) -> tuple[Any, Any, Recorder]:
    """A new bolt of ``h``'s class and its engine, outside any executor, prepared and loaded from an empty state."""
    bolt = resolve_class(h.component.bolt, "bolt")()
    ctx = TopologyContext("windows", "w", h.task, (h.task,), dict(h.component.outputs), name, h.plan)
    out = Recorder()
    conf = {**h.conf, **h.component.conf}
    engine = window_engine(bolt, conf, ctx, out)
    bolt.prepare(conf, ctx, engine.anchoring)
    bolt.init_state(KeyValueState())
    engine.load(bolt.state)
    return bolt, engine, out


@pytest.mark.parametrize(
    ("bolt", "window"),
    [
        ("WindowCount", SLIDING),
        ("WindowCountTuples", {**SLIDING, "key": "user"}),
        ("WindowCountTuples", {**COUNTS, "key": "user"}),
        ("WindowCount", SESSIONS),
        ("WindowCountBatch", SLIDING),
        ("WindowCountBatch", COUNTS),
        ("WindowCountBatch", SESSIONS),
    ],
)
def test_an_engine_alone_saves_its_windows_and_a_new_one_goes_on_from_them(bolt: str, window: dict[str, Any]) -> None:
    h = Harness(f"{EX}:{bolt}", window, conf={"count.by": "user"})
    rows = _rows(7)
    batch = bolt.endswith("Batch")

    def feed(engine: Any, part: list[list[Any]]) -> None:
        if batch:
            for i in range(0, len(part), 10):
                data = pa.record_batch(
                    list(map(pa.array, zip(*part[i : i + 10], strict=True))), names=["ts", "user", "v"]
                )
                engine.execute(ColumnarBatch(data, h.source))
        else:
            for row in part:
                engine.execute(Tuple(list(row), h.source))

    whole, engine, out = _engine(h, "whole")
    feed(engine, rows[:80])
    engine.save(whole.state, 1)
    _, resumed, resumed_out = _engine(h, "resumed")
    resumed.load(KeyValueState(whole.state.snapshot()))
    assert resumed.metrics() == engine.metrics()  # held, counted as the windows change, is what a load counts
    before = len(out.emitted["default"])
    flush = [[rows[-1][0] + 60_000, "u0", -1]]
    for each in (engine, resumed):
        feed(each, rows[80:] + flush)
    assert resumed_out.emitted["default"], "the data must close windows after the cut"
    assert out.emitted["default"][before:] == resumed_out.emitted["default"]
    assert resumed.metrics() == engine.metrics()


@pytest.mark.parametrize("name", sorted(PREVIOUS))
def test_a_checkpoint_the_previous_engines_wrote_restores_to_the_same_windows(name: str) -> None:
    case = PREVIOUS[name]
    h = Harness(f"{EX}:{case['bolt']}", case["window"], conf=case["conf"])
    store = h.manager.task_store(h.task)
    store.write_encoded(2, True, [case["entry"]])
    store.commit(2)
    h.restart(2)
    rows = [*case["rows"][100:], [case["rows"][-1][0] + 60_000, "u0", -1]]
    if case["bolt"].endswith("Batch"):
        for i in range(0, len(rows), 10):
            h.send_batch(rows[i : i + 10])
        # a batch window's rows come out of pyarrow's group_by, in no set order
        assert sorted(map(repr, h.out.emitted["default"])) == sorted(map(repr, case["after"]))
    else:
        h.send(rows)
        assert h.out.emitted["default"] == case["after"]
