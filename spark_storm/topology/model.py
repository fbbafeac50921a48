"""Topologies: components, streams, groupings; declared in YAML or with a builder.

A topology is a set of components.  A *source* is an entry component: Spark (or any
client) sends tuples to its tasks; its bolt (by default a pass-through) emits them on.
Every other component names a bolt class and its inputs, each with a grouping.

A *spout* is an entry component fed by its own spout class (a Python ``Spout``, or a
multilang child: Storm's ShellSpout) instead of by Spark.  Storm's Flux files are read
too (:mod:`spark_storm.topology.flux`): :mod:`spark_storm.topology.loader` tells them by their keys.

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
      - id: count
        shell: [python3, count.py]  # a multilang child (Storm's ShellBolt); `spout: true` for a ShellSpout
        fields: [word, count]
        inputs:
          - {from: split, grouping: fields, fields: [word]}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from spark_storm.errors import ConfigError
from spark_storm.plugins import did_you_mean, load_object
from spark_storm.topology.windows import LATE_STREAM_KEY, check_window_inputs, window_conf, window_spec

__all__ = [
    "CLASS_ADAPTER",
    "DEFAULT_STREAM",
    "GROUPINGS",
    "MULTILANG_COMMAND",
    "MULTILANG_DIR",
    "PASS_THROUGH_BOLT",
    "SHELL_BOLT",
    "SHELL_SPOUT",
    "Component",
    "Input",
    "Topology",
    "TopologyBuilder",
    "topology_from_mapping",
    "topology_to_dict",
]

DEFAULT_STREAM: Final = "default"
PASS_THROUGH_BOLT: Final = "spark_storm.worker.bolt:PassThroughBolt"
#: Storm's ShellBolt / ShellSpout: a multilang child runs the component.
SHELL_BOLT: Final = "spark_storm.shell:ShellBolt"
SHELL_SPOUT: Final = "spark_storm.shell:ShellSpout"
#: Turns the class a component names into one an executor runs (pystorm bolts in-process, Flux
#: constructor arguments); a dotted path, as the shell classes are, so the worker does not import
#: its wing (spark_storm.shell) and pystorm loads only when a topology uses it.
CLASS_ADAPTER: Final = "spark_storm.shell:adapt_class"
#: Component conf: the child's command (a list); the directory it runs in.
MULTILANG_COMMAND: Final = "topology.multilang.command"
MULTILANG_DIR: Final = "topology.multilang.dir"
GROUPINGS: Final = (
    "shuffle",
    "fields",
    "all",
    "global",
    "direct",
    "local_or_shuffle",
    "none",
    "load_aware",
    "custom",
)


@dataclass(frozen=True)
class Input:
    """One subscription: ``component``'s ``stream``, distributed by ``grouping``."""

    component: str
    grouping: str = "shuffle"
    stream: str = DEFAULT_STREAM
    fields: tuple[str, ...] = ()
    #: Custom grouping only: ``pkg.mod:Class`` of a ``CustomStreamGrouping`` and its constructor arguments.
    custom: str = ""
    custom_args: tuple[Any, ...] = ()


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
    spout : bool
        Entry component fed by its own spout class (``bolt`` names a ``Spout``), not by Spark.
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
    spout: bool = False

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
    #: What became what, for a topology converted from a Flux file (``topology plan`` prints it).
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def sources(self) -> list[Component]:
        return [c for c in self.components.values() if c.source]

    @property
    def spouts(self) -> list[Component]:
        return [c for c in self.components.values() if c.spout]

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
            if comp.grouping not in GROUPINGS or comp.grouping == "custom":
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
        if comp.spout and (comp.inputs or comp.source):
            msg = f"{where}: a spout makes its own tuples; it cannot have inputs nor be a source fed by Spark"
            raise ConfigError(msg)
        if not comp.source and not comp.spout and not comp.inputs:
            msg = f"{where}: has no inputs; give it 'inputs' or mark it 'source: true'"
            raise ConfigError(msg)
        _validate_window(topo, comp, where)
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
            if inp.grouping == "custom" and not inp.custom:
                msg = f"{where}: custom grouping on {upstream.id!r} needs 'class' (a CustomStreamGrouping)"
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
    if not topo.sources and not topo.spouts:
        msg = f"topology {topo.name!r} has no source component (mark one 'source: true') and no spout"
        raise ConfigError(msg)


