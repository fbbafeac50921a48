"""Auto-registration shim: Spark loads importable ``pyspark_*`` modules exposing ``DefaultSource``.

With spark-storm installed, ``spark.read.format("storm_state")`` works with no register call
(one ``DefaultSource`` per module, so ``format("storm")`` has ``pyspark_storm`` and this
data source a module of its own).
"""

from spark_storm.spark.state_source import StormStateDataSource as DefaultSource

__all__ = ["DefaultSource"]
