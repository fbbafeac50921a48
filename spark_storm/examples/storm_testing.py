"""Storm's own test and wrapper components that Flux examples name, in Python.

``org.apache.storm.testing.TestWordSpout``, ``org.apache.storm.testing.TestWordCounter``
and ``org.apache.storm.flux.wrappers.bolts.LogInfoBolt`` map to these (see
:data:`spark_storm.topology.flux.BUILTIN_CLASSES`), so Storm's example Flux files run
without a rewrite.  Each does what its Java original does.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from spark_storm.bolts import Bolt, OutputCollector, Spout, SpoutOutputCollector, TopologyContext, Tuple

__all__ = ["LogInfoBolt", "TestWordCounter", "TestWordSpout"]

logger = logging.getLogger(__name__)

_WORDS = ("nathan", "mike", "jackson", "golda", "bertels")


class TestWordSpout(Spout):
    """Emits a random word of five every 100 ms (unanchored, as Storm's ``TestWordSpout``)."""

    def open(self, conf: Mapping[str, Any], context: TopologyContext, collector: SpoutOutputCollector) -> None:
        super().open(conf, context, collector)
        self._rng = random.Random()

    def next_tuple(self) -> None:
        time.sleep(0.1)
        self.collector.emit([self._rng.choice(_WORDS)])


class TestWordCounter(Bolt):
    """Counts words (the first field) and emits (word, count) anchored, as Storm's ``TestWordCounter``."""

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.counts: Counter[Any] = Counter()

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        word = tup.values[0]
        self.counts[word] += 1
        self.collector.emit([word, self.counts[word]], anchors=tup)
        self.collector.ack(tup)


class LogInfoBolt(Bolt):
    """Logs every tuple at INFO and acks it (Flux's ``LogInfoBolt``)."""

    def execute(self, tup: Tuple) -> None:
        if not tup.is_tick:
            logger.info("%r", tup)
        self.collector.ack(tup)
