"""A multilang task's settings and the handshake its child gets (Storm 0.10's ``conf`` and ``context``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from spark_storm.codec.tuples import CLIENT_COMPONENT
from spark_storm.config import Config
from spark_storm.errors import ConfigError
from spark_storm.multilang.protocol import build_context, log_level
from spark_storm.multilang.serializers import MultilangSerializer, make_multilang_serializer
from spark_storm.topology.model import DEFAULT_STREAM, MULTILANG_COMMAND, MULTILANG_DIR
from spark_storm.worker.bolt import TopologyContext

__all__ = ["MultilangSettings", "handshake_conf", "handshake_context", "log_from_child"]

child_logger = logging.getLogger("spark_storm.multilang.child")

_SECRET_WORDS: Final = ("secret", "password")
_GROUPING_TYPES: Final = {
    "shuffle": "SHUFFLE",
    "fields": "FIELDS",
    "all": "ALL",
    "global": "GLOBAL",
    "direct": "DIRECT",
    "local_or_shuffle": "LOCAL_OR_SHUFFLE",
    "none": "NONE",
    "load_aware": "SHUFFLE",
    "custom": "CUSTOM",
}


class MultilangSettings:
    """The multilang keys of a component's configuration, checked once."""

    def __init__(self, conf: Mapping[str, Any], where: str) -> None:
        c = conf if isinstance(conf, Config) else Config.of(conf)  # the defaults are defaults.yaml's
        command = c.get(MULTILANG_COMMAND)
        if isinstance(command, str):
            command = command.split()
        if not isinstance(command, list) or not command:
            msg = f"{where}: {MULTILANG_COMMAND!r} must give the child's command as a list, got {command!r}"
            raise ConfigError(msg)
        self.command = [str(part) for part in command]
        cwd = c.get(MULTILANG_DIR)
        self.cwd = str(cwd) if cwd else None
        env = c.get_mapping("topology.multilang.env")
        self.env = {str(k): str(v) for k, v in env.items()}
        self.serializer: MultilangSerializer = make_multilang_serializer(c.get_str("topology.multilang.serializer"))
        key = "topology.subprocess.timeout.secs"
        if c.get(key) is None:
            key = "supervisor.worker.timeout.secs"  # Storm's fallback
        self.timeout_s = c.get_float(key, minimum=0)
        if self.timeout_s <= 0:
            msg = f"config key {key!r} must be > 0 seconds (how long a silent child lives), got {c.get(key)!r}"
            raise ConfigError(msg)
        self.heartbeat_s = c.get_float("topology.multilang.heartbeat.interval.ms", minimum=0) / 1000
        self.backoff_min_s = c.get_float("topology.multilang.restart.backoff.min.ms", minimum=0) / 1000
        self.backoff_max_s = c.get_float("topology.multilang.restart.backoff.max.ms", minimum=0) / 1000
        self.max_pending = c.get_int("topology.shellbolt.max.pending", minimum=0) or 1
        self.max_message_bytes = c.get_int("topology.multilang.max.message.bytes", minimum=0)
        self.shutdown_s = c.get_float("topology.multilang.shutdown.timeout.ms", minimum=0) / 1000


def handshake_conf(conf: Mapping[str, Any], topology_name: str) -> dict[str, Any]:
    """Return the configuration a child gets: JSON-able values, secrets left out, ``topology.name`` set."""
    out: dict[str, Any] = {}
    for key, value in conf.items():
        if any(w in key for w in _SECRET_WORDS) or key == "topology.flux.construct":
            continue
        if isinstance(value, (str, int, float, bool, type(None), list, dict)):
            out[key] = value
    out["topology.name"] = topology_name
    return out


def handshake_context(context: TopologyContext) -> dict[str, Any]:
    """Storm 0.10's handshake context of a task, from the plan."""
    plan = context.plan
    if plan is None:
        msg = f"component {context.component_id!r}: a multilang child needs the topology's plan in its context"
        raise ConfigError(msg)
    topo = plan.topology
    me = topo.components[context.component_id]
    targets: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in me.outputs}
    for stream in me.outputs:
        for consumer, inp in topo.consumers(me.id, stream):
            targets[stream][consumer.id] = _grouping(inp.grouping, inp.fields)
    sources: dict[str, dict[str, dict[str, Any]]] = {}
    fields: dict[str, dict[str, list[str]]] = {}
    for inp in me.inputs:
        sources.setdefault(inp.component, {})[inp.stream] = _grouping(inp.grouping, inp.fields)
        fields.setdefault(inp.component, {})[inp.stream] = list(topo.components[inp.component].fields_of(inp.stream))
    if me.source:  # tuples from Spark come from "__client"
        sources[CLIENT_COMPONENT] = {DEFAULT_STREAM: _grouping(me.grouping, me.grouping_fields)}
        fields[CLIENT_COMPONENT] = {DEFAULT_STREAM: list(me.fields_of(DEFAULT_STREAM))}
    return build_context(
        task_id=context.task_id,
        component_id=context.component_id,
        task_component=plan.task_component,
        outputs=me.outputs,
        targets=targets,
        sources=sources,
        source_fields=fields,
    )


def _grouping(kind: str, fields: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": _GROUPING_TYPES.get(kind, kind.upper())}
    if kind == "fields":
        out["fields"] = list(fields)
    return out


def log_from_child(name: str, message: Mapping[str, Any]) -> None:
    """Log a child's ``log`` command under ``spark_storm.multilang.child`` at its level."""
    child_logger.log(log_level(message), "%s: %s", name, message.get("msg", ""))
