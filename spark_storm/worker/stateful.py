"""Stateful bolts: state that is exact through failures (Storm's ``IStatefulBolt``, Python names).

::

    class CountBolt(StatefulBolt):
        def init_state(self, state: KeyValueState) -> None:
            self.counts = state                    # the last committed state, before any tuple

        def execute(self, tup: Tuple) -> None:
            word = tup.get("word")
            n = self.counts.get(word, 0) + 1
            self.counts.put(word, n)
            self.collector.emit([word, n], anchors=tup)
            self.collector.ack(tup)

The worker checkpoints the state at every epoch (a Spark micro-batch's commit, or
``topology.state.checkpoint.interval.ms`` for plain clients) and rolls every stateful task
back to the last committed epoch when anything failed, replaying the input since then: so
the committed state is that of every input row processed exactly once (docs/design/state.md).

Hooks, as in Storm's ``IStatefulComponent`` (all on the task's executor thread):
``pre_prepare(txid)`` just before the state of epoch ``txid`` is written, ``pre_commit(txid)``
once epoch ``txid`` is committed everywhere, ``pre_rollback()`` before the state is replaced
by the last committed one.  A value the state cannot store is refused by ``put``: the
tuple fails, the worker goes on.
"""

from __future__ import annotations

import abc

from spark_storm.state.kv import KeyValueState
from spark_storm.worker.bolt import BatchBolt, Bolt

__all__ = ["KeyValueState", "StatefulBatchBolt", "StatefulBolt", "StatefulComponent", "is_stateful"]


class StatefulComponent:
    """The state hooks shared by :class:`StatefulBolt` and :class:`StatefulBatchBolt`."""

    @abc.abstractmethod
    def init_state(self, state: KeyValueState) -> None:
        """Receive the task's state: the last committed one, after ``prepare``, before any tuple."""

    def pre_prepare(self, txid: int) -> None:
        """Get ready: epoch ``txid``'s state is about to be written (put anything still held in memory now)."""

    def pre_commit(self, txid: int) -> None:
        """Learn that epoch ``txid`` is committed on every worker."""

    def pre_rollback(self) -> None:
        """Prepare for the state to be rolled back to the last committed epoch (and the input since replayed)."""


class StatefulBolt(StatefulComponent, Bolt):
    """A tuple bolt with a :class:`KeyValueState` (``init_state``) that is exact through failures."""


class StatefulBatchBolt(StatefulComponent, BatchBolt):
    """A batch bolt with a :class:`KeyValueState`; ``state.get_many`` / ``put_many`` take Arrow or numpy arrays."""


def is_stateful(bolt_cls: object) -> bool:
    """Whether a bolt class keeps checkpointed state."""
    return isinstance(bolt_cls, type) and issubclass(bolt_cls, StatefulComponent)
