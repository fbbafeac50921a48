"""State TTL on the executor's side: its keys, read once per component, and the clocks (docs/design/state.md).

``topology.state.ttl.ms`` and ``topology.state.ttl.clock`` come from the component's
``conf:`` over the topology's and the defaults (the executor's merged conf).  The clock
that measures a TTL at a checkpoint barrier:

* ``event`` — the component's event time: its windows' watermark (a windowed component
  with a ``timestamp_field``), else the newest event time among the tuples the task has
  processed, read from the field its conf names as ``timestamp_field`` (epoch ms or a
  timestamp).  It moves only with what the epoch's tuples say, so a replay decides the
  same expiries.
* ``processing`` — the wall clock at the barrier (approximate: a replay may expire more).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow.compute as pc

from spark_storm.codec.columnar import ColumnarBatch
from spark_storm.codec.tuples import TupleSource
from spark_storm.config import Config
from spark_storm.errors import ConfigError, WindowError
from spark_storm.topology.windows import parse_duration_ms, window_spec
from spark_storm.worker.queue import QueueItem
from spark_storm.worker.windows.core import NO_TIME, event_ms

__all__ = ["TTL_CLOCK", "TTL_MS", "TTL_TIMESTAMP_FIELD", "EventClock", "TtlSettings", "wall_ms"]

logger = logging.getLogger(__name__)

TTL_MS: Final = "topology.state.ttl.ms"
TTL_CLOCK: Final = "topology.state.ttl.clock"
#: A plain stateful component's event-time field, for the event clock (its conf, beside the TTL keys).
TTL_TIMESTAMP_FIELD: Final = "timestamp_field"
CLOCKS: Final = ("event", "processing")


def wall_ms() -> int:
    """Return the wall clock in epoch milliseconds (the processing clock)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class TtlSettings:
    """A stateful component's TTL, checked once.

    Attributes
    ----------
    ttl_ms : int or None
        A key not written for this long expires (None: only keys put with a ``ttl`` do).
    clock : str
        ``event`` or ``processing``.
    timestamp_field : str or None
        The field the executor reads event time from (event clock, no event-time window).
    windowed : bool
        The event clock is the task's windows' watermark.
    refused : str or None
        Why no TTL can work here (no clock): a ``put`` with ``ttl`` fails with it.
    """

    ttl_ms: int | None
    clock: str
    timestamp_field: str | None
    windowed: bool
    refused: str | None

    @property
    def tracks(self) -> bool:
        """Whether the executor follows event time itself (it reads ``timestamp_field`` of every tuple)."""
        return self.clock == "event" and self.timestamp_field is not None and not self.windowed

    @property
    def on(self) -> bool:
        """Whether the state has TTL on from the start (a TTL, or an event time the executor follows)."""
        return self.refused is None and (self.ttl_ms is not None or self.tracks)

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any], component_id: str, component_conf: Mapping[str, Any]) -> TtlSettings:
        """Read the keys from the executor's merged conf (ConfigError naming key, value and fix)."""
        where = f"component {component_id!r}"
        config = Config.of(conf)
        raw = config[TTL_MS]
        ttl: int | None
        if raw is None:
            ttl = None
        elif isinstance(raw, str):
            ttl = parse_duration_ms(raw, f"{where}: {TTL_MS}")
        elif isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            msg = (
                f"{where}: {TTL_MS} is {raw!r}; give a positive number of milliseconds (or a duration "
                "such as '10m'), or null for no TTL"
            )
            raise ConfigError(msg)
        else:
            ttl = raw
        clock = config[TTL_CLOCK]
        if clock not in CLOCKS:
            msg = f"{where}: {TTL_CLOCK} is {clock!r}; use 'event' (exact: the event time) or 'processing'"
            raise ConfigError(msg)
        field = conf.get(TTL_TIMESTAMP_FIELD)
        if field is not None and (not isinstance(field, str) or not field):
            msg = f"{where}: {TTL_TIMESTAMP_FIELD} is {field!r}; give the name of the tuple field holding event time"
            raise ConfigError(msg)
        spec = window_spec(component_conf, where, conf)
        windowed = spec is not None and spec.event_time
        refused = None
        if clock == "event" and not windowed and field is None:
            refused = (
                f"{where}: {TTL_CLOCK} is 'event' but the component has no event time; give it "
                f"'{TTL_TIMESTAMP_FIELD}: <field>' in its conf (the tuple field holding event time, epoch ms or a "
                f"timestamp), or a window with a timestamp_field, or set {TTL_CLOCK}: processing"
            )
            if ttl is not None:
                msg = f"{refused} (its {TTL_MS} is {raw!r})"
                raise ConfigError(msg)
        return cls(ttl, clock, field if not windowed else None, windowed, refused)


class EventClock:
    """The newest event time among the tuples a task processed (the event clock of a component without windows).

    Read per tuple from the settings' ``timestamp_field``; a tuple without a usable time
    does not move it (counted, and reported once per origin).
    """

    __slots__ = ("_positions", "bad", "field", "newest")

    def __init__(self, field: str) -> None:
        self.field = field
        self.newest = NO_TIME
        self.bad = 0
        self._positions: dict[TupleSource, int] = {}

    def _position(self, source: TupleSource) -> int:
        pos = self._positions.get(source)
        if pos is None:
            pos = source.index.get(self.field, -1)
            self._positions[source] = pos
            if pos < 0 and not source.is_tick:
                logger.error(
                    "TTL event clock: tuples from %r stream %r have no field %r (fields %s); they do not move it",
                    source.component,
                    source.stream,
                    self.field,
                    list(source.fields),
                )
        return pos

    def observe(self, items: list[QueueItem]) -> None:
        """Move the clock by what ``items`` carry (before they are processed)."""
        newest = self.newest
        field = self.field
        for _task, payload in items:
            if type(payload) is list:
                for tup in payload:
                    pos = self._position(tup.source)
                    if pos < 0:
                        continue
                    try:
                        ts = event_ms(tup.values[pos], field)
                    except WindowError:
                        self.bad += 1
                        continue
                    if ts > newest:
                        newest = ts
            elif isinstance(payload, ColumnarBatch):
                pos = self._position(payload.source)
                if pos < 0 or payload.data.num_rows == 0:
                    continue
                top = pc.max(payload.data.column(pos)).as_py()
                if top is None:
                    continue
                try:
                    ts = event_ms(top, field)
                except WindowError:
                    self.bad += payload.data.num_rows
                    continue
                if ts > newest:
                    newest = ts
        self.newest = newest

    def now(self) -> int | None:
        """Return the clock (None: no event time seen yet)."""
        return None if self.newest == NO_TIME else self.newest
