"""The PySpark Python Data Source ``storm_state``: a topology's committed state as a DataFrame.

``spark.read.format("storm_state")`` reads the state of one stateful component, from a
savepoint (``option("path", DIR)``) or from a running topology's last committed epoch
(``option("zookeeper", ...)`` and ``option("topology", NAME)``); ``option("changes",
"true")`` reads its change feed instead (docs/design/state.md, "Reading state from Spark").

One partition per task: each Spark task opens its task's entries where they lie (the
savepoint directory, or the topology's state backend) and decodes them into one Arrow
record batch.  The driver only reads manifests, commit markers and a sample of values (to
infer the key and value types).  Key and value types follow the codec's Python values
back to the Spark types the writer takes them from (see :func:`infer_type`); a column
whose values do not share one type is JSON text.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    TimeType,
)

from spark_storm.config import Config, read_yaml
from spark_storm.errors import ConfigError, SavepointError, StateCorruptError, StateError, StormError
from spark_storm.plugins import closest
from spark_storm.state.backend import NO_EPOCH, TaskStore
from spark_storm.state.format import Entry
from spark_storm.state.kv import thaw

__all__ = ["OPTION_NAMES", "StateOptions", "StormStateDataSource", "infer_type"]

OPTION_NAMES: Final = (
    "path",
    "zookeeper",
    "topology",
    "component",
    "changes",
    "fromEpoch",
    "types",
    "sampleSize",
    "conf",
)
#: Options Spark itself may pass to a reader.
_SPARK_OWNED: Final = frozenset({"paths", "__path"})
#: Values sampled per task to infer the key and value types.
DEFAULT_SAMPLE: Final = 1000
OPS: Final = ("put", "delete", "expire")
_INT64_MAX: Final = 2**63 - 1
_INT64_MIN: Final = -(2**63)


# --- where the state lies ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StateOptions:
    """The read, resolved on the driver: where each task's entries lie, and the epoch to read (picklable).

    ``root`` is a savepoint directory (``tasks`` are then task indexes), or None for a live
    read of ``topology`` through its state backend (``conf``: the topology's configuration
    with the reader's overrides; ``tasks`` are task ids, in index order).
    """

    component: str
    epoch: int
    tasks: tuple[int, ...]
    changes: bool = False
    from_epoch: int = NO_EPOCH
    json_only: bool = False
    sample: int = DEFAULT_SAMPLE
    root: str | None = None
    topology: str | None = None
    conf: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def where(self) -> str:
        """Return the state read, for messages."""
        if self.root is not None:
            return f"savepoint {self.root}"
        return f"topology {self.topology!r}"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StateOptions:
        """Validate ``options`` and find the state they name (driver side).

        Raises
        ------
        ConfigError
            A missing, unknown or conflicting option (naming it and the fix).
        SavepointError
            ``path`` is not a savepoint, or it lacks the component (listing the ones it has).
        StateError
            A live read whose state backend Spark cannot reach (naming the fix).
        """
        lower = {str(k).lower(): str(v) for k, v in options.items()}
        known = {n.lower(): n for n in OPTION_NAMES}
        storm_keys = {str(k): v for k, v in options.items() if str(k).startswith(("storm.", "topology."))}
        for key in lower:
            if key in known or key in _SPARK_OWNED or key.startswith(("storm.", "topology.")):
                continue
            match = closest(key, known)
            hint = "" if match is None else f" Did you mean {known[match]!r}?"
            msg = f"unknown storm_state option {key!r}.{hint} Options: {', '.join(OPTION_NAMES)}, storm.* keys"
            raise ConfigError(msg)

        def get(name: str) -> str | None:
            value = lower.get(name.lower())
            return None if value is None or value == "" else value

        path, zookeeper = get("path"), get("zookeeper")
        if path and zookeeper:
            msg = (
                "storm_state: options 'path' and 'zookeeper' exclude each other: 'path' reads a savepoint, "
                "'zookeeper' (with 'topology') a running topology's last committed epoch; drop one"
            )
            raise ConfigError(msg)
        if not path and not zookeeper:
            msg = (
                "storm_state: give option 'path' (a savepoint directory, as `spark-storm savepoint` printed it) "
                "or options 'zookeeper' and 'topology' (a running topology's last committed epoch)"
            )
            raise ConfigError(msg)
        changes = _flag(get("changes"), "changes")
        from_text = get("fromEpoch")
        if from_text is not None and not changes:
            msg = "storm_state: option 'fromEpoch' is for the change feed; add option('changes', 'true')"
            raise ConfigError(msg)
        from_epoch = _int(from_text, "fromEpoch", minimum=0) if from_text is not None else NO_EPOCH
        types = (get("types") or "infer").lower()
        if types not in ("infer", "json"):
            msg = f"storm_state: option 'types'={types!r}: use 'infer' (default: Spark types) or 'json' (JSON text)"
            raise ConfigError(msg)
        sample = _int(get("sampleSize") or str(DEFAULT_SAMPLE), "sampleSize", minimum=1)
        common = {"changes": changes, "from_epoch": from_epoch, "json_only": types == "json", "sample": sample}
        if path:
            if storm_keys or get("conf") or get("topology"):
                given = sorted(k for k in lower if k.startswith(("storm.", "topology.")) or k in ("conf", "topology"))
                msg = (
                    f"storm_state: option(s) {', '.join(given)} are for a live read (with 'zookeeper'); "
                    "a savepoint ('path') needs only 'component'"
                )
                raise ConfigError(msg)
            return _from_savepoint(path, get("component"), common)
        topology = get("topology")
        if not topology:
            msg = "storm_state: option 'topology' is required with 'zookeeper': the submitted topology's name"
            raise ConfigError(msg)
        overrides = _overrides(get("conf"), storm_keys)
        assert zookeeper is not None
        return _from_zookeeper(zookeeper, topology, get("component"), overrides, common)


def _flag(text: str | None, name: str) -> bool:
    if text is None:
        return False
    value = text.strip().lower()
    if value not in ("true", "false"):
        msg = f"storm_state: option {name!r}={text!r}: use 'true' or 'false'"
        raise ConfigError(msg)
    return value == "true"


def _int(text: str, name: str, *, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        msg = f"storm_state: option {name!r}={text!r} must be an integer >= {minimum}"
        raise ConfigError(msg)
    return value


def _from_savepoint(path: str, component: str | None, common: dict[str, Any]) -> StateOptions:
    from spark_storm.state.savepoint import Savepoint

    # The files' checksums are checked where they are read (every entry carries a CRC-32):
    # the driver reads the manifest only.
    saved = Savepoint.open(path, check_files=False)
    comps = saved.manifest.components
    name = _component(component, sorted(comps), f"savepoint {saved.root}")
    return StateOptions(
        component=name,
        epoch=saved.manifest.epoch,
        tasks=tuple(range(comps[name].tasks)),
        root=str(saved.root.resolve()),
        **common,
    )


def _component(component: str | None, there: Sequence[str], where: str) -> str:
    listed = ", ".join(there) or "none"
    if component is None:
        if len(there) == 1:
            return there[0]
        msg = f"storm_state: option 'component' is required: {where} holds the state of {listed}"
        raise ConfigError(msg)
    if component not in there:
        hint = closest(component, list(there))
        extra = f" (did you mean {hint!r}?)" if hint else ""
        msg = f"{where} has no state of component {component!r}{extra}; set option 'component' to one of: {listed}"
        raise SavepointError(msg) if where.startswith("savepoint") else ConfigError(msg)
    return component


def _overrides(conf_path: str | None, storm_keys: Mapping[str, Any]) -> dict[str, Any]:
    """Return the reader's own configuration keys (a storm.yaml, then option keys): they win over the topology's."""
    out: dict[str, Any] = {}
    if conf_path:
        data = read_yaml(conf_path, "option 'conf'")
        if data is not None and not isinstance(data, dict):
            msg = f"storm_state: option 'conf'={conf_path!r} must hold a mapping of key: value"
            raise ConfigError(msg)
        out.update(data or {})
    out.update(storm_keys)
    return out


def _from_zookeeper(
    spec: str, name: str, component: str | None, overrides: Mapping[str, Any], common: dict[str, Any]
) -> StateOptions:
    from spark_storm.extras import require

    require("kazoo", "option 'zookeeper' of format('storm_state')")
    from spark_storm.cluster.session import ZooKeeperAddress
    from spark_storm.cluster.state import ClusterState
    from spark_storm.topology import plan

    conf = Config.of(dict(overrides))
    try:
        address = ZooKeeperAddress.parse(spec, conf)
    except ConfigError as exc:
        msg = f"storm_state: option 'zookeeper'={spec!r}: {exc}"
        raise ConfigError(msg) from exc
    with ClusterState(address, conf) as state:  # ZooKeeperUnavailableError names the address and the fix
        topology = state.read_topology(name).topology()  # UnknownTopologyError lists the submitted ones
        assignment = state.read_assignment(name)
    if assignment is not None and assignment.slots:
        the_plan = assignment.plan(topology)
    else:  # killed, or not assigned yet: task ids depend on the topology alone
        the_plan = plan(topology, "127.0.0.1:1")
    comp = _component(component, sorted(topology.components), f"topology {name!r}")
    merged = {**topology.conf, **topology.components[comp].conf, **overrides}
    tasks = tuple(the_plan.component_tasks[comp])
    stores = [_live_store(name, merged, task) for task in tasks]
    # The last committed epoch: every task prepared it before any was told to commit it, so
    # a task whose marker is behind (a commit under way) still holds its entry.
    epoch = max((s.committed() for s in stores if s is not None), default=NO_EPOCH)
    return StateOptions(component=comp, epoch=epoch, tasks=tasks, topology=name, conf=merged, **common)


def _live_store(topology: str, conf: Mapping[str, Any], task: int) -> TaskStore | None:
    """Task ``task``'s store in the topology's backend, as this process sees it (None: it never wrote).

    Raises
    ------
    StateError
        This process cannot reach the backend (naming the fix).
    """
    from spark_storm.state import make_backend, provider_settings
    from spark_storm.state.files import FileTaskStore, default_state_dir

    fix = (
        "or take a savepoint into a directory every Spark executor reads (spark-storm savepoint "
        f"{topology} --dir DIR) and read it with option('path', ...)"
    )
    provider, settings = provider_settings(Config.of(dict(conf)))
    if provider == "memory":
        msg = (
            f"storm_state: topology {topology!r} keeps its state in memory (topology.state.provider: memory), "
            f"inside its worker processes, where Spark cannot read it; use the embedded or redis provider, {fix}"
        )
        raise StateError(msg)
    if provider == "embedded":
        # The embedded backend creates its directories: look first, so a host without them reads nothing.
        base = Path(settings.get("dir") or default_state_dir())
        root = base / re.sub(r"[^A-Za-z0-9_.-]", "_", topology)
        if not root.is_dir():
            msg = (
                f"storm_state: topology {topology!r}'s embedded state dir {root} is not on this host: the embedded "
                "provider keeps state on the workers' host; run Spark there (or mount the dir and set "
                f"topology.state.provider.config in option 'conf'), use topology.state.provider redis, {fix}"
            )
            raise StateError(msg)
        task_dir = root / f"task-{task}"
        return FileTaskStore(task, task_dir) if task_dir.is_dir() else None
    try:
        return make_backend(Config.of(dict(conf)), topology).task_store(task)
    except StateError as exc:
        msg = f"storm_state: {exc}; Spark's driver and executors must reach topology {topology!r}'s state, {fix}"
        raise StateError(msg) from exc


def _task_store(opts: StateOptions, index: int) -> TaskStore | None:
    """Open the store of the ``index``-th task of the read where this process runs (an executor)."""
    if opts.root is None:
        assert opts.topology is not None
        store = _live_store(opts.topology, opts.conf, opts.tasks[index])
        if store is None and opts.epoch != NO_EPOCH:
            msg = (
                f"storm_state: topology {opts.topology!r} task {opts.tasks[index]} ({opts.component} #{index}) has "
                f"no state on this host, though epoch {opts.epoch} is committed: Spark's executors must see the "
                "state the driver saw (the embedded provider's dir is per host; use redis or a savepoint)"
            )
            raise StateError(msg)
        return store
    from spark_storm.state.files import FileTaskStore
    from spark_storm.state.savepoint import task_dir

    directory = task_dir(Path(opts.root), opts.component, index)
    if not directory.is_dir():
        msg = (
            f"storm_state: savepoint {opts.root}: {directory} is not readable here (host of this Spark executor): "
            "the savepoint directory must be readable by every executor (a shared file system, or copy it there)"
        )
        raise SavepointError(msg)
    return FileTaskStore(index, directory)


def _chosen(opts: StateOptions, store: TaskStore) -> list[int]:
    """Return the epochs of the entries a read needs, oldest first: from the last full snapshot (or ``fromEpoch``) on.

    A change feed whose ``fromEpoch`` is older than what a task keeps starts at the task's
    oldest entry, a full snapshot (or epoch 1): it sums up every change before it.
    """
    epochs = [e for e in store.epochs() if e <= opts.epoch]
    if opts.changes:  # a task keeps entries from a full snapshot (or epoch 1) on: none is missing after fromEpoch
        return [e for e in epochs if e >= opts.from_epoch]
    fulls = [e for e in store.fulls() if e <= opts.epoch]
    return [e for e in epochs if e >= (fulls[-1] if fulls else NO_EPOCH)]


def _read_entry(opts: StateOptions, store: TaskStore, epoch: int) -> Entry:
    try:
        return store.read(epoch)
    except StateCorruptError as exc:
        msg = f"{opts.where()}: {exc}"
        raise (SavepointError(msg) if opts.root is not None else StateError(msg)) from exc


def _restore(opts: StateOptions, index: int, store: TaskStore | None) -> dict[Any, Any]:
    if store is None or opts.epoch == NO_EPOCH:
        return {}
    try:
        return store.restore(opts.epoch)[1]
    except StateCorruptError as exc:
        later = f" (the topology committed past epoch {opts.epoch} while Spark read it: read again)"
        msg = f"{opts.where()} {opts.component} #{index}: {exc}{'' if opts.root else later}"
        raise (SavepointError(msg) if opts.root is not None else StateError(msg)) from exc


# --- types ---------------------------------------------------------------------------------------


class _Mixed:
    """Values that share no Spark type (the column becomes JSON text)."""


MIXED: Final = _Mixed()
_Inferred = DataType | _Mixed | None  # None: nothing but nulls seen


def _type_of(value: Any) -> _Inferred:
    kind = type(value)
    if value is None:
        return None
    if kind is bool:
        return BooleanType()
    if kind is int:
        return LongType() if _INT64_MIN <= value <= _INT64_MAX else DecimalType(38, 0)
    if kind is float:
        return DoubleType()
    if kind is str:
        return StringType()
    if kind is bytes or kind is bytearray:
        return BinaryType()
    if kind is dt.datetime:
        return TimestampNTZType() if value.tzinfo is None else TimestampType()
    if kind is dt.date:
        return DateType()
    if kind is decimal.Decimal:
        exponent = value.as_tuple().exponent
        scale = -exponent if isinstance(exponent, int) and exponent < 0 else 0
        return DecimalType(38, min(scale, 38)) if value.is_finite() else MIXED
    if kind is dt.timedelta:
        return DayTimeIntervalType()
    if kind is dt.time:
        return TimeType()
    if kind is list or kind is tuple:
        element: _Inferred = None
        for item in value:
            element = _merge(element, _type_of(item))
            if element is MIXED:
                return MIXED
        return ArrayType(element if isinstance(element, DataType) else StringType())
    if kind is dict:
        keys: _Inferred = None
        values: _Inferred = None
        for k, v in value.items():
            keys = _merge(keys, MIXED if k is None else _type_of(k))
            values = _merge(values, _type_of(v))
            if keys is MIXED or values is MIXED:
                return MIXED
        return MapType(
            keys if isinstance(keys, DataType) else StringType(),
            values if isinstance(values, DataType) else StringType(),
        )
    return MIXED


def _merge(a: _Inferred, b: _Inferred) -> _Inferred:
    if a is None:
        return b
    if b is None or a == b:
        return a
    if isinstance(a, _Mixed) or isinstance(b, _Mixed):
        return MIXED
    pair = {type(a), type(b)}
    if pair == {LongType, DoubleType}:
        return DoubleType()
    if isinstance(a, DecimalType) and isinstance(b, DecimalType):
        return DecimalType(38, max(a.scale, b.scale))
    if pair == {LongType, DecimalType}:
        return a if isinstance(a, DecimalType) else b
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return _container(ArrayType, _merge(a.elementType, b.elementType))
    if isinstance(a, MapType) and isinstance(b, MapType):
        k, v = _merge(a.keyType, b.keyType), _merge(a.valueType, b.valueType)
        return MapType(k, v) if isinstance(k, DataType) and isinstance(v, DataType) else MIXED
    return MIXED


def _container(kind: type[ArrayType], element: _Inferred) -> _Inferred:
    return kind(element) if isinstance(element, DataType) else MIXED


def infer_type(values: Iterable[Any]) -> DataType | None:
    """Return the Spark type of ``values`` (the codec's Python values), or None when they share none.

    The writer's mapping read backwards: str -> string, int -> bigint (beyond 64 bits:
    decimal(38,0)), float -> double, bool -> boolean, bytes -> binary, ``datetime`` with a
    zone -> timestamp, naive -> timestamp_ntz, ``date`` -> date, ``Decimal`` -> decimal(38, s)
    (s: the largest scale seen), ``timedelta`` -> interval day to second, ``time`` -> time,
    lists -> array<merged element>, dicts -> map<merged key, merged value> (structs were sent
    as dicts: they come back as maps, as Spark infers a Python dict).  bigint and double
    merge to double; nulls to anything.  All nulls -> string.
    """
    merged: _Inferred = None
    for value in values:
        merged = _merge(merged, _type_of(value))
        if merged is MIXED:
            return None
    return merged if isinstance(merged, DataType) else StringType()


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    msg = f"no JSON form for a {type(value).__name__}"
    raise TypeError(msg)


def _jsonable(value: Any) -> Any:
    """``value`` with maps whose keys JSON cannot take as lists of [key, value] pairs."""
    if isinstance(value, dict):
        if all(isinstance(k, str | int | float | bool) or k is None for k in value):
            return {k: _jsonable(v) for k, v in value.items()}
        return [[_jsonable(k), _jsonable(v)] for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def to_json(value: Any) -> str | None:
    """Return a value as JSON text (None stays null): bytes as base64, times as ISO 8601, decimals as strings."""
    if value is None:
        return None
    try:
        return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return json.dumps(_jsonable(value), default=_json_default, ensure_ascii=False, separators=(",", ":"))


def _column(values: list[Any], field: pa.Field, spark_type: DataType, json_text: bool, what: str) -> pa.Array:
    """Return an Arrow column of ``values`` for ``field`` (JSON text where ``json_text``; see the module doc)."""
    if json_text:
        return pa.array([to_json(v) for v in values], type=pa.string())
    if pa.types.is_string(field.type):  # typed strings: a non-str value is JSON text, not an error
        values = [v if v is None or type(v) is str else to_json(v) for v in values]
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as exc:
        bad = next((v for v in values if _fits(v, field.type) is False), None)
        shown = repr(bad)[:80] if bad is not None else "a value"
        msg = (
            f"storm_state: {what}: {shown} does not fit the column type {spark_type.simpleString()} ({exc}); "
            "read with option('types', 'json'), raise option 'sampleSize', or give the type with "
            ".schema('task int, key ..., value ..., epoch bigint')"
        )
        raise StateError(msg) from exc


def _fits(value: Any, arrow_type: pa.DataType) -> bool:
    try:
        pa.array([value], type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return False
    return True


# --- the schema ----------------------------------------------------------------------------------

#: A key or value column's metadata flag: every value is JSON text (the sampled values shared no type).
JSON_META: Final = "storm_state.json"
_FIXED: Final = {"task": IntegerType(), "epoch": LongType(), "op": StringType()}


def _schema(key: DataType | None, value: DataType | None, changes: bool) -> StructType:
    """Return the read's schema; a key or value of no one type (None) is JSON text, marked in the column's metadata."""
    fields = [
        StructField("task", IntegerType(), False),
        StructField("key", key or StringType(), True, {JSON_META: True} if key is None else None),
        StructField("value", value or StringType(), True, {JSON_META: True} if value is None else None),
        StructField("epoch", LongType(), False),
    ]
    if changes:
        fields.append(StructField("op", StringType(), False))
    return StructType(fields)


def _check_schema(schema: StructType, changes: bool) -> None:
    """Refuse a schema given with ``.schema(...)`` that lacks our columns, their order or their fixed types."""
    want = ["task", "key", "value", "epoch", *(["op"] if changes else [])]
    names = [f.name for f in schema.fields]
    wrong = [f.name for f in schema.fields if f.name in _FIXED and f.dataType != _FIXED[f.name]]
    if names != want or wrong:
        ddl = "task int, key <type>, value <type>, epoch bigint" + (", op string" if changes else "")
        msg = f"storm_state: a schema given with .schema() must be {ddl!r}, in that order; got {schema.simpleString()}"
        raise ConfigError(msg)


def _sample(opts: StateOptions) -> tuple[list[Any], list[Any]]:
    """Return keys and values (thawed) the read will return, up to ``sample`` per task, newest first (driver side).

    A snapshot read samples each key's latest value only (an older entry's is superseded);
    a change feed samples every entry it returns.
    """
    keys: list[Any] = []
    values: list[Any] = []
    for index in range(len(opts.tasks)):
        store = _task_store(opts, index)
        if store is None or (opts.epoch == NO_EPOCH and not opts.changes):
            continue
        taken = 0
        seen: set[Any] = set()
        for epoch in reversed(_chosen(opts, store)):
            entry = _read_entry(opts, store, epoch)
            if opts.changes:
                keys.extend(thaw(k) for k in entry.deletes[: opts.sample])
            else:
                seen.update(entry.deletes)
            for key, value in entry.puts.items():
                if key in seen:
                    continue
                if not opts.changes:
                    seen.add(key)
                keys.append(thaw(key))
                values.append(value)
                taken += 1
                if taken >= opts.sample:
                    break
            if taken >= opts.sample:
                break
    return keys, values


# --- the reader ----------------------------------------------------------------------------------


class TaskPartition(InputPartition):
    """One task of the component: its index (the partition's ``value``)."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class StormStateReader(DataSourceReader):
    """Reads each task's entries on an executor, one Arrow record batch per task (or per 64 Ki rows)."""

    #: Rows per record batch.
    BATCH_ROWS: Final = 65536

    def __init__(self, opts: StateOptions, schema: StructType, json_key: bool, json_value: bool) -> None:
        self.opts = opts
        self.schema = schema
        self.json_key = json_key
        self.json_value = json_value

    def partitions(self) -> list[InputPartition]:
        return [TaskPartition(i) for i in range(len(self.opts.tasks))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        index = int(partition.value)
        opts = self.opts
        store = _task_store(opts, index)
        rows: Iterator[tuple[Any, Any, int, str | None]]
        if opts.changes:
            rows = self._changes(store)
        else:
            data = _restore(opts, index, store)
            rows = ((key, value, opts.epoch, None) for key, value in data.items())
        yield from self._batches(index, rows)

    def _changes(self, store: TaskStore | None) -> Iterator[tuple[Any, Any, int, str | None]]:
        if store is None:
            return
        for epoch in _chosen(self.opts, store):
            entry = _read_entry(self.opts, store, epoch)
            for key, value in entry.puts.items():
                yield key, value, epoch, "put"
            expired = set(entry.expired)
            for key in entry.deletes:
                yield key, None, epoch, "expire" if key in expired else "delete"

    def _batches(self, index: int, rows: Iterator[tuple[Any, Any, int, str | None]]) -> Iterator[pa.RecordBatch]:
        arrow = to_arrow_schema(self.schema, timezone="UTC")
        fields = self.schema.fields
        what = f"{self.opts.where()} component {self.opts.component!r} task #{index}"
        while True:
            chunk = list(_take(rows, self.BATCH_ROWS))
            if not chunk:
                return
            keys = [thaw(r[0]) for r in chunk]
            columns = [
                pa.array([index] * len(chunk), type=pa.int32()),
                _column(keys, arrow.field(1), fields[1].dataType, self.json_key, f"{what}, a key"),
                _column([r[1] for r in chunk], arrow.field(2), fields[2].dataType, self.json_value, f"{what}, a value"),
                pa.array([r[2] for r in chunk], type=pa.int64()),
            ]
            if self.opts.changes:
                columns.append(pa.array([r[3] for r in chunk], type=pa.string()))
            yield pa.RecordBatch.from_arrays(columns, schema=arrow)


def _take(rows: Iterator[Any], n: int) -> Iterator[Any]:
    for _ in range(n):
        try:
            yield next(rows)
        except StopIteration:
            return


class StormStateDataSource(DataSource):
    """``spark.read.format("storm_state")``: a stateful component's state, or its change feed, as a DataFrame.

    Options (case-insensitive): ``path`` (a savepoint directory) or ``zookeeper`` with
    ``topology`` (a submitted topology: its last committed epoch, read through its state
    backend; ``conf`` (a storm.yaml) and ``storm.*``/``topology.*`` keys override the
    topology's), ``component`` (default: the only stateful one of a savepoint),
    ``changes`` (true: the change feed), ``fromEpoch`` (the feed's first epoch), ``types``
    (infer | json), ``sampleSize`` (values per task the types are inferred from; 1000).

    Columns: ``task`` (int, the task's index in its component), ``key``, ``value``,
    ``epoch`` (bigint), and for the change feed ``op`` (put | delete | expire).
    """

    @classmethod
    def name(cls) -> str:
        return "storm_state"

    def _opts(self) -> StateOptions:
        try:
            return StateOptions.parse(dict(self.options))
        except StormError:
            raise
        except OSError as exc:
            msg = f"storm_state: {exc}"
            raise StateError(msg) from exc

    def schema(self) -> StructType:
        opts = self._opts()
        if opts.json_only:
            return _schema(None, None, opts.changes)
        keys, values = _sample(opts)
        return _schema(infer_type(keys), infer_type(values), opts.changes)

    def reader(self, schema: StructType) -> StormStateReader:
        opts = self._opts()
        _check_schema(schema, opts.changes)
        key, value = schema.fields[1], schema.fields[2]
        json_key = opts.json_only or bool(key.metadata.get(JSON_META))
        json_value = opts.json_only or bool(value.metadata.get(JSON_META))
        return StormStateReader(opts, schema, json_key, json_value)
