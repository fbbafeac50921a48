"""Values that travel between workers: TaskMessage and the control payloads."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["MAX_TASK_ID", "BackpressureStatus", "ConnectionStatus", "TaskMessage"]

#: Largest task id the int16 task field can carry (Storm rejects ids above Short.MAX_VALUE).
MAX_TASK_ID = 0x7FFF


class TaskMessage(NamedTuple):
    """A serialized tuple addressed to one task.

    Immutable, unlike Storm's (whose ``deserialize`` mutates it).

    Attributes
    ----------
    task : int
        Destination task id, 0..32767.
    payload : bytes
        The serialized tuple; opaque to the messaging layer.
    """

    task: int
    payload: bytes


class ConnectionStatus(enum.Enum):
    """Storm's ``ConnectionWithStatus.Status``."""

    CONNECTING = "connecting"
    """Not ready yet: connecting, reconnecting, or in the handshake."""
    READY = "ready"
    """Handshake done; ``send`` writes to the peer."""
    CLOSED = "closed"
    """Closed by ``close()``/``term()`` or given up; no more traffic."""


@dataclass(frozen=True)
class BackpressureStatus:
    """Which tasks of a worker are over (or back under) their queue watermarks.

    Attributes
    ----------
    worker_id : str
        Who reports it (``host:port`` of the worker, or any stable id).
    bp_tasks : frozenset[int]
        Tasks whose receive queue is above the high watermark: senders must hold
        messages for them.
    non_bp_tasks : frozenset[int]
        Tasks that went back under the low watermark: senders may resume.
    """

    worker_id: str
    bp_tasks: frozenset[int] = frozenset()
    non_bp_tasks: frozenset[int] = frozenset()
