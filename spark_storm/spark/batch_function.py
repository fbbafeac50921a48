"""The function ``storm_sink`` hands to ``foreachBatch``, pickled by value.

Over Spark Connect, the ``foreachBatch`` function runs in a Python process that the server
starts next to its driver.  That process does not see the Python artifacts of the session
(``spark.addArtifacts(..., pyfile=True)``, :func:`spark_storm.spark.ship`), while the data
source's writer tasks do.  So this module is registered with pyspark's cloudpickle to be
pickled *by value*: the function below travels with its code and needs no spark-storm where
it runs (only pyspark); the rows then go through ``format("storm")``, which runs where the
package is.  Nothing here may import spark-storm at module level or use its names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["query_id_of", "write_batch"]


def query_id_of(spark: Any, topology: str | None) -> str:
    """Return the id of the streaming query this foreachBatch call runs in.

    Raises
    ------
    ValueError
        (``spark_storm.errors.ConfigError`` where spark-storm is importable.)  Spark Connect,
        and more than one query of the session is in a micro-batch: the message says to pass
        ``queryId``.
    """
    if not type(spark).__module__.startswith("pyspark.sql.connect"):
        # Classic: the micro-batch runs on the query's own thread, which carries its id.
        query_id = spark.sparkContext.getLocalProperty("sql.streaming.queryId")
        return str(query_id) if query_id else f"foreachBatch-{topology}"
    # Spark Connect: the function runs on a session of its own that shares the query's session
    # id; there is no JVM and no local property.  The query whose trigger is active now is ours.
    running = [q for q in spark.streams.active if q.status.get("isTriggerActive")]
    if len(running) == 1:
        return str(running[0].id)
    names = ", ".join(sorted(str(q.name or q.id) for q in running)) or "none"
    msg = (
        f"storm_sink over Spark Connect cannot tell which streaming query it runs in ({len(running)} of this "
        f"session's queries are in a micro-batch: {names}): pass queryId=... to storm_sink, an id that stays "
        "the same when this query restarts from its checkpoint (e.g. its name)"
    )
    try:
        from spark_storm.errors import ConfigError
    except ImportError:  # spark-storm only shipped as an artifact, not installed here
        raise ValueError(msg) from None
    raise ConfigError(msg)


def write_batch(options: Mapping[str, str], df: Any, batch_id: int) -> None:
    """Write one micro-batch through ``format("storm")``, tagged with the query's id and ``batch_id``."""
    opts = dict(options)
    if "queryid" not in {k.lower() for k in opts}:
        opts["queryId"] = query_id_of(df.sparkSession, opts.get("topology"))
    opts["batchId"] = str(batch_id)
    try:
        df.write.format("storm").mode("append").options(**opts).save()
    except Exception as exc:
        if "DATA_SOURCE_NOT_FOUND" not in str(exc):
            raise
        msg = (
            "storm_sink: Spark does not know format('storm') on this session: call "
            "spark_storm.spark.register(spark) once (spark-storm installed where Spark's Python workers run), "
            "or spark_storm.spark.ship(spark) on a Spark Connect session (spark-storm only on this client)"
        )
        try:
            from spark_storm.errors import ConfigError
        except ImportError:  # spark-storm only shipped as an artifact, not installed here
            raise RuntimeError(msg) from exc
        raise ConfigError(msg) from exc
