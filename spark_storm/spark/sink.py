"""``storm_sink(**options)``: a picklable callable for ``writeStream.foreachBatch``."""

from __future__ import annotations

import functools
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import DataFrame

from spark_storm.spark import batch_function
from spark_storm.spark.options import StormOptions

__all__ = ["StormSink", "storm_sink"]

# Spark Connect runs the foreachBatch function where a shipped spark-storm is not importable:
# the function travels by value (see spark_storm.spark.batch_function).
cloudpickle.register_pickle_by_value(batch_function)  # type: ignore[no-untyped-call]


class StormSink:
    """Writes each micro-batch through the ``storm`` data source, tagged with its batch id.

    Holds settings only; validated when made.  Pickled, it becomes
    ``partial(write_batch, options)`` with :func:`~spark_storm.spark.batch_function.write_batch`
    carried by value, so that it runs where only pyspark is installed (Spark Connect's
    foreachBatch process with spark-storm shipped as an artifact).

    The query id (with the batch id, it makes a replayed micro-batch's groups recognisable
    to the workers) is the streaming query's: in a classic session the driver's local
    property, over Spark Connect the one query of this session whose trigger is running (the
    function runs inside it).  Pass ``queryId=`` to pin one (e.g. across a rename, or with
    several queries of one Connect session in a micro-batch at once).
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.options = {k: str(v) for k, v in options.items()}
        StormOptions.parse(self.options)  # fail at definition time on bad options

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        batch_function.write_batch(self.options, df, batch_id)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return functools.partial, (batch_function.write_batch, dict(self.options))


def storm_sink(**options: Any) -> StormSink:
    """Return a foreachBatch function that writes each micro-batch to a topology.

    It takes the same options as ``format("storm")``.
    """
    return StormSink({k: str(v) for k, v in options.items()})
