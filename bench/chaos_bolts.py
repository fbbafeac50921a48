"""Bolts and row helpers of bench.chaos's typed ledger (imported by the worker processes too).

The typed ledger's rows carry Spark SQL types — a timestamp with a zone, a date, a decimal, a
struct holding a date, an array — so that every value crosses workers through the msgpack
codec's extension types (``mid`` forwards them, ``ledger`` is on another task).  The ledger
key and the amount are derived from those values by :func:`typed_key` and
:func:`typed_amount`; the harness computes the answer from the rows it generated with the same
two functions, so a value changed, lost or of another type on the way shows as a wrong key.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any, Final

from spark_storm.codec.tuples import Tuple
from spark_storm.state.kv import KeyValueState
from spark_storm.worker.stateful import StatefulBolt

__all__ = ["TYPED_FIELDS", "TYPED_SCHEMA", "TypedLedgerBolt", "typed_amount", "typed_key", "typed_rows"]

#: The typed rows' fields, in order.
TYPED_FIELDS: Final = ("key", "ts", "d", "dec", "st", "arr")
#: The same as a Spark DDL schema (the JSON files the Spark feeds read).
TYPED_SCHEMA: Final = (
    "key string, ts timestamp, d date, dec decimal(12,3), "
    "st struct<x: bigint, y: string, when: date>, arr array<bigint>"
)
_ZONES: Final = (dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(dt.timedelta(hours=-7)))
_EPOCH: Final = dt.datetime(2024, 2, 28, 22, 0, tzinfo=dt.UTC)


def _bad(field: str, value: Any) -> str:
    return f"!type:{field}:{type(value).__name__}"


def typed_key(values: list[Any]) -> str:
    """The ledger key of a typed row: its key, its dates and the UTC hour of its timestamp.

    A value of the wrong type gives a key naming it (``!type:<field>:<type>``), which no
    answer holds: the checker reports it as a wrong key.
    """
    key, ts, d, _dec, st, _arr = values
    if not isinstance(ts, dt.datetime) or ts.tzinfo is None:
        return _bad("ts", ts)
    if not isinstance(d, dt.date) or isinstance(d, dt.datetime):
        return _bad("d", d)
    if not isinstance(st, dict) or not isinstance(st.get("when"), dt.date):
        return _bad("st", st)
    return f"{key}|{d.isoformat()}|{st['when'].isoformat()}|{ts.astimezone(dt.UTC):%H}"


def typed_amount(values: list[Any]) -> int:
    """The amount a typed row adds: its decimal in thousandths, its array, its struct's number, its timestamp's ms."""
    _key, ts, _d, dec, st, arr = values
    if not isinstance(dec, decimal.Decimal) or not isinstance(arr, list):
        return -(10**12)
    millis = int((ts - _EPOCH) // dt.timedelta(milliseconds=1))
    return int((dec * 1000).to_integral_value()) + sum(int(a) for a in arr) + int(st["x"]) + millis % 1000


def typed_rows(batch: int, n: int, keys: int, seed: int) -> list[list[Any]]:
    """``n`` typed rows of batch ``batch``: values in a few zones, dates around a leap day, 3-digit decimals."""
    import random

    rng = random.Random(f"typed:{seed}:{batch}")
    rows = []
    for i in range(n):
        ts = (_EPOCH + dt.timedelta(milliseconds=rng.randrange(4 * 3600 * 1000))).astimezone(rng.choice(_ZONES))
        d = dt.date(2024, 2, 27) + dt.timedelta(days=rng.randrange(4))
        dec = decimal.Decimal(rng.randrange(-999_999, 999_999)).scaleb(-3)
        st = {
            "x": batch * 1000 + i,
            "y": f"y{rng.randrange(5)}",
            "when": dt.date(2020, 2, 29) + dt.timedelta(rng.randrange(3)),
        }
        arr = [rng.randrange(100) for _ in range(rng.randrange(4))]
        rows.append([f"t{rng.randrange(keys)}", ts, d, dec, st, arr])
    return rows


class TypedLedgerBolt(StatefulBolt):
    """Per :func:`typed_key`: [count, sum of :func:`typed_amount`] in checkpointed state."""

    def init_state(self, state: KeyValueState) -> None:
        self.ledger = state

    def execute(self, tup: Tuple) -> None:
        if tup.is_tick:
            return
        values = list(tup.values)
        key = typed_key(values)
        amount = typed_amount(values) if not key.startswith("!") else 0
        count, total = self.ledger.get(key, (0, 0))
        self.ledger.put(key, [count + 1, total + amount])
        self.collector.ack(tup)
