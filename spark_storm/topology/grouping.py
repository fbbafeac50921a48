"""Stream groupings: which target task(s) get each emitted tuple.

One grouper per (emitting task, subscription).  The worker and the Spark side use the
same functions, so a tuple is routed identically wherever it is emitted.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Callable, Iterable, Mapping, Sequence

from spark_storm.errors import ConfigError
from spark_storm.topology.hashing import fields_hash
from spark_storm.topology.model import Component, Input

__all__ = ["CustomStreamGrouping", "Grouper", "LoadFn", "make_grouper"]

#: Returns the latest known load (0..1) of the given tasks; unknown tasks omitted.
LoadFn = Callable[[Iterable[int]], Mapping[int, float]]


class Grouper(abc.ABC):
    """Chooses target tasks for one tuple."""

    def __init__(self, targets: Sequence[int]) -> None:
        self.targets = list(targets)

    @abc.abstractmethod
    def choose(self, values: Sequence[object]) -> list[int]:
        """Return the target task ids for a tuple with these values."""


class ShuffleGrouper(Grouper):
    """Round-robin from a random start (Storm's shuffle: even spread, no per-tuple randomness)."""

    def __init__(self, targets: Sequence[int], rng: random.Random | None = None) -> None:
        super().__init__(targets)
        self._rng = rng or random.Random()
        self._order = list(self.targets)
        self._rng.shuffle(self._order)
        self._i = 0

    def choose(self, values: Sequence[object]) -> list[int]:
        task = self._order[self._i]
        self._i = (self._i + 1) % len(self._order)
        return [task]


class FieldsGrouper(Grouper):
    """Equal values of the grouping fields always go to the same task (Spark's hash, pmod).

    Grouping keys repeat (words, user ids), so the chosen target of recent string keys
    of a one-field grouping is remembered (bounded): most tuples cost one dict lookup.
    """

    _CACHE_MAX = 65536

    def __init__(self, targets: Sequence[int], indexes: Sequence[int]) -> None:
        super().__init__(targets)
        self._indexes = list(indexes)
        self._single = self._indexes[0] if len(self._indexes) == 1 else None
        self._by_str: dict[str, int] = {}
        self._only = self.targets[0] if len(self.targets) == 1 else None  # one target: nothing to hash for

    def choose(self, values: Sequence[object]) -> list[int]:
        if self._only is not None:
            return [self._only]  # a new list: emit() hands it to the bolt
        single = self._single
        if single is not None:
            key = values[single]
            if type(key) is str:  # exact type: 1, 1.0 and True hash differently in Spark
                hit = self._by_str.get(key)
                if hit is None:
                    if len(self._by_str) >= self._CACHE_MAX:
                        self._by_str.clear()
                    hit = self._by_str[key] = self.targets[fields_hash((key,)) % len(self.targets)]
                return [hit]
        h = fields_hash(values[i] for i in self._indexes)
        return [self.targets[h % len(self.targets)]]


class AllGrouper(Grouper):
    """Every target task gets a copy."""

    def choose(self, values: Sequence[object]) -> list[int]:
        return list(self.targets)


class GlobalGrouper(Grouper):
    """Everything goes to the lowest task id."""

    def choose(self, values: Sequence[object]) -> list[int]:
        return [min(self.targets)]


class DirectGrouper(Grouper):
    """The emitter picks the task (``emit_direct``); a plain ``emit`` is an error."""

    def choose(self, values: Sequence[object]) -> list[int]:
        msg = "this stream uses direct grouping: use collector.emit_direct(task, values)"
        raise ConfigError(msg)


class LocalOrShuffleGrouper(ShuffleGrouper):
    """Shuffle among targets in this worker when there are any, else among all."""

    def __init__(self, targets: Sequence[int], local_tasks: Iterable[int], rng: random.Random | None = None) -> None:
        local = set(local_tasks)
        mine = [t for t in targets if t in local]
        super().__init__(mine or targets, rng)
        self.targets = list(targets)


class LoadAwareShuffleGrouper(Grouper):
    """Power of two choices: of two random targets, take the less loaded (per ``get_load``)."""

    def __init__(self, targets: Sequence[int], load: LoadFn, rng: random.Random | None = None) -> None:
        super().__init__(targets)
        self._load = load
        self._rng = rng or random.Random()

    def choose(self, values: Sequence[object]) -> list[int]:
        if len(self.targets) == 1:
            return [self.targets[0]]
        a, b = self._rng.sample(self.targets, 2)
        loads = self._load((a, b))
        return [a if loads.get(a, 0.0) <= loads.get(b, 0.0) else b]


class CustomStreamGrouping(abc.ABC):
    """A grouping of your own (Storm's ``CustomStreamGrouping``): name it ``grouping: custom`` + ``class``.

    Built with the input's ``args``; ``prepare`` gets the consumer's task ids once, then
    ``choose_tasks`` returns the task(s) of every tuple.
    """

    def prepare(self, source_component: str, stream: str, target_tasks: list[int]) -> None:
        """Remember the targets (the default keeps them as ``self.target_tasks``)."""
        self.target_tasks = target_tasks

    @abc.abstractmethod
    def choose_tasks(self, values: Sequence[object]) -> list[int]:
        """Return the target task ids for a tuple with these values."""


class CustomGrouper(Grouper):
    """Runs a :class:`CustomStreamGrouping`, checking that it picks tasks of the consumer."""

    def __init__(self, targets: Sequence[int], grouping: CustomStreamGrouping, where: str) -> None:
        super().__init__(targets)
        self._grouping = grouping
        self._valid = frozenset(targets)
        self._where = where

    def choose(self, values: Sequence[object]) -> list[int]:
        tasks = list(self._grouping.choose_tasks(values))
        if not self._valid.issuperset(tasks):
            msg = f"{self._where}: chose tasks {tasks}, but the consumer's tasks are {sorted(self._valid)}"
            raise ConfigError(msg)
        return tasks


def make_custom_grouping(inp: Input, source: Component, targets: Sequence[int]) -> CustomGrouper:
    """Build the custom grouping of ``inp`` (its class, constructed with its args, then prepared).

    Raises
    ------
    ConfigError
        The class does not import, is not a CustomStreamGrouping, or its constructor raised.
    """
    from spark_storm.topology.model import resolve_class

    where = f"custom grouping {inp.custom!r} on {source.id!r} stream {inp.stream!r}"
    cls = resolve_class(inp.custom, "custom grouping")
    if not (isinstance(cls, type) and issubclass(cls, CustomStreamGrouping)):
        msg = f"{where}: the class must subclass spark_storm.topology.grouping.CustomStreamGrouping"
        raise ConfigError(msg)
    try:
        grouping = cls(*inp.custom_args)
        grouping.prepare(source.id, inp.stream, list(targets))
    except Exception as exc:  # user code: say which class and why
        msg = f"{where}: building it with args {list(inp.custom_args)} raised {type(exc).__name__}: {exc}"
        raise ConfigError(msg) from exc
    return CustomGrouper(targets, grouping, where)


def make_grouper(
    inp: Input,
    source: Component,
    targets: Sequence[int],
    *,
    local_tasks: Iterable[int] = (),
    load: LoadFn | None = None,
    rng: random.Random | None = None,
) -> Grouper:
    """Build the grouper for subscription ``inp`` (of a consumer) on ``source``'s stream."""
    g = inp.grouping
    if g in ("shuffle", "none"):
        return ShuffleGrouper(targets, rng)
    if g == "fields":
        declared = source.fields_of(inp.stream)
        return FieldsGrouper(targets, [declared.index(f) for f in inp.fields])
    if g == "all":
        return AllGrouper(targets)
    if g == "global":
        return GlobalGrouper(targets)
    if g == "direct":
        return DirectGrouper(targets)
    if g == "local_or_shuffle":
        return LocalOrShuffleGrouper(targets, local_tasks, rng)
    if g == "load_aware":
        return LoadAwareShuffleGrouper(targets, load or (lambda tasks: {}), rng)
    if g == "custom":
        return make_custom_grouping(inp, source, targets)
    msg = f"unknown grouping {g!r}"  # pragma: no cover - Topology validation rejects it
    raise ConfigError(msg)
