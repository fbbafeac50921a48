"""Window specs: what a windowed component's ``window:`` block (or Storm's config keys) says.

A component declares its window in YAML with the names of Storm's ``BaseWindowedBolt``
builder methods::

    window:
      length: 60s              # or "100 tuples"                  (withWindow)
      sliding: 10s             # or "10 tuples"; omit: tumbling   (withWindow / withTumblingWindow)
      timestamp_field: ts      # event time; omit: processing time (withTimestampField)
      lag: 5s                  # allowed out-of-orderness         (withLag)
      watermark_interval: 1s   # how often idle windows are looked at (withWatermarkInterval)
      late_stream: late        # late tuples go there              (withLateTupleStream)
      key: user                # one window per key (and per session)
    # or: window: {session_gap: 30s, timestamp_field: ts, key: user}

The block becomes Storm's config keys in the component's conf (``topology.bolts.window.*``,
as ``BaseWindowedBolt.getComponentConfiguration`` puts them), so a component may set those
keys directly instead, and the spec travels wherever the topology does.  Length and slide
are of one kind: both durations or both counts (Storm's eight forms are count or duration,
sliding or tumbling, processing or event time).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from spark_storm.errors import ConfigError
from spark_storm.plugins import did_you_mean

__all__ = [
    "LAG_KEY",
    "LATE_STREAM_KEY",
    "WATERMARK_INTERVAL_KEY",
    "WINDOW_CONF_KEYS",
    "WindowSpec",
    "check_window_inputs",
    "parse_duration_ms",
    "window_conf",
    "window_spec",
]

LENGTH_COUNT_KEY: Final = "topology.bolts.window.length.count"
LENGTH_DURATION_KEY: Final = "topology.bolts.window.length.duration.ms"
SLIDING_COUNT_KEY: Final = "topology.bolts.window.sliding.interval.count"
SLIDING_DURATION_KEY: Final = "topology.bolts.window.sliding.interval.duration.ms"
TIMESTAMP_FIELD_KEY: Final = "topology.bolts.tuple.timestamp.field.name"
LAG_KEY: Final = "topology.bolts.tuple.timestamp.max.lag.ms"
WATERMARK_INTERVAL_KEY: Final = "topology.bolts.watermark.event.interval.ms"
LATE_STREAM_KEY: Final = "topology.bolts.late.tuple.stream"
SESSION_GAP_KEY: Final = "topology.bolts.window.session.gap.ms"
KEY_FIELDS_KEY: Final = "topology.bolts.window.key.fields"
EPOCH_WATERMARK_KEY: Final = "topology.bolts.watermark.at.epochs"

#: The keys that make a component windowed (the rest have topology-wide defaults).
_SHAPE_KEYS: Final = (LENGTH_COUNT_KEY, LENGTH_DURATION_KEY, SESSION_GAP_KEY)
WINDOW_CONF_KEYS: Final = (
    LENGTH_COUNT_KEY,
    LENGTH_DURATION_KEY,
    SLIDING_COUNT_KEY,
    SLIDING_DURATION_KEY,
    TIMESTAMP_FIELD_KEY,
    LAG_KEY,
    WATERMARK_INTERVAL_KEY,
    LATE_STREAM_KEY,
    SESSION_GAP_KEY,
    KEY_FIELDS_KEY,
)
_BLOCK_KEYS: Final = (
    "length",
    "sliding",
    "timestamp_field",
    "lag",
    "watermark_interval",
    "late_stream",
    "session_gap",
    "key",
)
DEFAULT_WATERMARK_INTERVAL_MS: Final = 1000

_UNITS_MS: Final = {
    "ms": 1,
    "millis": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "secs": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "mins": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}
_AMOUNT: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")


def _amount(value: Any, where: str) -> tuple[str, int]:
    """Parse ``"60s"`` / ``"1.5 minutes"`` / ``"100 tuples"`` into ("duration", ms) or ("count", n)."""
    text = value if isinstance(value, str) else None
    match = _AMOUNT.match(text) if text is not None else None
    if match is None:
        msg = (
            f"{where}: {value!r} is not a duration or a count; write it with its unit, "
            "e.g. '60s', '500ms', '5m', '1h' or '100 tuples'"
        )
        raise ConfigError(msg)
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit in ("tuple", "tuples"):
        if number != int(number) or number < 1:
            msg = f"{where}: {value!r}: a count of tuples is a whole number >= 1"
            raise ConfigError(msg)
        return "count", int(number)
    scale = _UNITS_MS.get(unit)
    if scale is None:
        hint = did_you_mean(unit, [*_UNITS_MS, "tuples"], lead="; ")
        msg = f"{where}: unknown unit {unit!r} in {value!r}{hint} (use ms, s, m, h, d or tuples)"
        raise ConfigError(msg)
    ms = number * scale
    if ms != int(ms) or ms < 1:
        msg = f"{where}: {value!r} must be a whole number of milliseconds >= 1"
        raise ConfigError(msg)
    return "duration", int(ms)


def parse_duration_ms(value: Any, where: str) -> int:
    """Return a duration (``"5s"``, ``"250ms"``) in milliseconds; a count is refused."""
    kind, amount = _amount(value, where)
    if kind != "duration":
        msg = f"{where}: {value!r} is a count; this setting is a duration, e.g. '5s' or '500ms'"
        raise ConfigError(msg)
    return amount


def window_conf(block: Any, where: str) -> dict[str, Any]:
    """Turn a YAML ``window:`` block into Storm's component config keys (validated by :func:`window_spec`)."""
    if not isinstance(block, Mapping):
        msg = f"{where}: 'window' must be a mapping, e.g. {{length: 60s, sliding: 10s, timestamp_field: ts}}"
        raise ConfigError(msg)
    for key in block:
        if key not in _BLOCK_KEYS:
            hint = did_you_mean(str(key), _BLOCK_KEYS)
            msg = f"{where}: unknown window key {key!r}.{hint} Allowed: {', '.join(_BLOCK_KEYS)}"
            raise ConfigError(msg)
    conf: dict[str, Any] = {}
    if "session_gap" in block:
        for clash in ("length", "sliding"):
            if clash in block:
                msg = (
                    f"{where}.window: 'session_gap' and '{clash}' exclude each other; a session window "
                    "has no fixed length (drop one of them)"
                )
                raise ConfigError(msg)
        conf[SESSION_GAP_KEY] = parse_duration_ms(block["session_gap"], f"{where}.window.session_gap")
    elif "length" not in block:
        msg = f"{where}.window needs 'length' (e.g. 60s or '100 tuples') or 'session_gap'"
        raise ConfigError(msg)
    else:
        kind, length = _amount(block["length"], f"{where}.window.length")
        conf[LENGTH_COUNT_KEY if kind == "count" else LENGTH_DURATION_KEY] = length
        if "sliding" in block:
            skind, sliding = _amount(block["sliding"], f"{where}.window.sliding")
            if skind != kind:
                msg = (
                    f"{where}.window: length {block['length']!r} and sliding {block['sliding']!r} mix a count "
                    "and a duration; give both in tuples (e.g. '100 tuples' / '10 tuples') or both as "
                    "durations (e.g. 60s / 10s)"
                )
                raise ConfigError(msg)
            conf[SLIDING_COUNT_KEY if kind == "count" else SLIDING_DURATION_KEY] = sliding
    if "timestamp_field" in block:
        field = block["timestamp_field"]
        if not isinstance(field, str) or not field:
            msg = f"{where}.window.timestamp_field must name an input field, got {field!r}"
            raise ConfigError(msg)
        conf[TIMESTAMP_FIELD_KEY] = field
    if "lag" in block:
        conf[LAG_KEY] = 0 if block["lag"] in (0, "0") else parse_duration_ms(block["lag"], f"{where}.window.lag")
    if "watermark_interval" in block:
        interval = block["watermark_interval"]
        conf[WATERMARK_INTERVAL_KEY] = parse_duration_ms(interval, f"{where}.window.watermark_interval")
    if "late_stream" in block:
        stream = block["late_stream"]
        if not isinstance(stream, str) or not stream:
            msg = f"{where}.window.late_stream must name a stream, got {stream!r}"
            raise ConfigError(msg)
        conf[LATE_STREAM_KEY] = stream
    if "key" in block:
        key = block["key"]
        keys = [key] if isinstance(key, str) else key
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
            msg = f"{where}.window.key must name an input field or a list of them, got {key!r}"
            raise ConfigError(msg)
        conf[KEY_FIELDS_KEY] = list(keys)
    return conf


