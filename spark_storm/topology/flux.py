"""Storm Flux files (``docs/flux.md``) read into a :class:`~spark_storm.topology.model.Topology`.

What is read, and what it becomes:

* ``name``, ``config`` (storm.yaml keys: the topology's conf; Storm JVM keys spark-storm
  has no use for are dropped with a note), ``spouts``, ``bolts``, ``streams``;
* ``includes`` (files, or ``resource: true`` paths looked up in the including file's
  directory and its parents, as a classpath would), with Flux's ``override`` rules;
* ``${name}`` from the properties file given as ``--filter`` (``${name[i]}`` for an element
  of a list property) and ``${ENV-NAME}`` from the environment, before the YAML is parsed,
  line by line as Flux does; anything left unresolved is an error naming the line;
* components: ``FluxShellBolt`` / ``FluxShellSpout`` become multilang children
  (``constructorArgs``: the command, the output fields; ``configMethods``
  ``addComponentConfig``, ``setDefaultStream``, ``setNamedStream``, ``setEnv``);
  ``className: python:pkg.mod:Class`` names a Python class (a spark-storm Bolt, BatchBolt or
  Spout, or a pystorm/streamparse Bolt run in-process), with ``constructorArgs``,
  ``properties`` and ``configMethods`` of plain values;
* groupings ``SHUFFLE``, ``FIELDS`` (``args``), ``ALL``, ``GLOBAL``, ``NONE``,
  ``LOCAL_OR_SHUFFLE``, ``DIRECT`` and ``CUSTOM`` with a ``customClass`` of
  ``python:pkg.mod:Class``; ``streamId``; ``parallelism`` and ``numTasks``.

Two spark-storm keys in ``config`` (Storm ignores them, so the file still runs on Storm):

* ``topology.spark.sources`` — the spouts Spark feeds instead of running them (the
  KafkaSpout a Spark query replaces): a list of ids, or a mapping of id to the fields
  Spark sends;
* ``topology.flux.classes`` — a mapping of Java class names to ``python:pkg.mod:Class``.

A Java class spark-storm cannot run is an error naming the component, the class and
these ways to map it.  Every error names the file and the line or key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from spark_storm.errors import ConfigError
from spark_storm.plugins import did_you_mean, load_object
from spark_storm.topology.model import (
    DEFAULT_STREAM,
    MULTILANG_COMMAND,
    PASS_THROUGH_BOLT,
    SHELL_BOLT,
    SHELL_SPOUT,
    Component,
    Input,
    Topology,
)

__all__ = [
    "BUILTIN_CLASSES",
    "CONSTRUCT_KEY",
    "FLUX_CLASSES",
    "FLUX_SHELL_BOLT",
    "FLUX_SHELL_SPOUT",
    "SPARK_SOURCES",
    "is_flux_file",
    "load_flux",
    "read_properties",
    "substitute",
    "topology_from_flux",
]

FLUX_SHELL_BOLT: Final = "org.apache.storm.flux.wrappers.bolts.FluxShellBolt"
FLUX_SHELL_SPOUT: Final = "org.apache.storm.flux.wrappers.spouts.FluxShellSpout"
#: Config keys of a Flux file that spark-storm reads (Storm ignores unknown keys).
SPARK_SOURCES: Final = "topology.spark.sources"
FLUX_CLASSES: Final = "topology.flux.classes"
#: Component conf key holding a Python class's Flux constructorArgs / properties / configMethods.
CONSTRUCT_KEY: Final = "topology.flux.construct"
MULTILANG_ENV: Final = "topology.multilang.env"

#: Storm's own test and wrapper classes that Flux examples use, done in Python: (path, kind, fields).
BUILTIN_CLASSES: Final[dict[str, tuple[str, str, tuple[str, ...]]]] = {
    "org.apache.storm.testing.TestWordSpout": ("spark_storm.examples.storm_testing:TestWordSpout", "spout", ("word",)),
    "org.apache.storm.testing.TestWordCounter": (
        "spark_storm.examples.storm_testing:TestWordCounter",
        "bolt",
        ("word", "count"),
    ),
    "org.apache.storm.flux.wrappers.bolts.LogInfoBolt": ("spark_storm.examples.storm_testing:LogInfoBolt", "bolt", ()),
}

_GROUPINGS: Final = {
    "SHUFFLE": "shuffle",
    "FIELDS": "fields",
    "ALL": "all",
    "GLOBAL": "global",
    "NONE": "none",
    "LOCAL_OR_SHUFFLE": "local_or_shuffle",
    "DIRECT": "direct",
    "CUSTOM": "custom",
}
_TOP_KEYS: Final = {"name", "config", "components", "spouts", "bolts", "streams", "includes", "workerHooks"}
_DEF_KEYS: Final = {
    "id",
    "className",
    "constructorArgs",
    "parallelism",
    "numTasks",
    "configMethods",
    "properties",
    "factory",
    "factoryArgs",
    "outputs",
    "onHeapMemoryLoad",
    "offHeapMemoryLoad",
    "cpuLoad",
}
_VAR: Final = re.compile(r"\$\{([^}]*)\}")
_LIST_VAR: Final = re.compile(r"^(?P<name>.+)\[(?P<index>\d+)\]$")


# ------------------------------------------------------------------ YAML with line numbers
class _LineDict(dict[str, Any]):
    """A YAML mapping that remembers its line (errors name it)."""

    line = 0


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _LineDict:
    out = _LineDict({str(k): v for k, v in loader.construct_mapping(node, deep=True).items()})
    out.line = node.start_mark.line + 1
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _plain(value: Any) -> Any:
    """Deep copy without line bookkeeping (plain dicts and lists, for conf and YAML dumps)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _at(value: Any) -> str:
    line = getattr(value, "line", 0)
    return f" (line {line})" if line else ""


