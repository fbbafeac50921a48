"""Storm's multilang protocol, pure: messages, serializers (JSON, msgpack) and the child process runner.

The worker's wing :mod:`spark_storm.shell` (``ShellBolt``, ``ShellSpout``)
use these to run bolts and spouts written in any language, streamparse/pystorm
components included, as subprocesses.  Nothing here imports the worker.
"""

from __future__ import annotations

from spark_storm.multilang.process import Outbox, ShellProcess, check_command
from spark_storm.multilang.protocol import HEARTBEAT_STREAM, SYSTEM_TASK, Emit, handshake, parse_emit
from spark_storm.multilang.serializers import (
    JsonMultilangSerializer,
    MsgpackMultilangSerializer,
    MultilangSerializer,
    ProtocolError,
    make_multilang_serializer,
)

__all__ = [
    "HEARTBEAT_STREAM",
    "SYSTEM_TASK",
    "Emit",
    "JsonMultilangSerializer",
    "MsgpackMultilangSerializer",
    "MultilangSerializer",
    "Outbox",
    "ProtocolError",
    "ShellProcess",
    "check_command",
    "handshake",
    "make_multilang_serializer",
    "parse_emit",
]