@dataclass(frozen=True)
class WindowSpec:
    """A component's window, validated.

    Attributes
    ----------
    kind : str
        ``"duration"``, ``"count"`` or ``"session"``.
    length : int
        Milliseconds (duration), tuples (count), or the gap in milliseconds (session).
    sliding : int
        Slide in the length's unit; equal to ``length`` for a tumbling window (sessions: 0).
    timestamp_field : str or None
        The event-time field; None for processing time.
    lag_ms : int
        Allowed out-of-orderness: the watermark trails the newest event by this much.
    watermark_interval_ms : int
        How often a task looks at its windows without input (processing-time windows fire
        then; an idle stream's windows wait for newer events, as in Storm and Spark).
    late_stream : str or None
        Where tuples older than the watermark go; None: counted and dropped.
    key : tuple of str
        Fields keying the windows (one window per key); empty: one per task.
    epoch_watermark : bool
        Event time: the watermark moves at checkpoint epochs (every input channel delivered
        the epoch, as Spark moves its watermark between micro-batches), so tuples that the
        parallel tasks upstream reorder within an epoch, or a replay after a rollback, are
        never late; False (``topology.bolts.watermark.at.epochs: false``): at every tuple,
        as Storm does.
    """

    kind: str
    length: int
    sliding: int
    timestamp_field: str | None = None
    lag_ms: int = 0
    watermark_interval_ms: int = DEFAULT_WATERMARK_INTERVAL_MS
    late_stream: str | None = None
    key: tuple[str, ...] = ()
    epoch_watermark: bool = True

    @property
    def event_time(self) -> bool:
        return self.timestamp_field is not None

    @property
    def tumbling(self) -> bool:
        return self.kind != "session" and self.sliding == self.length

    @property
    def pane(self) -> int:
        """The greatest slice every window of a duration spec is made of (gcd of length and slide)."""
        return math.gcd(self.length, self.sliding) if self.kind == "duration" else 0

    def describe(self) -> str:
        """One line in the YAML's own terms (logs, ``topology plan``)."""
        unit = "ms" if self.kind != "count" else " tuples"
        if self.kind == "session":
            shape = f"session gap {self.length}ms"
        elif self.tumbling:
            shape = f"tumbling {self.length}{unit}"
        else:
            shape = f"sliding {self.length}{unit} every {self.sliding}{unit}"
        clock = f"event time {self.timestamp_field!r}, lag {self.lag_ms}ms" if self.event_time else "processing time"
        keyed = f", per {'/'.join(self.key)}" if self.key else ""
        late = f", late -> {self.late_stream!r}" if self.late_stream else ""
        return f"{shape}, {clock}{keyed}{late}"


