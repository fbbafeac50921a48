"""The old import path of the batch windows: they are :mod:`spark_storm.worker.windows`' now (kept for users' code)."""

from spark_storm.worker.windows import BatchWindow, WindowedBatchBolt

__all__ = ["BatchWindow", "WindowedBatchBolt"]