# ------------------------------------------------------------------ properties and substitution
def read_properties(path: str | Path) -> dict[str, str]:
    """Read a Java ``.properties`` file (``key=value``, ``key: value`` or ``key value``; ``#``/``!`` comments).

    Raises
    ------
    ConfigError
        The file cannot be read.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"cannot read the --filter properties file {str(path)!r}: {exc.strerror}"
        raise ConfigError(msg) from exc
    props: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip() if not logical else raw.strip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and (len(line) - len(line.rstrip("\\"))) % 2 == 1:
            logical += line[:-1]
            continue
        logical += line
        match = re.match(r"((?:\\.|[^=:\s\\])+)\s*[=:\s]?\s*(.*)$", logical)
        if match:
            key = re.sub(r"\\(.)", r"\1", match.group(1))
            value = match.group(2)
            props[key] = value.encode("utf-8").decode("unicode_escape") if "\\" in value else value
        logical = ""
    return props


def _list_element(value: str, index: int, name: str, line_no: int, origin: str) -> str:
    """Flux's ``${name[i]}``: element ``i`` of a property holding ``["a", "b"]``."""
    items = [item.strip().strip("\"'") for item in value.strip().lstrip("[").rstrip("]").split(",")]
    if index >= len(items):
        msg = f"{origin} line {line_no}: ${{{name}[{index}]}}: property {name!r} has only {len(items)} elements"
        raise ConfigError(msg)
    return items[index]


def substitute(text: str, properties: Mapping[str, str] | None, origin: str) -> str:
    """Replace ``${name}``, ``${name[i]}`` and ``${ENV-NAME}`` line by line, as Flux's ``--filter`` does.

    Comment lines are left alone.  Unlike Flux, which warns and leaves the text, a
    ``${...}`` with no value is an error.

    Raises
    ------
    ConfigError
        Names the line, the variable and where a value would come from.
    """
    props = properties or {}
    out = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if "${" not in line or line.lstrip().startswith("#"):
            out.append(line)
            continue

        def replace(match: re.Match[str], line_no: int = line_no) -> str:
            var = match.group(1)
            if var.startswith("ENV-"):
                name = var[4:]
                if name not in os.environ:
                    msg = f"{origin} line {line_no}: ${{{var}}}: environment variable {name!r} is not set"
                    raise ConfigError(msg)
                return os.environ[name]
            if var in props:
                return props[var]
            listed = _LIST_VAR.match(var)
            if listed and listed.group("name") in props:
                name = listed.group("name")
                return _list_element(props[name], int(listed.group("index")), name, line_no, origin)
            if properties is None:
                where = "no properties file was given (--filter FILE, or the 'filter' option on Spark)"
            else:
                hint = did_you_mean(var, props, lead="; ")
                where = f"the --filter file does not define it{hint}"
            msg = f"{origin} line {line_no}: ${{{var}}} is not resolved: {where}"
            raise ConfigError(msg)

        out.append(_VAR.sub(replace, line))
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _parse(text: str, origin: str) -> Any:
    try:
        return yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError as exc:
        msg = f"Flux file {origin!r} is not valid YAML: {exc}"
        raise ConfigError(msg) from exc


