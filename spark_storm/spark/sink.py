"""``storm_sink(**options)``: a picklable callable for ``writeStream.foreachBatch``."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

from spark_storm.spark.options import StormOptions

__all__ = ["StormSink", "storm_sink"]


class StormSink:
    """Writes each micro-batch through the ``storm`` data source, tagged with its batch id.

    Holds settings only (picklable).  The query id is the streaming query's, read from
    the driver's local property; pass ``queryId=`` to pin one (e.g. across a rename).
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.options = {k: str(v) for k, v in options.items()}
        StormOptions.parse(self.options)  # fail at definition time on bad options

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        options = dict(self.options)
        if "queryid" not in {k.lower() for k in options}:
            query_id = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
            if query_id:
                options["queryId"] = query_id
            else:
                options["queryId"] = f"foreachBatch-{options.get('topology')}"
        options["batchId"] = str(batch_id)
        df.write.format("storm").mode("append").options(**options).save()


def storm_sink(**options: Any) -> StormSink:
    """Return a foreachBatch function that writes each micro-batch to a topology.

    It takes the same options as ``format("storm")``.
    """
    return StormSink({k: str(v) for k, v in options.items()})
