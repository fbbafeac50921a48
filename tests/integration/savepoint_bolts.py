"""Bolts of the savepoint tests: the keyed ledger's next version, whose values changed format."""

from __future__ import annotations

from typing import Any

from spark_storm.bolts import KeyValueState, StatefulBolt, Tuple


class LedgerBoltV2(StatefulBolt):
    """The ledger with ``{"count": c, "sum": s}`` values (version 1 kept ``[c, s]``)."""

    state_version = 2

    def migrate_state(self, key: Any, value: Any, from_version: int) -> Any:
        assert from_version == 1, from_version
        count, total = value
        return {"count": count, "sum": total}

    def init_state(self, state: KeyValueState) -> None:
        self.ledger = state

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        key, n = tup.values[0], tup.values[1]
        entry = self.ledger.get(key, {"count": 0, "sum": 0})
        self.ledger.put(key, {"count": entry["count"] + 1, "sum": entry["sum"] + n})
        self.collector.ack(tup)