def is_flux_file(path: str | Path) -> bool:
    """Whether the YAML file at ``path`` is a Flux file (False when unreadable: the normal loader says why)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False
    return is_flux(data)


# ------------------------------------------------------------------ includes
def _resolve_include(include: Mapping[str, Any], base: Path, where: str) -> Path:
    file = include.get("file")
    if not isinstance(file, str) or not file:
        msg = f"{where}{_at(include)}: an include needs 'file'"
        raise ConfigError(msg)
    if include.get("resource", False):
        rel = file.lstrip("/")
        for root in (base, *base.parents):
            if (root / rel).is_file():
                return root / rel
        msg = (
            f"{where}{_at(include)}: resource {file!r} is a classpath resource (inside a jar); spark-storm reads "
            f"files: it looked in {str(base)!r} and its parents. Put the file there, or give its path with "
            "'resource: false'"
        )
        raise ConfigError(msg)
    path = Path(file)
    if not path.is_absolute():
        path = base / file if (base / file).is_file() else Path.cwd() / file
    if not path.is_file():
        msg = f"{where}{_at(include)}: included file {file!r} not found (looked in {str(base)!r} and the current dir)"
        raise ConfigError(msg)
    return path


def _merge_list(mine: list[Any], theirs: list[Any], override: bool) -> list[Any]:
    """Merge spouts/bolts/components by id (Flux's addAll*: ``override`` replaces, otherwise the first wins)."""
    out = list(mine)
    index = {d.get("id"): i for i, d in enumerate(out) if isinstance(d, Mapping)}
    for item in theirs:
        key = item.get("id") if isinstance(item, Mapping) else None
        if key in index:
            if override:
                out[index[key]] = item
        else:
            index[key] = len(out)
            out.append(item)
    return out


def _apply_includes(data: dict[str, Any], base: Path, properties: Mapping[str, str] | None, origin: str) -> None:
    includes = data.pop("includes", None) or []
    if not isinstance(includes, list):
        msg = f"{origin}: 'includes' must be a list of {{file, resource, override}}"
        raise ConfigError(msg)
    for i, include in enumerate(includes):
        where = f"{origin}: includes[{i}]"
        if not isinstance(include, Mapping):
            msg = f"{where}: an include is a mapping {{file, resource, override}}"
            raise ConfigError(msg)
        path = _resolve_include(include, base, where)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            msg = f"{where}: cannot read {str(path)!r}: {exc.strerror}"
            raise ConfigError(msg) from exc
        included = _parse(substitute(text, properties, str(path)), str(path))
        if not isinstance(included, Mapping):
            msg = f"{where}: {str(path)!r} is not a Flux mapping"
            raise ConfigError(msg)
        override = bool(include.get("override", False))
        if included.get("name") is not None and (override or not data.get("name")):
            data["name"] = included["name"]
        if included.get("config"):
            config = dict(data.get("config") or {})
            for key, value in included["config"].items():
                if override or key not in config:
                    config[key] = value
            data["config"] = config
        for key in ("components", "spouts", "bolts"):
            if included.get(key):
                data[key] = _merge_list(list(data.get(key) or []), list(included[key]), override)
        if included.get("streams"):
            data["streams"] = [*(data.get("streams") or []), *included["streams"]]


def is_flux(data: Any) -> bool:
    """Whether a YAML mapping is a Storm Flux file (it has ``spouts``, ``bolts``, ``streams``, ``includes``...)."""
    keys = ("spouts", "bolts", "streams", "includes", "topologySource")
    return isinstance(data, Mapping) and any(k in data for k in keys)


def load_flux(path: str | Path, properties: str | Path | None = None) -> Topology:
    """Read a Flux file, with its includes and ``${...}`` substitution.

    Raises
    ------
    ConfigError
        Unreadable files, bad YAML, an unresolved ``${...}``, or a topology that cannot
        be built (the message names the file and the line or key).
    """
    origin = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"cannot read topology file {origin!r}: {exc.strerror}"
        raise ConfigError(msg) from exc
    props = read_properties(properties) if properties is not None else None
    data = _parse(substitute(text, props, origin), origin)
    if not isinstance(data, dict):
        msg = f"Flux file {origin!r} must be a mapping with name, spouts, bolts and streams"
        raise ConfigError(msg)
    _apply_includes(data, Path(path).resolve().parent, props, origin)
    return topology_from_flux(data, origin)


# ------------------------------------------------------------------ conversion
def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, (str, int, float)) for v in value):
        msg = f"{where} must be a list of strings, got {value!r}"
        raise ConfigError(msg)
    return tuple(str(v) for v in value)


