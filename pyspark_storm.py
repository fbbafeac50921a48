"""Auto-registration shim: Spark loads importable ``pyspark_*`` modules exposing ``DefaultSource``.

With spark-storm installed, ``df.writeStream.format("storm")`` works with no register call.
"""

from spark_storm.spark.datasource import StormDataSource as DefaultSource

__all__ = ["DefaultSource"]
