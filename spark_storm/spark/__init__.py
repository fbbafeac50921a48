"""The Spark side (the only layer importing pyspark): format("storm"), storm_sink, storm_foreach."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_storm.spark.datasource import StormDataSource
from spark_storm.spark.foreach import StormForeachWriter, storm_foreach
from spark_storm.spark.options import StormOptions
from spark_storm.spark.sink import StormSink, storm_sink

__all__ = [
    "StormDataSource",
    "StormForeachWriter",
    "StormOptions",
    "StormSink",
    "register",
    "storm_foreach",
    "storm_sink",
]


def register(spark: SparkSession) -> None:
    """Register ``format("storm")`` on ``spark``.

    Not needed when spark-storm is installed: Spark finds the ``pyspark_storm`` module by itself.
    """
    spark.dataSource.register(StormDataSource)