def _int(value: Any, where: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{where} must be an integer >= 1, got {value!r}"
        raise ConfigError(msg)
    return value


def _no_refs(value: Any, where: str) -> Any:
    if isinstance(value, Mapping):
        if "ref" in value or "reflist" in value:
            msg = (
                f"{where}: references to Flux 'components' ({dict(value)!r}) build Java objects; a Python class "
                "takes plain values: give the value itself"
            )
            raise ConfigError(msg)
        return {str(k): _no_refs(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_refs(v, where) for v in value]
    return value


def _python_path(class_name: str) -> str | None:
    if class_name.startswith("python:"):
        return class_name[len("python:") :]  # pkg.mod:Class (or pkg.mod.Class)
    return None


def _python_outputs(path: str, raw: Mapping[str, Any], where: str) -> dict[str, tuple[str, ...]]:
    """Output fields of a Python class: the def's ``outputs`` key, else the class's ``outputs`` attribute."""
    declared = raw.get("outputs")
    if declared is None:
        try:
            cls = load_object(path, f"{where}: class")
        except ConfigError as exc:
            msg = (
                f"{exc}; its output fields are read from it: make it importable here, or declare them in the "
                "Flux def: outputs: [field, ...]"
            )
            raise ConfigError(msg) from exc
        declared = getattr(cls, "outputs", None)
    if declared is None or (isinstance(declared, (list, tuple, Mapping)) and not declared):
        return {}
    if isinstance(declared, Mapping):
        return {str(s): _strings(f, f"{where}.outputs.{s}") for s, f in declared.items()}
    if isinstance(declared, (list, tuple)) and declared and not all(isinstance(d, str) for d in declared):
        # streamparse: a list of Stream(fields=..., name=...) objects
        out: dict[str, tuple[str, ...]] = {}
        for stream in declared:
            name = getattr(stream, "name", None) or DEFAULT_STREAM
            out[str(name)] = _strings(getattr(stream, "fields", ()), f"{where}.outputs")
        return out
    return {DEFAULT_STREAM: _strings(declared, f"{where}.outputs")}


class _Converter:
    def __init__(self, data: Mapping[str, Any], origin: str) -> None:
        self.data = data
        self.origin = origin
        self.notes: list[str] = []
        config = data.get("config") or {}
        if not isinstance(config, Mapping):
            msg = f"{origin}: 'config'{_at(config)} must be a mapping of storm.yaml keys"
            raise ConfigError(msg)
        self.config = self._conf(config)
        self.sources = self._spark_sources(self.config.pop(SPARK_SOURCES, None))
        mapped = self.config.pop(FLUX_CLASSES, None) or {}
        if not isinstance(mapped, Mapping) or not all(isinstance(v, str) for v in mapped.values()):
            msg = f"{origin}: config {FLUX_CLASSES!r} maps Java class names to 'python:pkg.mod:Class', got {mapped!r}"
            raise ConfigError(msg)
        self.class_map = dict(mapped)
        self.ids: dict[str, str] = {}  # component id -> "spout" | "bolt"

    def _conf(self, config: Mapping[str, Any]) -> dict[str, Any]:
        from spark_storm.config import Config

        out = {}
        for key, value in config.items():
            try:
                Config.of({key: value})
            except ConfigError:
                self.notes.append(f"config {key!r}: a Storm setting spark-storm does not use (dropped)")
                continue
            out[str(key)] = _plain(value)
        return out

    def _spark_sources(self, value: Any) -> dict[str, tuple[str, ...] | None]:
        if value is None:
            return {}
        if isinstance(value, str):
            return {value: None}
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return dict.fromkeys(value)
        if isinstance(value, Mapping):
            return {
                str(k): (_strings(v, f"{self.origin}: config {SPARK_SOURCES}.{k}") if v is not None else None)
                for k, v in value.items()
            }
        msg = (
            f"{self.origin}: config {SPARK_SOURCES!r} lists the spouts Spark feeds: a list of ids, or a mapping of "
            f"id to the fields Spark sends; got {value!r}"
        )
        raise ConfigError(msg)

    # -------------------------------------------------------------- components
    def defs(self, section: str) -> list[Mapping[str, Any]]:
        raw = self.data.get(section) or []
        if not isinstance(raw, list):
            msg = f"{self.origin}: '{section}'{_at(raw)} must be a list of definitions"
            raise ConfigError(msg)
        out = []
        for i, d in enumerate(raw):
            where = f"{self.origin}: {section}[{i}]{_at(d)}"
            if not isinstance(d, Mapping) or not isinstance(d.get("id"), (str, int)):
                msg = f"{where}: a definition is a mapping with an 'id' and a 'className'"
                raise ConfigError(msg)
            cid = str(d["id"])
            if cid in self.ids:
                msg = f"{where}: id {cid!r} is used twice (a {self.ids[cid]} has it already)"
                raise ConfigError(msg)
            self.ids[cid] = section[:-1]
            for key in d:
                if key not in _DEF_KEYS:
                    hint = did_you_mean(str(key), _DEF_KEYS)
                    msg = f"{where} ({cid}): unknown key {key!r}.{hint}"
                    raise ConfigError(msg)
            out.append(d)
        return out

    def component(self, raw: Mapping[str, Any], section: str, index: int) -> dict[str, Any]:
        """Return Component keyword arguments for one spout or bolt definition."""
        cid = str(raw["id"])
        spout = section == "spouts"
        where = f"{self.origin}: {section}[{index}] ({cid}){_at(raw)}"
        class_name = raw.get("className")
        if not isinstance(class_name, str) or not class_name:
            msg = f"{where}: 'className' is missing"
            raise ConfigError(msg)
        kw: dict[str, Any] = {
            "id": cid,
            "parallelism": _int(raw.get("parallelism"), f"{where}: parallelism", 1),
            "tasks": _int(raw.get("numTasks"), f"{where}: numTasks", 0) if raw.get("numTasks") is not None else 0,
        }
        if kw["tasks"] and kw["tasks"] < kw["parallelism"]:
            self.notes.append(f"{cid}: numTasks {kw['tasks']} < parallelism {kw['parallelism']}: executors capped")
            kw["parallelism"] = kw["tasks"]
        if spout and cid in self.sources:
            return self._spark_source(kw, raw, class_name, where)
        if raw.get("factory") is not None:
            msg = f"{where}: 'factory' calls a static Java method; a Python class is built by its constructor"
            raise ConfigError(msg)
        if class_name in (FLUX_SHELL_BOLT, FLUX_SHELL_SPOUT):
            return self._shell(kw, raw, class_name, spout, where)
        if class_name in self.class_map:
            mapped = self.class_map[class_name]
            self.notes.append(f"{section[:-1]} {cid!r}: {class_name} mapped to {mapped} ({FLUX_CLASSES})")
            class_name = mapped
        python = _python_path(class_name)
        if python is None and class_name in BUILTIN_CLASSES:
            path, kind, fields = BUILTIN_CLASSES[class_name]
            if kind != section[:-1]:
                msg = f"{where}: {class_name} is a {kind}, listed under '{section}'"
                raise ConfigError(msg)
            kw.update(bolt=path, spout=spout, outputs={DEFAULT_STREAM: fields} if fields else {})
            self.notes.append(f"{section[:-1]} {cid!r}: {class_name} -> its Python equivalent {path}")
            return kw
        if python is None:
            raise self._java_error(class_name, spout, cid, where)
        construct = {
            "args": _no_refs(raw.get("constructorArgs") or [], f"{where}: constructorArgs"),
            "properties": {
                str(p.get("name")): _no_refs(p.get("value"), f"{where}: properties")
                for p in (raw.get("properties") or [])
            },
            "calls": [
                [str(m.get("name")), _no_refs(m.get("args") or [], f"{where}: configMethods")]
                for m in (raw.get("configMethods") or [])
            ],
        }
        kw.update(bolt=python, spout=spout, outputs=_python_outputs(python, raw, where))
        if construct["args"] or construct["properties"] or construct["calls"]:
            kw["conf"] = {CONSTRUCT_KEY: construct}
        shown = ", ".join(f"{s}: {list(f)}" for s, f in kw["outputs"].items()) or "no outputs"
        self.notes.append(f"{section[:-1]} {cid!r}: Python class {python} ({shown})")
        return kw

    def _spark_source(self, kw: dict[str, Any], raw: Mapping[str, Any], class_name: str, where: str) -> dict[str, Any]:
        fields: tuple[str, ...] | None = self.sources[kw["id"]]
        if fields is None and class_name == FLUX_SHELL_SPOUT:
            args = raw.get("constructorArgs") or []
            fields = _strings(args[1], f"{where}: constructorArgs[1]") if len(args) > 1 else ()
        kw.update(source=True, bolt=PASS_THROUGH_BOLT, outputs={DEFAULT_STREAM: tuple(fields or ())})
        shown = list(fields) if fields else "any (declare them: {id: [field, ...]})"
        self.notes.append(
            f"spout {kw['id']!r}: {class_name} -> a source fed by Spark ({SPARK_SOURCES}), fields {shown}"
        )
        return kw

    def _shell(
        self, kw: dict[str, Any], raw: Mapping[str, Any], class_name: str, spout: bool, where: str
    ) -> dict[str, Any]:
        kind = "FluxShellSpout" if class_name == FLUX_SHELL_SPOUT else "FluxShellBolt"
        if spout != (class_name == FLUX_SHELL_SPOUT):
            msg = f"{where}: {kind} is listed under '{'spouts' if spout else 'bolts'}'"
            raise ConfigError(msg)
        args = raw.get("constructorArgs") or []
        if not isinstance(args, list) or not 1 <= len(args) <= 2:
            msg = f"{where}: {kind} takes constructorArgs [command line (a list), output fields (a list)]"
            raise ConfigError(msg)
        command = _strings(args[0], f"{where}: constructorArgs[0] (the command line)")
        outputs: dict[str, tuple[str, ...]] = {}
        if len(args) == 2:
            outputs[DEFAULT_STREAM] = _strings(args[1], f"{where}: constructorArgs[1] (the output fields)")
        conf: dict[str, Any] = {MULTILANG_COMMAND: list(command)}
        for j, method in enumerate(raw.get("configMethods") or []):
            mwhere = f"{where}: configMethods[{j}]{_at(method)}"
            name = method.get("name") if isinstance(method, Mapping) else None
            margs = list(method.get("args") or []) if isinstance(method, Mapping) else []
            if name == "addComponentConfig" and len(margs) == 2:
                conf[str(margs[0])] = _plain(margs[1])
            elif name == "setDefaultStream" and len(margs) == 1:
                outputs[DEFAULT_STREAM] = _strings(margs[0], mwhere)
            elif name == "setNamedStream" and len(margs) == 2:
                outputs[str(margs[0])] = _strings(margs[1], mwhere)
            elif name == "setEnv" and len(margs) == 1 and isinstance(margs[0], Mapping):
                conf[MULTILANG_ENV] = {str(k): str(v) for k, v in margs[0].items()}
            elif name == "changeChildCWD" and len(margs) == 1:
                self.notes.append(f"{kw['id']!r}: changeChildCWD ignored: the child runs in topology.multilang.dir")
            else:
                msg = (
                    f"{mwhere}: {kind} has no config method {name!r} with {len(margs)} arguments "
                    "(addComponentConfig(key, value), setDefaultStream(fields), setNamedStream(name, fields), "
                    "setEnv(map), changeChildCWD(bool))"
                )
                raise ConfigError(msg)
        kw.update(bolt=SHELL_SPOUT if spout else SHELL_BOLT, spout=spout, outputs=outputs, conf=conf)
        fields = ", ".join(f"{s}: {list(f)}" for s, f in outputs.items()) or "no outputs"
        self.notes.append(
            f"{'spout' if spout else 'bolt'} {kw['id']!r}: {kind} -> multilang child `{' '.join(command)}` ({fields})"
        )
        return kw

    def _java_error(self, class_name: str, spout: bool, cid: str, where: str) -> ConfigError:
        if spout:
            fix = (
                f"let Spark feed it instead (config {SPARK_SOURCES}: {{{cid}: [field, ...]}}: the Spark query "
                "replaces this spout, e.g. Spark's Kafka source for a KafkaSpout), run it as a multilang child "
                "(className: org.apache.storm.flux.wrappers.spouts.FluxShellSpout, constructorArgs: [[command...], "
                "[fields...]]), or name a Python Spout (className: python:pkg.mod:Class)"
            )
        else:
            fix = (
                "rewrite it as a Python bolt (className: python:pkg.mod:Class, a spark_storm Bolt or a pystorm/"
                "streamparse Bolt), run it as a multilang child (className: "
                "org.apache.storm.flux.wrappers.bolts.FluxShellBolt, constructorArgs: [[command...], [fields...]])"
            )
        msg = (
            f"{where}: {'spout' if spout else 'bolt'} {cid!r} names the Java class {class_name!r}, which spark-storm "
            f"cannot run (there is no JVM in a worker). Map it: {fix}; or map the class for the whole file with "
            f"config {FLUX_CLASSES}: {{{class_name}: python:pkg.mod:Class}}"
        )
        return ConfigError(msg)

    # -------------------------------------------------------------- streams
    def inputs(self, outputs: Mapping[str, Mapping[str, tuple[str, ...]]]) -> dict[str, list[Input]]:
        raw = self.data.get("streams") or []
        if not isinstance(raw, list):
            msg = f"{self.origin}: 'streams'{_at(raw)} must be a list of {{from, to, grouping}}"
            raise ConfigError(msg)
        out: dict[str, list[Input]] = {}
        for i, stream in enumerate(raw):
            label = f" {stream.get('name')!r}" if isinstance(stream, Mapping) and stream.get("name") else ""
            where = f"{self.origin}: streams[{i}]{label}{_at(stream)}"
            if not isinstance(stream, Mapping):
                msg = f"{where}: a stream is a mapping {{from, to, grouping}}"
                raise ConfigError(msg)
            src, dst = self._end(stream, "from", where), self._end(stream, "to", where)
            if self.ids[dst] == "spout":
                msg = f"{where}: 'to: {dst}' is a spout; spouts have no inputs (send to a bolt)"
                raise ConfigError(msg)
            grouping = stream.get("grouping")
            if not isinstance(grouping, Mapping):
                msg = f"{where}: 'grouping' is missing (e.g. grouping: {{type: SHUFFLE}})"
                raise ConfigError(msg)
            gwhere = f"{where}.grouping{_at(grouping)}"
            gtype = str(grouping.get("type", "")).upper()
            if gtype not in _GROUPINGS:
                hint = did_you_mean(gtype, _GROUPINGS)
                known = ", ".join(_GROUPINGS)
                msg = f"{gwhere}: unknown grouping type {grouping.get('type')!r}.{hint} Use one of {known}"
                raise ConfigError(msg)
            stream_id = str(grouping.get("streamId") or DEFAULT_STREAM)
            declared = outputs.get(src, {})
            if stream_id not in declared and not (stream_id == DEFAULT_STREAM and src in self.sources):
                msg = (
                    f"{where}: {src!r} declares no stream {stream_id!r} (it declares {sorted(declared) or 'none'}); "
                    "declare its output fields (constructorArgs of a FluxShell*, 'outputs' of a Python class)"
                )
                raise ConfigError(msg)
            fields: tuple[str, ...] = ()
            custom, custom_args = "", ()
            if gtype == "FIELDS":
                fields = _strings(grouping.get("args") or [], f"{gwhere}.args")
                have = declared.get(stream_id, ())
                missing = [f for f in fields if f not in have]
                if not fields or missing:
                    fix = ""
                    if src in self.sources:
                        fix = f" (declare them: config {SPARK_SOURCES}: {{{src}: [field, ...]}})"
                    msg = (
                        f"{gwhere}: FIELDS groups on {list(fields) or 'nothing'} but {src!r} stream {stream_id!r} has "
                        f"fields {list(have)}{fix}"
                    )
                    raise ConfigError(msg)
            if gtype == "CUSTOM":
                custom, custom_args = self._custom(grouping.get("customClass"), gwhere)
            out.setdefault(dst, []).append(Input(src, _GROUPINGS[gtype], stream_id, fields, custom, custom_args))
        return out

    def _end(self, stream: Mapping[str, Any], key: str, where: str) -> str:
        value = stream.get(key)
        if value is None:
            msg = f"{where}: '{key}' is missing"
            raise ConfigError(msg)
        cid = str(value)
        if cid not in self.ids:
            hint = did_you_mean(cid, self.ids, lead="; ")
            msg = f"{where}: '{key}: {cid}' names no spout or bolt{hint} (they are {', '.join(sorted(self.ids))})"
            raise ConfigError(msg)
        return cid

    def _custom(self, spec: Any, where: str) -> tuple[str, tuple[Any, ...]]:
        if not isinstance(spec, Mapping) or not isinstance(spec.get("className"), str):
            msg = f"{where}: CUSTOM needs customClass: {{className: python:pkg.mod:Class, constructorArgs: [...]}}"
            raise ConfigError(msg)
        name = str(spec["className"])
        python = _python_path(self.class_map.get(name, name))
        if python is None:
            msg = (
                f"{where}: customClass {name!r} is a Java CustomStreamGrouping, which spark-storm cannot run; write "
                "it in Python (spark_storm.topology.grouping.CustomStreamGrouping) and name it "
                f"className: python:pkg.mod:Class, or map it with config {FLUX_CLASSES}"
            )
            raise ConfigError(msg)
        return python, tuple(_no_refs(spec.get("constructorArgs") or [], f"{where}.customClass.constructorArgs"))


def topology_from_flux(data: Mapping[str, Any], origin: str = "Flux file") -> Topology:
    """Convert a parsed Flux mapping (includes and substitution already applied).

    Raises
    ------
    ConfigError
        What cannot be converted, naming the file and the line or key.
    """
    for key in data:
        if key not in _TOP_KEYS and key != "topologySource":
            hint = did_you_mean(str(key), _TOP_KEYS)
            msg = f"{origin}: unknown top-level key {key!r}.{hint} Flux files have {', '.join(sorted(_TOP_KEYS))}"
            raise ConfigError(msg)
    if "topologySource" in data:
        msg = (
            f"{origin}: 'topologySource' asks a Java class to build the topology; spark-storm needs it "
            "written out as spouts, bolts and streams"
        )
        raise ConfigError(msg)
    name = data.get("name")
    if not isinstance(name, str) or not name:
        msg = f"{origin}: 'name' is missing (every Flux topology has a name)"
        raise ConfigError(msg)
    if data.get("includes"):
        msg = f"{origin}: 'includes' are read from files: load it with load_topology(path)"
        raise ConfigError(msg)
    conv = _Converter(data, origin)
    if data.get("workerHooks"):
        conv.notes.append("workerHooks: Java IWorkerHook classes, not run (a Python bolt's prepare/cleanup can do it)")
    if data.get("components"):
        conv.notes.append(
            "components: Java beans for Java spouts and bolts, not built (Python classes take plain values)"
        )
    kwargs = []
    for section in ("spouts", "bolts"):
        for i, raw in enumerate(conv.defs(section)):
            kwargs.append(conv.component(raw, section, i))
    unknown_sources = [s for s in conv.sources if conv.ids.get(s) != "spout"]
    if unknown_sources:
        msg = f"{origin}: config {SPARK_SOURCES} names {unknown_sources}, which are not spouts of this file"
        raise ConfigError(msg)
    inputs = conv.inputs({kw["id"]: kw.get("outputs", {}) for kw in kwargs})
    components = {}
    for kw in kwargs:
        cid = kw["id"]
        components[cid] = Component(inputs=tuple(inputs.get(cid, ())), **kw)
        if not components[cid].source and not components[cid].spout and not components[cid].inputs:
            msg = f"{origin}: bolt {cid!r} gets no stream (add one with 'to: {cid}' under 'streams')"
            raise ConfigError(msg)
    try:
        return Topology(name, components, (), conv.config, tuple(conv.notes))
    except ConfigError as exc:
        msg = f"{origin}: {exc}"
        raise ConfigError(msg) from exc