def _positive(conf: Mapping[str, Any], key: str, where: str) -> int | None:
    value = conf.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{where}: {key} must be a whole number >= 1, got {value!r}"
        raise ConfigError(msg)
    return value


def window_spec(
    component_conf: Mapping[str, Any], where: str, defaults: Mapping[str, Any] | None = None
) -> WindowSpec | None:
    """Return the window a component's conf declares (Storm's keys), or None for an unwindowed one.

    Parameters
    ----------
    component_conf : Mapping
        The component's own conf: a window is declared per component.
    where : str
        Names the component in errors.
    defaults : Mapping, optional
        Topology and worker conf, for the lag and watermark interval a component leaves unset.

    Raises
    ------
    ConfigError
        A bad combination, naming the key and the fix.
    """
    if not any(component_conf.get(k) is not None for k in _SHAPE_KEYS):
        for key in (SLIDING_COUNT_KEY, SLIDING_DURATION_KEY, TIMESTAMP_FIELD_KEY, LATE_STREAM_KEY, KEY_FIELDS_KEY):
            if component_conf.get(key) is not None:
                msg = f"{where}: {key} is set but the component has no window; give 'window: {{length: ...}}'"
                raise ConfigError(msg)
        return None
    merged = {**(defaults or {}), **component_conf}
    count = _positive(component_conf, LENGTH_COUNT_KEY, where)
    duration = _positive(component_conf, LENGTH_DURATION_KEY, where)
    gap = _positive(component_conf, SESSION_GAP_KEY, where)
    slide_count = _positive(component_conf, SLIDING_COUNT_KEY, where)
    slide_duration = _positive(component_conf, SLIDING_DURATION_KEY, where)
    if sum(v is not None for v in (count, duration, gap)) > 1:
        msg = f"{where}: a window has one length: a count, a duration or a session gap, not several"
        raise ConfigError(msg)
    if slide_count is not None and slide_duration is not None:
        msg = f"{where}: a window slides by a count or by a duration, not both"
        raise ConfigError(msg)
    key_fields = component_conf.get(KEY_FIELDS_KEY) or ()
    if isinstance(key_fields, str):
        key_fields = (key_fields,)
    if not isinstance(key_fields, Sequence) or not all(isinstance(k, str) for k in key_fields):
        msg = f"{where}: {KEY_FIELDS_KEY} must be a list of field names, got {key_fields!r}"
        raise ConfigError(msg)
    if gap is not None:
        if slide_count is not None or slide_duration is not None:
            msg = f"{where}: a session window does not slide; drop 'sliding'"
            raise ConfigError(msg)
        kind, length, sliding = "session", gap, 0
    elif count is not None:
        if slide_duration is not None:
            msg = (
                f"{where}: a window of {count} tuples slides by tuples, not by {slide_duration}ms; "
                "give both in tuples or both as durations"
            )
            raise ConfigError(msg)
        kind, length, sliding = "count", count, slide_count or count
    else:
        assert duration is not None
        if slide_count is not None:
            msg = (
                f"{where}: a window of {duration}ms slides by a duration, not by {slide_count} tuples; "
                "give both in tuples or both as durations"
            )
            raise ConfigError(msg)
        kind, length, sliding = "duration", duration, slide_duration or duration
    if kind != "session" and sliding > length:
        unit = "ms" if kind == "duration" else " tuples"
        msg = (
            f"{where}: the window slides by {sliding}{unit}, more than its length {length}{unit}, so tuples "
            "between windows would belong to none; make sliding <= length (equal: a tumbling window)"
        )
        raise ConfigError(msg)
    ts_field = component_conf.get(TIMESTAMP_FIELD_KEY)
    if ts_field is not None and (not isinstance(ts_field, str) or not ts_field):
        msg = f"{where}: {TIMESTAMP_FIELD_KEY} must name an input field, got {ts_field!r}"
        raise ConfigError(msg)
    lag = merged.get(LAG_KEY) or 0
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
        msg = f"{where}: {LAG_KEY} must be milliseconds >= 0, got {lag!r}"
        raise ConfigError(msg)
    if component_conf.get(LAG_KEY) and ts_field is None:
        msg = f"{where}: 'lag' applies to event time; give 'timestamp_field' too (or drop 'lag')"
        raise ConfigError(msg)
    late = component_conf.get(LATE_STREAM_KEY)
    if late is not None and ts_field is None:
        msg = f"{where}: 'late_stream' needs event time ('timestamp_field'); with processing time no tuple is late"
        raise ConfigError(msg)
    interval = merged.get(WATERMARK_INTERVAL_KEY) or DEFAULT_WATERMARK_INTERVAL_MS
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        msg = f"{where}: {WATERMARK_INTERVAL_KEY} must be milliseconds >= 1, got {interval!r}"
        raise ConfigError(msg)
    epochs = merged.get(EPOCH_WATERMARK_KEY, True)
    if not isinstance(epochs, bool):
        msg = f"{where}: {EPOCH_WATERMARK_KEY} must be true or false, got {epochs!r}"
        raise ConfigError(msg)
    return WindowSpec(
        kind=kind,
        length=length,
        sliding=sliding,
        timestamp_field=ts_field,
        lag_ms=lag if ts_field is not None else 0,
        watermark_interval_ms=interval,
        late_stream=late,
        key=tuple(key_fields),
        epoch_watermark=epochs,
    )


def check_window_inputs(spec: WindowSpec, where: str, inputs: Mapping[str, Sequence[str]]) -> None:
    """Check the spec's fields against every input stream's fields (``{"comp/stream": fields}``).

    Raises
    ------
    ConfigError
        ``timestamp_field`` or a key field missing from an input, naming the input and its fields.
    """
    wanted = [("timestamp_field", spec.timestamp_field)] if spec.timestamp_field else []
    wanted += [("key", k) for k in spec.key]
    for what, name in wanted:
        for stream, fields in inputs.items():
            if name not in fields:
                hint = did_you_mean(str(name), fields, lead="; ")
                msg = (
                    f"{where}: window {what} {name!r} is not among the fields of input {stream} "
                    f"{list(fields)}{hint}; name one of them"
                )
                raise ConfigError(msg)