def input_fields(topo: Topology, comp: Component) -> dict[str, tuple[str, ...]]:
    """Return the fields of every stream ``comp`` receives, by ``"component/stream"`` (a source: its clients')."""
    if comp.source:
        return {f"{comp.id} (from clients)": comp.fields_of(DEFAULT_STREAM)}
    return {f"{i.component}/{i.stream}": topo.components[i.component].fields_of(i.stream) for i in comp.inputs}


def _validate_window(topo: Topology, comp: Component, where: str) -> None:
    spec = window_spec(comp.conf, where, topo.conf)
    if spec is None:
        return
    if comp.spout:
        msg = f"{where}: a spout makes its own tuples; a window belongs on a bolt that subscribes to it"
        raise ConfigError(msg)
    inputs = input_fields(topo, comp)
    check_window_inputs(spec, where, inputs)
    if spec.late_stream is not None:
        declared = comp.outputs.get(spec.late_stream)
        if declared is None:
            msg = (
                f"{where}: late_stream {spec.late_stream!r} is not declared; declare it under 'outputs' "
                "with the input's fields"
            )
            raise ConfigError(msg)
        for stream, fields in inputs.items():
            if len(fields) != len(declared):
                msg = (
                    f"{where}: late tuples from {stream} have {len(fields)} fields {list(fields)} but "
                    f"late_stream {spec.late_stream!r} declares {list(declared)}; declare the input's fields"
                )
                raise ConfigError(msg)


def _declare_late_streams(comps: dict[str, Component]) -> None:
    """Give each windowed component's undeclared late stream its input's fields (when all inputs agree)."""
    from dataclasses import replace

    for cid, comp in list(comps.items()):
        late = comp.conf.get(LATE_STREAM_KEY)
        if not isinstance(late, str) or late in comp.outputs:
            continue
        if comp.source:
            fields = {comp.fields_of(DEFAULT_STREAM)}
        else:
            fields = {comps[i.component].fields_of(i.stream) if i.component in comps else () for i in comp.inputs}
        if len(fields) == 1:
            comps[cid] = replace(comp, outputs={**comp.outputs, late: next(iter(fields))})


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
    "spout",
    "shell",
    "window",
}
_INPUT_KEYS: Final = {"from", "grouping", "stream", "fields", "class", "args"}


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


def topology_from_mapping(data: Mapping[str, Any], origin: str = "topology") -> Topology:
    """Build a topology from our YAML/JSON mapping form (Flux too: :func:`~.loader.topology_from_dict`)."""
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
            args = inp.get("args", ())
            if not isinstance(args, (list, tuple)):
                msg = f"{iw}.args must be a list (the custom grouping's constructor arguments), got {args!r}"
                raise ConfigError(msg)
            inputs.append(
                Input(
                    component=str(inp["from"]),
                    grouping=str(inp.get("grouping", "shuffle")),
                    stream=str(inp.get("stream", DEFAULT_STREAM)),
                    fields=_strs(inp.get("fields", ()), f"{iw}.fields"),
                    custom=str(inp.get("class", "")),
                    custom_args=tuple(args),
                )
            )
        source = bool(raw.get("source", False))
        bolt, spout, conf = _component_class(raw, where)
        if "window" in raw:
            block = window_conf(raw["window"], f"{where} ({cid})")
            both = sorted(k for k in block if k in conf)
            if both:
                msg = f"{where} ({cid}): 'window' and conf key(s) {both} say the same; keep one"
                raise ConfigError(msg)
            conf.update(block)
        comps[cid] = Component(
            id=cid,
            bolt=bolt,
            parallelism=_int(raw.get("parallelism", 1), f"{where}.parallelism"),
            tasks=_int(raw.get("tasks", 0), f"{where}.tasks"),
            outputs=outputs,
            inputs=tuple(inputs),
            source=source,
            conf=conf,
            grouping=str(raw.get("grouping", "shuffle")),
            grouping_fields=_strs(raw.get("grouping_fields", ()), f"{where}.grouping_fields"),
            spout=spout,
        )
    _declare_late_streams(comps)
    return Topology(
        name=str(data.get("name", "")),
        components=comps,
        workers=_strs(data.get("workers", ()), f"{origin}: workers"),
        conf=dict(data.get("conf") or {}),
    )


