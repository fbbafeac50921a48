"""The worker's wing for components of other kinds: Storm's multilang children and pystorm bolts.

* :class:`ShellBolt` / :class:`ShellSpout` run each task as a child process speaking
  Storm's multilang protocol (:mod:`spark_storm.multilang`), supervised by one
  :class:`~spark_storm.shell.child.ShellChild` each;
* :class:`InProcessPystormBolt` runs a pystorm/streamparse ``Bolt`` subclass inside the
  worker, without a child;
* :func:`adapt_class` turns whatever class a component names into one an executor runs
  (the executor factory finds it by its dotted path, so the worker does not import this wing).
"""

from __future__ import annotations

from spark_storm.shell.adapt import adapt_class, is_pystorm_class
from spark_storm.shell.bolt import ShellBolt
from spark_storm.shell.pystorm import InProcessPystormBolt
from spark_storm.shell.settings import MultilangSettings, handshake_conf, handshake_context
from spark_storm.shell.spout import ShellSpout

__all__ = [
    "InProcessPystormBolt",
    "MultilangSettings",
    "ShellBolt",
    "ShellSpout",
    "adapt_class",
    "handshake_conf",
    "handshake_context",
    "is_pystorm_class",
]
