"""Which executor runs a component: the one place that knows every kind (Storm's executor factory).

The component's class decides: a spout (or a ``spout:`` component) gets a
:class:`~spark_storm.worker.spout.SpoutExecutor`, a :class:`BatchBolt` a
:class:`~spark_storm.worker.executor.BatchExecutor`, a :class:`Bolt` a
:class:`~spark_storm.worker.executor.TupleExecutor`.  Classes of other kinds (pystorm bolts,
Flux-constructed classes) are adapted first by the shell wing, found by its dotted path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from spark_storm.errors import ConfigError
from spark_storm.plugins import load_object
from spark_storm.topology.assignment import ExecutorSpec
from spark_storm.topology.model import CLASS_ADAPTER, Component, resolve_class
from spark_storm.topology.windows import window_spec
from spark_storm.worker.bolt import BatchBolt, Bolt
from spark_storm.worker.executor import BatchExecutor, Executor, TupleExecutor
from spark_storm.worker.queue import BatchQueue, QueueItem
from spark_storm.worker.settings import WorkerSettings
from spark_storm.worker.spout import Spout, SpoutExecutor
from spark_storm.worker.windows import WindowedBatchBolt, WindowedBolt

if TYPE_CHECKING:
    from spark_storm.worker.state import WorkerState

__all__ = ["check_window", "make_executor"]


def make_executor(
    host: WorkerState,
    spec: ExecutorSpec,
    queue: BatchQueue[QueueItem],
    settings: WorkerSettings,
    worker_conf: Mapping[str, Any],
) -> Executor:
    """Build the executor of ``spec``: its bolt class decides tuple or batch.

    Raises
    ------
    ConfigError
        The component's bolt cannot be imported or is neither a Bolt nor a BatchBolt.
    """
    adapt_class = load_object(CLASS_ADAPTER, "the class adapter")  # the shell wing, by its dotted path

    component = host.plan.topology.components[spec.component]
    conf = {**worker_conf, **host.plan.topology.conf, **component.conf}
    bolt_cls = adapt_class(component, resolve_class(component.bolt, f"component {component.id!r} bolt"))
    check_window(component, bolt_cls, conf)
    if component.spout or (isinstance(bolt_cls, type) and issubclass(bolt_cls, Spout)):
        return SpoutExecutor(host, spec, queue, settings, conf, bolt_cls)
    if isinstance(bolt_cls, type) and issubclass(bolt_cls, BatchBolt):
        return BatchExecutor(host, spec, queue, settings, conf, bolt_cls)
    if isinstance(bolt_cls, type) and issubclass(bolt_cls, Bolt):
        return TupleExecutor(host, spec, queue, settings, conf, bolt_cls)
    msg = f"component {component.id!r}: {component.bolt!r} is neither a Bolt nor a BatchBolt subclass"
    raise ConfigError(msg)


def check_window(component: Component, bolt_cls: Any, conf: Mapping[str, Any]) -> None:
    """Check that a window spec has a windowed bolt and a windowed bolt a spec (ConfigError naming the fix)."""
    windowed = isinstance(bolt_cls, type) and issubclass(bolt_cls, (WindowedBolt, WindowedBatchBolt))
    spec = window_spec(component.conf, f"component {component.id!r}", conf)
    if spec is not None and not windowed:
        msg = (
            f"component {component.id!r} declares a window ({spec.describe()}) but its bolt {component.bolt!r} "
            "is not a WindowedBolt or WindowedBatchBolt; subclass one and implement execute_window"
        )
        raise ConfigError(msg)
    if spec is None and windowed:
        msg = (
            f"component {component.id!r}: its bolt {component.bolt!r} is windowed but the component declares no "
            "window; give it 'window: {length: 60s, sliding: 10s}' (or session_gap)"
        )
        raise ConfigError(msg)
