"""Topologies: components, streams, groupings; declared in YAML or with a builder.

A topology is a set of components.  A *source* is an entry component: Spark (or any
client) sends tuples to its tasks; its bolt (by default a pass-through) emits them on.
Every other component names a bolt class and its inputs, each with a grouping.

YAML form (conf/topologies/wordcount.yaml)::

    name: wordcount
    components:
      - id: sentences
        source: true
        fields: [sentence]          # the default stream's fields
        parallelism: 2
      - id: split
        bolt: spark_storm.examples.wordcount:SplitBolt
        parallelism: 2
        tasks: 4
        fields: [word]
        inputs:
          - {from: sentences, grouping: shuffle}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from spark_storm.config import read_yaml
from spark_storm.errors import ConfigError
from spark_storm.plugins import did_you_mean, load_object

__all__ = [
    "DEFAULT_STREAM",
    "GROUPINGS",
    "PASS_THROUGH_BOLT",
    "Component",
    "Input",
    "Topology",
    "TopologyBuilder",
    "load_topology",
]

DEFAULT_STREAM: Final = "default"
PASS_THROUGH_BOLT: Final = "spark_storm.worker.bolt:PassThroughBolt"
GROUPINGS: Final = (
    "shuffle",
    "fields",
    "all",
    "global",
    "direct",
    "local_or_shuffle",
    "none",
    "load_aware",
)


@dataclass(frozen=True)
class Input:
    """One subscription: ``component``'s ``stream``, distributed by ``grouping``."""

    component: str
    grouping: str = "shuffle"
    stream: str = DEFAULT_STREAM
    fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class Component:
    """A bolt (or source) with its parallelism, task count, outputs and inputs.

    Attributes
    ----------
    id : str
        Unique name.
    bolt : str
        Dotted path of the bolt class (``pkg.mod:Class`` or ``pkg.mod.Class``).
    parallelism : int
        Executors (threads) running the component.
    tasks : int
        Task instances (>= parallelism); executors own contiguous task ranges.
    outputs : Mapping[str, tuple[str, ...]]
        Output fields per stream.
    inputs : tuple[Input, ...]
        Subscriptions.
    source : bool
        Entry component fed by external clients (Spark).
    conf : Mapping[str, Any]
        Component-level configuration handed to ``prepare``.
    """

    id: str
    bolt: str = PASS_THROUGH_BOLT
    parallelism: int = 1
    tasks: int = 0
    outputs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    inputs: tuple[Input, ...] = ()
    source: bool = False
    conf: Mapping[str, Any] = field(default_factory=dict)
    #: Sources only: how clients (Spark) spread tuples over the source's tasks.
    grouping: str = "shuffle"
    grouping_fields: tuple[str, ...] = ()

    @property
    def num_tasks(self) -> int:
        return self.tasks or self.parallelism

    def fields_of(self, stream: str = DEFAULT_STREAM) -> tuple[str, ...]:
        """Return the output fields of ``stream`` (empty if undeclared)."""
        return tuple(self.outputs.get(stream, ()))


@dataclass(frozen=True)
class Topology:
    """A validated topology.

    Attributes
    ----------
    name : str
        Topology id (also the id clients name in the handshake).
    components : Mapping[str, Component]
        By id.
    workers : tuple[str, ...]
        Default worker slots (``host:port``) when none are given at run time.
    conf : Mapping[str, Any]
        Topology configuration (``topology.*`` keys), merged over the defaults.
    """

    name: str
    components: Mapping[str, Component]
    workers: tuple[str, ...] = ()
    conf: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def sources(self) -> list[Component]:
        return [c for c in self.components.values() if c.source]

    def component(self, component_id: str) -> Component:
        """Return a component by id, with a "did you mean" when it does not exist."""
        try:
            return self.components[component_id]
        except KeyError:
            hint = did_you_mean(component_id, self.components, lead="; ")
            msg = (
                f"topology {self.name!r} has no component {component_id!r}{hint} "
                f"(it has {', '.join(sorted(self.components))})"
            )
            raise ConfigError(msg) from None

    def consumers(self, component_id: str, stream: str = DEFAULT_STREAM) -> list[tuple[Component, Input]]:
        """Return the components subscribed to ``component_id``'s ``stream``, sorted by id."""
        out = []
        for comp in sorted(self.components.values(), key=lambda c: c.id):
            for inp in comp.inputs:
                if inp.component == component_id and inp.stream == stream:
                    out.append((comp, inp))
        return out


