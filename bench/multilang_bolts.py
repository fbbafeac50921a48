"""The bolts bench.multilang compares: one echo bolt (emit anchored, ack), written three ways.

``python bench/multilang_bolts.py [--serializer msgpack]`` runs the pystorm one as a multilang child.
"""

from __future__ import annotations

import sys
from typing import Any

from pystorm import Bolt as PystormBolt

from spark_storm.codec.tuples import Tuple
from spark_storm.worker.bolt import Bolt


class NativeEcho(Bolt):
    """spark-storm's own Bolt API: the baseline."""

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        self.collector.emit(tup.values, anchors=tup)
        self.collector.ack(tup)


class PystormEcho(PystormBolt):  # type: ignore[misc]
    """The same bolt as a streamparse/pystorm user writes it (auto_anchor, auto_ack)."""

    outputs = ("v",)

    def process(self, tup: Any) -> None:
        self.emit(tup.values)


if __name__ == "__main__":
    serializer = sys.argv[sys.argv.index("--serializer") + 1] if "--serializer" in sys.argv else "json"
    PystormEcho(serializer=serializer).run()
