"""Values that travel between workers: TaskMessage and the control payloads."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple, overload

__all__ = ["MAX_TASK_ID", "BackpressureStatus", "ConnectionStatus", "MessageBatch", "TaskMessage"]

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


_new = tuple.__new__


class MessageBatch(Sequence[TaskMessage]):
    """A batch of messages stored as two columns: task ids and payloads.

    What receive callbacks get.  It is a ``Sequence[TaskMessage]`` (iterate, index,
    slice, compare with a list), and vectorised consumers read the columns directly
    (``zip(batch.tasks, batch.payloads)``), skipping one object per message: the worker's
    receive path groups by task this way.

    Attributes
    ----------
    tasks : list[int]
        Task id of each message.
    payloads : list[bytes]
        Payload of each message, same order.
    """

    __slots__ = ("payloads", "tasks")

    def __init__(self, tasks: list[int], payloads: list[bytes]) -> None:
        self.tasks = tasks
        self.payloads = payloads

    @classmethod
    def of(cls, messages: Iterable[TaskMessage]) -> MessageBatch:
        """Build a batch from TaskMessages (or (task, payload) pairs)."""
        if isinstance(messages, MessageBatch):
            return messages
        pairs = list(messages)
        return cls([m[0] for m in pairs], [m[1] for m in pairs])

    def __len__(self) -> int:
        return len(self.tasks)

    @overload
    def __getitem__(self, index: int) -> TaskMessage: ...
    @overload
    def __getitem__(self, index: slice) -> MessageBatch: ...
    def __getitem__(self, index: int | slice) -> TaskMessage | MessageBatch:
        if isinstance(index, slice):
            return MessageBatch(self.tasks[index], self.payloads[index])
        return _new(TaskMessage, (self.tasks[index], self.payloads[index]))

    def __iter__(self) -> Iterator[TaskMessage]:
        return map(_new, repeat(TaskMessage), zip(self.tasks, self.payloads, strict=True))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MessageBatch):
            return self.tasks == other.tasks and self.payloads == other.payloads
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MessageBatch({list(self)!r})"


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
