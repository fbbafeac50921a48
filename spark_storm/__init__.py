"""spark-storm: Apache Storm's worker messaging layer in Python, fed by Spark.

Layers import only downward: ``spark`` -> ``worker`` -> ``transport`` -> ``messaging``;
``config`` and ``errors`` sit underneath all of them.
"""

from __future__ import annotations

import logging

__version__ = "0.1.0"

logging.getLogger("spark_storm").addHandler(logging.NullHandler())

__all__ = ["__version__"]
