"""Storm's messaging contracts and wire format (the bottom layer; imports nothing above it)."""

from __future__ import annotations

from spark_storm.messaging.api import (
    RECV_BLOCK,
    RECV_NOBLOCK,
    CallbackLike,
    IClient,
    IConnection,
    IConnectionCallback,
    IContext,
    IServer,
    as_callback,
)
from spark_storm.messaging.message import (
    MAX_TASK_ID,
    BackpressureStatus,
    ConnectionStatus,
    MessageBatch,
    TaskMessage,
)

__all__ = [
    "MAX_TASK_ID",
    "RECV_BLOCK",
    "RECV_NOBLOCK",
    "BackpressureStatus",
    "CallbackLike",
    "ConnectionStatus",
    "IClient",
    "IConnection",
    "IConnectionCallback",
    "IContext",
    "IServer",
    "MessageBatch",
    "TaskMessage",
    "as_callback",
]