def _validate(topo: Topology) -> None:
    if not topo.name or not isinstance(topo.name, str):
        msg = "a topology needs a non-empty 'name'"
        raise ConfigError(msg)
    if not topo.components:
        msg = f"topology {topo.name!r} has no components"
        raise ConfigError(msg)
    for comp in topo.components.values():
        where = f"topology {topo.name!r}, component {comp.id!r}"
        if comp.parallelism < 1:
            msg = f"{where}: parallelism must be >= 1, got {comp.parallelism}"
            raise ConfigError(msg)
        if comp.tasks and comp.tasks < comp.parallelism:
            msg = f"{where}: tasks ({comp.tasks}) must be >= parallelism ({comp.parallelism})"
            raise ConfigError(msg)
        if comp.source:
            if comp.grouping not in GROUPINGS:
                hint = did_you_mean(comp.grouping, GROUPINGS)
                msg = f"{where}: unknown grouping {comp.grouping!r}.{hint} Use one of {', '.join(GROUPINGS)}"
                raise ConfigError(msg)
            missing = [f for f in comp.grouping_fields if f not in comp.fields_of(DEFAULT_STREAM)]
            if comp.grouping == "fields" and (not comp.grouping_fields or missing):
                msg = (
                    f"{where}: fields grouping needs 'grouping_fields' among its fields "
                    f"{list(comp.fields_of(DEFAULT_STREAM))}"
                )
                raise ConfigError(msg)
        elif comp.grouping != "shuffle" or comp.grouping_fields:
            msg = f"{where}: 'grouping' on a component applies to sources; bolts set it per input"
            raise ConfigError(msg)
        if comp.source and comp.inputs:
            msg = f"{where}: a source gets its tuples from clients, it cannot have inputs"
            raise ConfigError(msg)
        if not comp.source and not comp.inputs:
            msg = f"{where}: has no inputs; give it 'inputs' or mark it 'source: true'"
            raise ConfigError(msg)
        for inp in comp.inputs:
            upstream = topo.component(inp.component)
            if inp.grouping not in GROUPINGS:
                hint = did_you_mean(inp.grouping, GROUPINGS)
                msg = f"{where}: unknown grouping {inp.grouping!r}.{hint} Use one of {', '.join(GROUPINGS)}"
                raise ConfigError(msg)
            declared = upstream.fields_of(inp.stream)
            if inp.stream not in upstream.outputs:
                msg = (
                    f"{where}: subscribes to stream {inp.stream!r} of {upstream.id!r}, which declares "
                    f"only {sorted(upstream.outputs) or 'no streams'}"
                )
                raise ConfigError(msg)
            if inp.grouping == "fields":
                if not inp.fields:
                    msg = f"{where}: fields grouping on {upstream.id!r} needs 'fields'"
                    raise ConfigError(msg)
                missing = [f for f in inp.fields if f not in declared]
                if missing:
                    msg = (
                        f"{where}: groups on {missing} but {upstream.id!r} stream {inp.stream!r} "
                        f"has fields {list(declared)}"
                    )
                    raise ConfigError(msg)
    if not topo.sources:
        msg = f"topology {topo.name!r} has no source component (mark one 'source: true')"
        raise ConfigError(msg)


def resolve_class(path: str, what: str) -> Any:
    """Import ``pkg.mod:Class`` or ``pkg.mod.Class`` (see :func:`spark_storm.plugins.load_object`)."""
    return load_object(path, what)


# ------------------------------------------------------------------------ YAML
_COMPONENT_KEYS: Final = {
    "id",
    "bolt",
    "parallelism",
    "tasks",
    "fields",
    "outputs",
    "inputs",
    "source",
    "conf",
    "grouping",
    "grouping_fields",
}
_INPUT_KEYS: Final = {"from", "grouping", "stream", "fields"}


