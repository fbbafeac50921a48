"""Windows: Storm's windowed bolts, with event time, sessions, columnar windows and exact state.

Bolt authors use :class:`WindowedBolt` / :class:`WindowedBatchBolt` and the windows they get,
:class:`TupleWindow` / :class:`BatchWindow` (:mod:`.bolts`).  The rest is the executor's:

* :mod:`.core`: event time, watermarks, which windows are due, sessions;
* :mod:`.engine`: the engine of one task (inputs, late and bad times, firing, save and load);
* :mod:`.kinds`: panes (duration windows) and sessions, over any storage;
* :mod:`.rows` and :mod:`.arrow`: the two storages (tuples or accumulators; Arrow panes with
  ``combine``), each with its count windows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_storm.errors import ConfigError
from spark_storm.worker.bolt import TopologyContext
from spark_storm.worker.windows.arrow import ArrowEngine
from spark_storm.worker.windows.bolts import BatchWindow, TupleWindow, WindowedBatchBolt, WindowedBolt
from spark_storm.worker.windows.engine import WindowEngine, windowed_spec
from spark_storm.worker.windows.rows import RowEngine

__all__ = ["BatchWindow", "TupleWindow", "WindowEngine", "WindowedBatchBolt", "WindowedBolt", "window_engine"]


def window_engine(bolt: object, conf: Mapping[str, Any], context: TopologyContext, collector: Any) -> WindowEngine[Any]:
    """Build the window engine of a windowed task; the executor holds it and prepares the bolt with its collector.

    Raises
    ------
    ConfigError
        The component declares no window, or the bolt overrides what the engine does (naming the fix).
    """
    base: type[WindowedBolt] | type[WindowedBatchBolt]
    engine: type[RowEngine] | type[ArrowEngine]
    if isinstance(bolt, WindowedBolt):
        base, method, engine = WindowedBolt, "execute", RowEngine
    elif isinstance(bolt, WindowedBatchBolt):
        base, method, engine = WindowedBatchBolt, "execute_batch", ArrowEngine
    else:
        msg = f"{type(bolt).__name__} is not a WindowedBolt or WindowedBatchBolt: it has no windows"
        raise ConfigError(msg)
    spec = windowed_spec(conf, context, base.__name__)
    if getattr(type(bolt), method) is not getattr(base, method):
        msg = (
            f"{type(bolt).__name__} overrides {method}: a {base.__name__}'s input goes to its window engine, "
            f"which calls execute_window; remove the override and put the work in execute_window"
        )
        raise ConfigError(msg)
    return engine(bolt, spec, context, collector)  # type: ignore[arg-type]
