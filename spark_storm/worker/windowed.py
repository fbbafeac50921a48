"""The old import path of the tuple windows: they are :mod:`spark_storm.worker.windows`' now (kept for users' code)."""

from spark_storm.worker.windows import TupleWindow, WindowedBolt

__all__ = ["TupleWindow", "WindowedBolt"]
