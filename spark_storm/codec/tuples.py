"""Tuples as bolts see them, and where they come from.

A :class:`Tuple` is two references on the hot path: its values and a shared
:class:`TupleSource` (component, task, stream, fields) that every tuple of that origin
points to — Storm's ``TupleImpl`` likewise keeps its values and a pointer to the
topology context rather than copies of the metadata.  Anchors (tuple trees, for
``delivery=processed``) are empty for untracked tuples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

__all__ = [
    "BROADCAST_TASK",
    "CHECKPOINT_STREAM",
    "CLIENT_COMPONENT",
    "NO_ANCHORS",
    "SYSTEM_COMPONENT",
    "TICK_SOURCE",
    "TICK_STREAM",
    "Anchor",
    "Barrier",
    "FromSource",
    "Tuple",
    "TupleSource",
]

#: Wire task id meaning "no task": delivered to every task of every executor in the
#: receiving worker (Storm 0.8's nil task id).  Real task ids start at 1.
BROADCAST_TASK: Final = 0
SYSTEM_COMPONENT: Final = "__system"
TICK_STREAM: Final = "__tick"
#: ``source_component`` of tuples that external clients (Spark) send to source tasks.
CLIENT_COMPONENT: Final = "__client"
#: The stream checkpoint barriers travel on (Storm's checkpoint stream).
CHECKPOINT_STREAM: Final = "$checkpoint"

#: (worker id of the root's acker, root id, edge id): one tuple tree a tuple belongs to.
Anchor = tuple[int, int, int]
#: The anchors of an untracked tuple (shared; never mutated).
NO_ANCHORS: Final[list[Anchor]] = []


class TupleSource:
    """Where tuples come from: component, task and stream, with the stream's fields.

    One instance is shared by every tuple (and columnar batch) of that origin.

    Attributes
    ----------
    component : str
    task : int
        -1 for tuples sent by an external client to a source component.
    stream : str
    fields : tuple[str, ...]
    """

    __slots__ = ("component", "fields", "index", "is_tick", "stream", "task")

    def __init__(self, component: str, task: int, stream: str, fields: Sequence[str]) -> None:
        self.component = component
        self.task = task
        self.stream = stream
        self.fields = tuple(fields)
        self.index = {f: i for i, f in enumerate(self.fields)}
        self.is_tick = stream == TICK_STREAM and component == SYSTEM_COMPONENT

    def __repr__(self) -> str:
        return f"{self.component}:{self.task}/{self.stream}{list(self.fields)}"


#: The origin of tick tuples (Storm's ``__system`` component, ``__tick`` stream).
TICK_SOURCE: Final = TupleSource(SYSTEM_COMPONENT, -1, TICK_STREAM, ("ts",))


class FromSource:
    """What a tuple or a columnar batch says about where it came from (its shared ``source``)."""

    __slots__ = ()
    source: TupleSource

    @property
    def fields(self) -> tuple[str, ...]:
        return self.source.fields

    @property
    def source_component(self) -> str:
        return self.source.component

    @property
    def source_task(self) -> int:
        return self.source.task

    @property
    def stream(self) -> str:
        return self.source.stream

    @property
    def is_tick(self) -> bool:
        return self.source.is_tick


class Tuple(FromSource):
    """An input tuple: values with their field names, where it came from, and its stream.

    Attributes
    ----------
    values : list
    source : TupleSource
    fields : tuple[str, ...]
    source_component : str
    source_task : int
        -1 for tuples sent by an external client to a source component.
    stream : str
    """

    __slots__ = ("anchors", "pending", "source", "values")

    def __init__(self, values: list[Any], source: TupleSource) -> None:
        self.values = values
        self.source = source
        #: Tuple trees this tuple belongs to (empty: untracked).
        self.anchors = NO_ANCHORS
        #: Per (worker id, root): XOR of the edges of children emitted anchored on this tuple.
        self.pending: dict[tuple[int, int], Any] | None = None

    def get(self, field: str) -> Any:
        """Value of ``field`` (KeyError naming the fields when absent)."""
        index = self.source.index.get(field)
        if index is None:
            msg = f"tuple from {self.source.component!r} has no field {field!r}; fields are {list(self.fields)}"
            raise KeyError(msg)
        return self.values[index]

    def __getitem__(self, index: int) -> Any:
        return self.values[index]

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        s = self.source
        shown = dict(zip(s.fields, self.values, strict=False)) if s.fields else self.values
        return f"Tuple({s.component}:{s.task}/{s.stream} {shown!r})"


class Barrier:
    """Checkpoint barrier ``epoch`` from ``source_task`` (-1: injected at a source task), in generation ``generation``.

    Everything a task sent before its barrier belongs to the epoch (docs/design/state.md); a
    barrier travels behind that data in every queue and connection, and weighs nothing.
    """

    __slots__ = ("epoch", "generation", "source_task")

    def __init__(self, epoch: int, generation: int, source_task: int) -> None:
        self.epoch = epoch
        self.generation = generation
        self.source_task = source_task

    def __len__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Barrier) and (self.epoch, self.generation, self.source_task) == (
            other.epoch,
            other.generation,
            other.source_task,
        )

    def __hash__(self) -> int:
        return hash((self.epoch, self.generation, self.source_task))

    def __repr__(self) -> str:
        return f"Barrier(epoch {self.epoch}, generation {self.generation}, from task {self.source_task})"