def _strs(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        msg = f"{where} must be a list of names, got {value!r}"
        raise ConfigError(msg)
    return tuple(value)


def _unknown_keys(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    for key in data:
        if key not in allowed:
            hint = did_you_mean(str(key), allowed)
            msg = f"{where}: unknown key {key!r}.{hint} Allowed: {', '.join(sorted(allowed))}"
            raise ConfigError(msg)


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{where} must be an integer, got {value!r}"
        raise ConfigError(msg)
    return value


def topology_from_dict(data: Mapping[str, Any], origin: str = "topology") -> Topology:
    """Build a topology from its YAML/JSON mapping form."""
    if not isinstance(data, Mapping):
        msg = f"{origin}: a topology must be a mapping with 'name' and 'components'"
        raise ConfigError(msg)
    _unknown_keys(data, {"name", "components", "workers", "conf"}, origin)
    comps: dict[str, Component] = {}
    raw_components = data.get("components") or []
    if not isinstance(raw_components, list):
        msg = f"{origin}: 'components' must be a list"
        raise ConfigError(msg)
    for i, raw in enumerate(raw_components):
        where = f"{origin}: components[{i}]"
        if not isinstance(raw, Mapping) or "id" not in raw:
            msg = f"{where} must be a mapping with an 'id'"
            raise ConfigError(msg)
        _unknown_keys(raw, _COMPONENT_KEYS, f"{where} ({raw['id']})")
        cid = str(raw["id"])
        if cid in comps:
            msg = f"{origin}: component id {cid!r} is declared twice"
            raise ConfigError(msg)
        outputs: dict[str, tuple[str, ...]] = {}
        if "fields" in raw:
            outputs[DEFAULT_STREAM] = _strs(raw["fields"], f"{where}.fields")
        for stream, names in (raw.get("outputs") or {}).items():
            outputs[str(stream)] = _strs(names, f"{where}.outputs.{stream}")
        inputs = []
        for j, inp in enumerate(raw.get("inputs") or []):
            iw = f"{where}.inputs[{j}]"
            if not isinstance(inp, Mapping) or "from" not in inp:
                msg = f"{iw} must be a mapping with 'from' (and 'grouping')"
                raise ConfigError(msg)
            _unknown_keys(inp, _INPUT_KEYS, iw)
            inputs.append(
                Input(
                    component=str(inp["from"]),
                    grouping=str(inp.get("grouping", "shuffle")),
                    stream=str(inp.get("stream", DEFAULT_STREAM)),
                    fields=_strs(inp.get("fields", ()), f"{iw}.fields"),
                )
            )
        source = bool(raw.get("source", False))
        comps[cid] = Component(
            id=cid,
            bolt=str(raw.get("bolt", PASS_THROUGH_BOLT)),
            parallelism=_int(raw.get("parallelism", 1), f"{where}.parallelism"),
            tasks=_int(raw.get("tasks", 0), f"{where}.tasks"),
            outputs=outputs,
            inputs=tuple(inputs),
            source=source,
            conf=dict(raw.get("conf") or {}),
            grouping=str(raw.get("grouping", "shuffle")),
            grouping_fields=_strs(raw.get("grouping_fields", ()), f"{where}.grouping_fields"),
        )
    return Topology(
        name=str(data.get("name", "")),
        components=comps,
        workers=_strs(data.get("workers", ()), f"{origin}: workers"),
        conf=dict(data.get("conf") or {}),
    )


def load_topology(path: str | Path) -> Topology:
    """Read a topology YAML file.

    Raises
    ------
    ConfigError
        Unreadable file, bad YAML, or an invalid topology (the message names the part).
    """
    return topology_from_dict(read_yaml(path, "topology file"), origin=str(path))


class TopologyBuilder:
    """Declare a topology in Python (Storm's ``TopologyBuilder``)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._components: dict[str, Component] = {}
        self._conf: dict[str, Any] = {}
        self._workers: tuple[str, ...] = ()

    def source(
        self,
        component_id: str,
        fields: Sequence[str],
        parallelism: int = 1,
        tasks: int = 0,
        bolt: str = PASS_THROUGH_BOLT,
    ) -> TopologyBuilder:
        """Add an entry component fed by clients; its tuples have ``fields``."""
        self._components[component_id] = Component(
            component_id, bolt, parallelism, tasks, {DEFAULT_STREAM: tuple(fields)}, (), True
        )
        return self

    def bolt(
        self,
        component_id: str,
        bolt: str,
        inputs: Sequence[Input],
        fields: Sequence[str] = (),
        parallelism: int = 1,
        tasks: int = 0,
        outputs: Mapping[str, Sequence[str]] | None = None,
        conf: Mapping[str, Any] | None = None,
    ) -> TopologyBuilder:
        """Add a bolt subscribed to ``inputs``; ``fields`` declares its default stream."""
        outs = {s: tuple(f) for s, f in (outputs or {}).items()}
        if fields:
            outs[DEFAULT_STREAM] = tuple(fields)
        self._components[component_id] = Component(
            component_id, bolt, parallelism, tasks, outs, tuple(inputs), False, dict(conf or {})
        )
        return self

    def conf(self, **values: Any) -> TopologyBuilder:
        """Set topology configuration (dots as in the keys: pass a dict via ``**{...}``)."""
        self._conf.update(values)
        return self

    def workers(self, *slots: str) -> TopologyBuilder:
        """Set the default worker slots (``host:port``)."""
        self._workers = tuple(slots)
        return self

    def build(self) -> Topology:
        """Validate and return the topology."""
        return Topology(self._name, dict(self._components), self._workers, dict(self._conf))
