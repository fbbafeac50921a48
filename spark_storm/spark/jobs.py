"""What the ``jobs/`` scripts share: picking the source component and running a query to its end."""

from __future__ import annotations

import time
from typing import Any

from spark_storm.errors import ConfigError
from spark_storm.topology import load_topology

__all__ = ["run_query", "source_component"]


def source_component(topology_path: str, component: str | None) -> tuple[str, list[str]]:
    """Return the source component to feed (the only one when ``component`` is None) and its fields.

    Raises
    ------
    ConfigError
        ``component`` is not a source of the topology, or it has several and none was named.
    """
    topology = load_topology(topology_path)
    sources = sorted(c.id for c in topology.components.values() if c.source)
    chosen = component or (sources[0] if len(sources) == 1 else None)
    if chosen not in sources:
        msg = f"--component must be one of the sources {sources} of {topology_path}, got {component!r}"
        raise ConfigError(msg)
    return chosen, list(topology.components[chosen].fields_of())


def run_query(writer: Any, available_now: bool, seconds: float) -> int:
    """Start ``writer`` (a DataStreamWriter) and run it to its end; return the input rows.

    ``available_now``: process what the source holds now, then stop.  Otherwise run until
    ``seconds`` passed (0 = until the query stops), stopping between micro-batches.

    Raises
    ------
    pyspark.errors.StreamingQueryException
        The query failed (after Spark's own task retries).
    """
    query = writer.trigger(availableNow=True).start() if available_now else writer.start()
    started = time.monotonic()
    seen = -1
    while query.isActive:
        if not available_now and seconds and time.monotonic() - started > seconds:
            while query.status.get("isTriggerActive"):
                time.sleep(0.01)
            query.stop()
            break
        query.awaitTermination(1)
        progress = query.lastProgress
        if progress and progress["batchId"] != seen and progress["numInputRows"]:
            seen = progress["batchId"]
            print(f"batch {progress['batchId']}: {progress['numInputRows']} rows", flush=True)
    error = query.exception()
    if error is not None:
        raise error
    return sum(int(p["numInputRows"]) for p in query.recentProgress)
