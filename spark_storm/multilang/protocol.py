"""Storm's multilang protocol (``docs/Multilang-protocol.md``): the messages, checked.

Both directions, seen from the worker:

* to the child — the handshake ``{"conf", "context", "pidDir"}``; bolt tuples
  ``{"id", "comp", "stream", "task", "tuple"}`` (heartbeats are tuples on the
  ``__heartbeat`` stream from task -1); spout commands ``{"command": "next" | "ack" |
  "fail" | "activate" | "deactivate", "id"}``; task ids answering an emit (a JSON list);
* from the child — ``{"pid"}`` once, then commands: ``emit`` (``tuple``, ``stream``,
  ``anchors`` for bolts, ``id`` for spouts, ``task`` for a direct emit,
  ``need_task_ids``, true unless the child says false), ``ack`` / ``fail`` (``id``),
  ``log`` (``msg``, ``level`` 0-4 as STORM-414), ``error`` (``msg``), ``metrics``
  (``name``, ``params``) and ``sync``.

This module only builds and checks messages; :mod:`spark_storm.multilang.process`
runs the children and the worker's adapters act on what they say.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from spark_storm.multilang.serializers import ProtocolError

__all__ = [
    "BOLT_COMMANDS",
    "DEFAULT_STREAM",
    "HEARTBEAT_STREAM",
    "SPOUT_COMMANDS",
    "SYSTEM_TASK",
    "Emit",
    "build_context",
    "command_of",
    "handshake",
    "heartbeat_tuple",
    "log_level",
    "parse_emit",
    "pid_of",
    "spout_command",
]

DEFAULT_STREAM: Final = "default"
#: Stream and source task of the heartbeat tuples a bolt child must answer with ``sync``.
HEARTBEAT_STREAM: Final = "__heartbeat"
SYSTEM_TASK: Final = -1
BOLT_COMMANDS: Final = frozenset({"emit", "ack", "fail", "log", "error", "metrics", "sync"})
SPOUT_COMMANDS: Final = frozenset({"emit", "log", "error", "metrics", "sync"})

#: STORM-414 log levels (trace, debug, info, warn, error) as Python logging levels.
_LEVELS: Final = (5, logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)


@dataclass(frozen=True, slots=True)
class Emit:
    """One checked ``emit`` command."""

    values: list[Any]
    stream: str
    anchors: tuple[str, ...]
    task: int | None
    need_task_ids: bool
    message_id: Any


def handshake(conf: Mapping[str, Any], context: Mapping[str, Any], pid_dir: str) -> dict[str, Any]:
    """Return the first message to a child: Storm's configuration, its topology context and a pid directory."""
    return {"conf": dict(conf), "context": dict(context), "pidDir": pid_dir}


def pid_of(message: Any) -> int:
    """Return the pid in a child's answer to the handshake.

    Raises
    ------
    ProtocolError
        The answer is not ``{"pid": <int>}``.
    """
    if isinstance(message, dict) and isinstance(message.get("pid"), int) and not isinstance(message["pid"], bool):
        return int(message["pid"])
    msg = f"the child must answer the handshake with {{'pid': <its pid>}}, it sent {message!r:.200}"
    raise ProtocolError(msg)


def heartbeat_tuple(tuple_id: str) -> dict[str, Any]:
    """Return a heartbeat tuple (the child answers with ``sync``)."""
    return {"id": tuple_id, "comp": "", "stream": HEARTBEAT_STREAM, "task": SYSTEM_TASK, "tuple": []}


def spout_command(command: str, message_id: Any = "") -> dict[str, Any]:
    """Return a spout command (``next``, ``ack``, ``fail``, ``activate``, ``deactivate``)."""
    return {"command": command, "id": message_id}


def command_of(message: Any, allowed: frozenset[str]) -> str:
    """Return a child's command name, checked against ``allowed``.

    Raises
    ------
    ProtocolError
        Not a mapping with a known ``command``.
    """
    if type(message) is dict:
        command = message.get("command")
        if command in allowed:
            return command  # type: ignore[no-any-return]
        if command is None:
            msg = f"a message from the child has no 'command': {message!r:.200}"
        else:
            msg = f"unknown command {command!r} from the child (known: {', '.join(sorted(allowed))})"
        raise ProtocolError(msg)
    msg = f"the child sent {type(message).__name__} {message!r:.200}; commands are mappings with a 'command'"
    raise ProtocolError(msg)


def parse_emit(message: dict[str, Any]) -> Emit:
    """Check an ``emit`` command.

    Raises
    ------
    ProtocolError
        ``tuple`` missing or not a list; ``anchors`` not a list of ids; ``task`` not an int.
    """
    values = message.get("tuple")
    if type(values) is not list:
        if isinstance(values, tuple):
            values = list(values)
        else:
            msg = f"emit needs 'tuple', a list of values; got {values!r:.200}"
            raise ProtocolError(msg)
    stream = message.get("stream") or DEFAULT_STREAM
    if not isinstance(stream, str):
        stream = str(stream)
    raw_anchors = message.get("anchors") or ()
    if not isinstance(raw_anchors, (list, tuple)):
        msg = f"emit 'anchors' must be a list of tuple ids, got {raw_anchors!r:.200}"
        raise ProtocolError(msg)
    anchors = tuple(a if isinstance(a, str) else str(a) for a in raw_anchors)
    task = message.get("task")
    if task is not None and (isinstance(task, bool) or not isinstance(task, int)):
        msg = f"emit 'task' (a direct emit) must be a task id, got {task!r:.200}"
        raise ProtocolError(msg)
    return Emit(
        values,
        stream,
        anchors,
        task or None,  # Storm: task 0 means "not direct"
        message.get("need_task_ids", True) is not False,
        message.get("id"),
    )


def log_level(message: Mapping[str, Any]) -> int:
    """Return the Python logging level of a ``log`` command (``info`` when absent or odd)."""
    level = message.get("level", 2)
    if isinstance(level, int) and not isinstance(level, bool) and 0 <= level < len(_LEVELS):
        return _LEVELS[level]
    return logging.INFO


def build_context(
    *,
    task_id: int,
    component_id: str,
    task_component: Mapping[int, str],
    outputs: Mapping[str, Sequence[str]],
    targets: Mapping[str, Mapping[str, Mapping[str, Any]]],
    sources: Mapping[str, Mapping[str, Mapping[str, Any]]],
    source_fields: Mapping[str, Mapping[str, Sequence[str]]],
) -> dict[str, Any]:
    """Return the handshake's ``context`` as Storm 0.10+ sends it.

    Parameters
    ----------
    task_component : mapping
        Every task of the topology and its component (``task->component``).
    outputs : mapping
        This component's streams and their fields (``stream->outputfields``).
    targets : mapping
        ``stream->target->grouping``: per output stream, consumer -> ``{"type", "fields"}``.
    sources : mapping
        ``source->stream->grouping``: per upstream component and stream, this component's grouping.
    source_fields : mapping
        ``source->stream->fields``: the fields of every stream this component reads.
    """
    return {
        "task->component": {str(t): c for t, c in sorted(task_component.items())},
        "taskid": task_id,
        "componentid": component_id,
        "stream->target->grouping": {s: {c: dict(g) for c, g in t.items()} for s, t in targets.items()},
        "streams": sorted(outputs),
        "stream->outputfields": {s: list(f) for s, f in outputs.items()},
        "source->stream->grouping": {c: {s: dict(g) for s, g in v.items()} for c, v in sources.items()},
        "source->stream->fields": {c: {s: list(f) for s, f in v.items()} for c, v in source_fields.items()},
    }
