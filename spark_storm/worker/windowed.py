"""The old import path of the tuple windows: they are :mod:`spark_storm.worker.windows`' now (kept for users' code)."""

from spark_storm.worker.windows import TupleWindow, WindowedBolt
from spark_storm.worker.windows.engine import window_inputs, windowed_spec

__all__ = ["TupleWindow", "WindowedBolt", "window_inputs", "windowed_spec"]