def _component_class(raw: Mapping[str, Any], where: str) -> tuple[str, bool, dict[str, Any]]:
    """Return (class path, is a spout, conf) from a component's ``bolt`` / ``spout`` / ``shell`` keys."""
    conf = dict(raw.get("conf") or {})
    spout = raw.get("spout", False)
    shell = raw.get("shell")
    if shell is not None:
        command = [shell] if isinstance(shell, str) else shell
        if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
            msg = f"{where}.shell must be the child's command, a list of strings, got {shell!r}"
            raise ConfigError(msg)
        if "bolt" in raw or isinstance(spout, str):
            msg = f"{where}: 'shell' runs a multilang child; it excludes 'bolt' and a spout class"
            raise ConfigError(msg)
        conf[MULTILANG_COMMAND] = list(command)
        return (SHELL_SPOUT if spout else SHELL_BOLT), bool(spout), conf
    if isinstance(spout, str):
        if "bolt" in raw:
            msg = f"{where}: 'spout' names the spout class; it excludes 'bolt'"
            raise ConfigError(msg)
        return spout, True, conf
    if spout is not False and spout is not None:
        msg = f"{where}.spout must name a Spout class (pkg.mod:Class), or be true with 'shell', got {spout!r}"
        raise ConfigError(msg)
    return str(raw.get("bolt", PASS_THROUGH_BOLT)), False, conf


def topology_to_dict(topo: Topology) -> dict[str, Any]:
    """Return the YAML mapping of ``topo`` in our own form (what ``topology_from_dict`` reads back)."""
    components = []
    for comp in sorted(topo.components.values(), key=lambda c: c.id):
        raw: dict[str, Any] = {"id": comp.id}
        if comp.source:
            raw["source"] = True
            if comp.bolt != PASS_THROUGH_BOLT:
                raw["bolt"] = comp.bolt
            if comp.grouping != "shuffle" or comp.grouping_fields:
                raw["grouping"] = comp.grouping
                raw["grouping_fields"] = list(comp.grouping_fields)
        elif comp.spout:
            raw["spout"] = comp.bolt
        else:
            raw["bolt"] = comp.bolt
        raw["parallelism"] = comp.parallelism
        if comp.tasks:
            raw["tasks"] = comp.tasks
        outputs = {s: list(f) for s, f in comp.outputs.items()}
        if list(outputs) == [DEFAULT_STREAM]:
            raw["fields"] = outputs[DEFAULT_STREAM]
        elif outputs:
            raw["outputs"] = outputs
        if comp.inputs:
            inputs = []
            for inp in comp.inputs:
                entry: dict[str, Any] = {"from": inp.component, "grouping": inp.grouping}
                if inp.stream != DEFAULT_STREAM:
                    entry["stream"] = inp.stream
                if inp.fields:
                    entry["fields"] = list(inp.fields)
                if inp.custom:
                    entry["class"] = inp.custom
                    entry["args"] = list(inp.custom_args)
                inputs.append(entry)
            raw["inputs"] = inputs
        if comp.conf:
            raw["conf"] = dict(comp.conf)
        components.append(raw)
    out: dict[str, Any] = {"name": topo.name}
    if topo.workers:
        out["workers"] = list(topo.workers)
    if topo.conf:
        out["conf"] = dict(topo.conf)
    out["components"] = components
    return out


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
        window: Mapping[str, Any] | None = None,
    ) -> TopologyBuilder:
        """Add a bolt subscribed to ``inputs``; ``fields`` declares its default stream.

        ``window`` is the YAML ``window:`` block (``{"length": "60s", "sliding": "10s", ...}``).
        """
        outs = {s: tuple(f) for s, f in (outputs or {}).items()}
        if fields:
            outs[DEFAULT_STREAM] = tuple(fields)
        merged = dict(conf or {})
        if window is not None:
            merged.update(window_conf(window, f"topology {self._name!r}, component {component_id!r}"))
        self._components[component_id] = Component(
            component_id, bolt, parallelism, tasks, outs, tuple(inputs), False, merged
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
        components = dict(self._components)
        _declare_late_streams(components)
        return Topology(self._name, components, self._workers, dict(self._conf))
