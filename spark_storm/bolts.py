"""The component API, in one place: what a bolt or spout author imports.

::

    from spark_storm.bolts import Bolt, OutputCollector, TopologyContext, Tuple

    class Split(Bolt):
        def execute(self, tup: Tuple) -> None:
            for word in tup.get("sentence").split():
                self.collector.emit([word], anchors=tup)
            self.collector.ack(tup)

* per tuple: :class:`Bolt` (``execute``), :class:`Spout` (``next_tuple``);
* per columnar batch: :class:`BatchBolt` (``execute_batch`` on a :class:`ColumnarBatch`);
* exact state: :class:`StatefulBolt` / :class:`StatefulBatchBolt` with a :class:`KeyValueState`;
* windows: :class:`WindowedBolt` / :class:`WindowedBatchBolt` (``execute_window`` on a
  :class:`TupleWindow` / :class:`BatchWindow`);
* other languages: :class:`ShellBolt` / :class:`ShellSpout` (Storm's multilang protocol).

Each name is defined where the runtime that runs it lives (``spark_storm.worker``,
``spark_storm.shell``, ``spark_storm.codec``, ``spark_storm.state``); this module only
gathers them, so user code has one import path that does not move when they do.
"""

from __future__ import annotations

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.tuples import BROADCAST_TASK, Tuple
from spark_storm.shell import ShellBolt, ShellSpout
from spark_storm.state.kv import KeyValueState
from spark_storm.worker.bolt import (
    BatchBolt,
    BatchOutputCollector,
    Bolt,
    OutputCollector,
    PassThroughBatchBolt,
    PassThroughBolt,
    TopologyContext,
)
from spark_storm.worker.spout import Spout, SpoutOutputCollector
from spark_storm.worker.stateful import StatefulBatchBolt, StatefulBolt
from spark_storm.worker.windows import BatchWindow, TupleWindow, WindowedBatchBolt, WindowedBolt

__all__ = [
    "BROADCAST_TASK",
    "BatchBolt",
    "BatchOutputCollector",
    "BatchWindow",
    "Bolt",
    "ColumnarBatch",
    "KeyValueState",
    "OutputCollector",
    "PassThroughBatchBolt",
    "PassThroughBolt",
    "ShellBolt",
    "ShellSpout",
    "Spout",
    "SpoutOutputCollector",
    "StatefulBatchBolt",
    "StatefulBolt",
    "TopologyContext",
    "Tuple",
    "TupleWindow",
    "WindowedBatchBolt",
    "WindowedBolt",
]
