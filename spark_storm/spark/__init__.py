"""The Spark side: ``format("storm")``, ``storm_sink`` for foreachBatch (the only layer importing pyspark)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_storm.spark.datasource import StormDataSource
from spark_storm.spark.options import StormOptions
from spark_storm.spark.sink import StormSink, storm_sink

__all__ = ["StormDataSource", "StormOptions", "StormSink", "register", "storm_sink"]


def register(spark: SparkSession) -> None:
    """Register ``format("storm")`` on ``spark``.

    Not needed when spark-storm is installed: Spark finds the ``pyspark_storm`` module by itself.
    """
    spark.dataSource.register(StormDataSource)
