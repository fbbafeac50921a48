"""Task ids, executors and worker slots: computed the same way everywhere.

The same pure function runs on the Spark side and in every worker, so all agree on
which task lives where without talking to each other:

* task ids are assigned as Storm does: components in sorted id order, each taking the
  next ``num_tasks`` ids, starting from 1;
* a component's tasks are split into ``parallelism`` contiguous ranges (executors),
  sizes differing by at most one, larger ranges first;
* executors, in task order, go round-robin over the worker slots in sorted order (the
  even scheduler).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from spark_storm.errors import ConfigError
from spark_storm.topology.model import Topology

__all__ = ["ExecutorSpec", "Plan", "Slot", "parse_slots", "plan"]


@dataclass(frozen=True, order=True)
class Slot:
    """A worker slot: where one worker process listens."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, order=True)
class ExecutorSpec:
    """One executor: a component's contiguous task range ``first..last``."""

    first: int
    last: int
    component: str

    @property
    def tasks(self) -> range:
        return range(self.first, self.last + 1)

    def __str__(self) -> str:
        return f"{self.component}[{self.first}-{self.last}]"


def parse_slots(spec: str | Iterable[str]) -> list[Slot]:
    """Parse ``"h1:p1,h2:p2"`` (or a list of ``host:port``) into slots.

    Raises
    ------
    ConfigError
        A part is not ``host:port`` with a port in 1..65535, or a slot repeats.
    """
    parts = [p.strip() for p in spec.split(",")] if isinstance(spec, str) else [str(p).strip() for p in spec]
    slots = []
    for part in parts:
        if not part:
            continue
        host, sep, port_text = part.rpartition(":")
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) <= 65535:
            msg = f"worker slot {part!r} is not host:port (e.g. 127.0.0.1:6700)"
            raise ConfigError(msg)
        slots.append(Slot(host.strip("[]"), int(port_text)))
    if len(set(slots)) != len(slots):
        msg = f"worker slots repeat: {', '.join(map(str, slots))}"
        raise ConfigError(msg)
    return slots


@dataclass(frozen=True)
class Plan:
    """Where every task of a topology runs.

    Attributes
    ----------
    topology : Topology
    slots : tuple[Slot, ...]
        Worker slots, sorted.
    component_tasks : dict[str, range]
        Task ids of each component.
    executors : tuple[ExecutorSpec, ...]
        In task order.
    executor_slot : dict[ExecutorSpec, Slot]
    task_slot : dict[int, Slot]
    task_component : dict[int, str]
    """

    topology: Topology
    slots: tuple[Slot, ...]
    component_tasks: dict[str, range]
    executors: tuple[ExecutorSpec, ...]
    executor_slot: dict[ExecutorSpec, Slot]
    task_slot: dict[int, Slot]
    task_component: dict[int, str]

    def executors_of(self, slot: Slot) -> list[ExecutorSpec]:
        """Executors that run in the worker at ``slot``."""
        return [e for e in self.executors if self.executor_slot[e] == slot]

    def tasks_of(self, slot: Slot) -> list[int]:
        """Task ids that live in the worker at ``slot``."""
        return [t for e in self.executors_of(slot) for t in e.tasks]

    def describe(self) -> str:
        """Human-readable plan (``spark-storm topology plan``)."""
        lines = [
            f"topology {self.topology.name}: {len(self.task_component)} tasks, "
            f"{len(self.executors)} executors, {len(self.slots)} workers"
        ]
        rows = []
        for cid in sorted(self.component_tasks):
            r = self.component_tasks[cid]
            kind = " (source)" if self.topology.components[cid].source else ""
            execs = ", ".join(
                f"[{e.first}-{e.last}]->{self.executor_slot[e]}" for e in self.executors if e.component == cid
            )
            rows.append((cid + kind, f"{r.start}..{r.stop - 1}", execs))
        # columns as wide as their widest cell (a long id or " (source)" shifted the rest before)
        name_w = max([len("component"), *(len(name) for name, _, _ in rows)])
        tasks_w = max([len("tasks"), *(len(tasks) for _, tasks, _ in rows)])
        lines.append(f"{'component':<{name_w}}  {'tasks':<{tasks_w}}  executors -> worker")
        lines.extend(f"{name:<{name_w}}  {tasks:<{tasks_w}}  {execs}" for name, tasks, execs in rows)
        for slot in self.slots:
            lines.append(f"worker {slot}: " + ", ".join(str(e) for e in self.executors_of(slot)))
        return "\n".join(lines)


def _split(tasks: range, parts: int) -> list[range]:
    base, extra = divmod(len(tasks), parts)
    out, start = [], tasks.start
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def plan(topology: Topology, slots: Sequence[Slot] | str | None = None) -> Plan:
    """Assign tasks, executors and worker slots (deterministic).

    Parameters
    ----------
    topology : Topology
    slots : sequence of Slot, or "host:port,..." ; default: the topology's ``workers``.

    Raises
    ------
    ConfigError
        No worker slots were given and the topology names none.
    """
    if slots is None or isinstance(slots, str):
        chosen = parse_slots(slots if isinstance(slots, str) else topology.workers)
    else:
        chosen = list(slots)
    if not chosen:
        msg = (
            f"topology {topology.name!r}: no worker slots; pass --workers host:port,... "
            "or list 'workers' in the topology file"
        )
        raise ConfigError(msg)
    ordered = tuple(sorted(chosen))
    component_tasks: dict[str, range] = {}
    task_component: dict[int, str] = {}
    next_task = 1
    for cid in sorted(topology.components):
        n = topology.components[cid].num_tasks
        component_tasks[cid] = range(next_task, next_task + n)
        for t in component_tasks[cid]:
            task_component[t] = cid
        next_task += n
    if next_task - 1 > 0x7FFE:  # 0x7FFF is each worker's acker
        msg = f"topology {topology.name!r} has {next_task - 1} tasks; task ids must fit 1..32766"
        raise ConfigError(msg)
    executors = []
    for cid in sorted(topology.components):
        comp = topology.components[cid]
        for r in _split(component_tasks[cid], comp.parallelism):
            executors.append(ExecutorSpec(r.start, r.stop - 1, cid))
    executors.sort()
    executor_slot = {e: ordered[i % len(ordered)] for i, e in enumerate(executors)}
    task_slot = {t: executor_slot[e] for e in executors for t in e.tasks}
    return Plan(topology, ordered, component_tasks, tuple(executors), executor_slot, task_slot, task_component)
