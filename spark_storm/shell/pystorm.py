"""The in-process fast path: a pystorm/streamparse ``Bolt`` subclass run inside the worker, no child process.

The bolt's own code runs unchanged: its ``process`` / ``process_tick``, ``emit`` (with
``auto_anchor``), ``auto_ack`` / ``auto_fail``, ``self.logger``, ``initialize``.  The
adapter gives it the handshake a child would get, then for every tuple builds pystorm's
``Tuple`` (with the namedtuple values pystorm builds from ``source->stream->fields``) and
runs pystorm's own ``_run`` for it; the messages the bolt would write to stdout
(``emit``, ``ack``, ``fail``, ``log``, ``error``, ``metrics``, ``sync``) are taken from
``send_message`` and applied directly.  An exception is handled as pystorm's ``run``
loop would (``_handle_run_exception``: report, fail the tuple); with
``exit_on_exception`` (pystorm's default) the child would exit and be restarted, so the
adapter builds a fresh instance (``initialize`` again: in-memory state is lost, as with a
restarted child).

When it is safe, and when not (the README says the same):

* the bolt must not rely on stdin/stdout — it gets neither (``print`` goes to the worker's
  stdout, not to Storm's log; anything that writes the protocol itself breaks);
* it runs in the worker's interpreter: its package and dependencies must be installed
  in the worker's environment (not a venv of its own), and a CPU-heavy bolt shares the
  worker's GIL with the executors (a child process has its own);
* no process-wide side effects: signal handlers (pystorm's remote-pdb ``SIGUSR1`` is
  not installed), ``os._exit``, changing the working directory or ``sys.path``,
  module-level state shared by several tasks of the same class;
* pystorm's logging setup is not run (no ``StormHandler`` on the worker's root logger):
  ``self.logger`` logs through the worker's logging.
"""

from __future__ import annotations

import io
import itertools
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from spark_storm.codec.tuples import Tuple
from spark_storm.errors import ConfigError
from spark_storm.multilang.protocol import parse_emit
from spark_storm.multilang.serializers import ProtocolError
from spark_storm.shell.settings import handshake_conf, handshake_context, log_from_child
from spark_storm.worker.bolt import Bolt, OutputCollector, TopologyContext

__all__ = ["InProcessPystormBolt"]

logger = logging.getLogger(__name__)


class InProcessPystormBolt(Bolt):
    """Runs the pystorm ``Bolt`` subclass ``target`` in-process (see the module's notes)."""

    target: ClassVar[Any] = None
    construct: ClassVar[Any] = None

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        from pystorm.component import Tuple as PystormTuple

        self._ptuple = PystormTuple
        self.name = f"{context.component_id}:{context.task_id}"
        self._conf = handshake_conf(conf, context.topology_id)
        self._context = handshake_context(context)
        self._ids = itertools.count(1)
        self._pending: dict[str, Tuple] = {}
        self._task_ids: list[int] | None = None
        self._current: Any = None
        self.rebuilds = 0
        self.metrics_reported: dict[str, Any] = {}
        self._bolt = self._build()

    def _build(self) -> Any:
        args = list((self.construct or {}).get("args") or [])
        try:
            bolt = self.target(*args, input_stream=io.BytesIO(), output_stream=io.BytesIO(), rdb_signal=None)
        except Exception as exc:  # user code: name the class
            msg = f"component {self.context.component_id!r}: building {self.target.__name__} raised {exc!r}"
            raise ConfigError(msg) from exc
        bolt.send_message = self._send
        bolt.read_task_ids = self._read_task_ids
        bolt.read_tuple = self._read_tuple
        bolt.read_command = self._read_tuple
        self._setup(bolt)
        bolt.initialize(bolt.storm_conf, bolt.context)
        return bolt

    def _setup(self, bolt: Any) -> None:
        """Pystorm's ``_setup_component`` without its logging setup (it would take over the worker's root logger)."""
        root = logging.getLogger()
        handlers = list(root.handlers)
        level = root.level
        try:
            bolt._setup_component(self._conf, self._context)
        finally:
            for handler in list(root.handlers):
                if handler not in handlers:
                    root.removeHandler(handler)
            root.setLevel(level)

    def _read_tuple(self) -> Any:
        return self._current

    def _read_task_ids(self) -> list[int]:
        tasks, self._task_ids = self._task_ids, None
        return tasks or []

    def _send(self, message: Any) -> None:
        """Apply what the bolt would write to stdout."""
        command = message.get("command") if isinstance(message, dict) else None
        collector = self.collector
        if command == "emit":
            emit = parse_emit(message)
            anchors = [self._lookup(a) for a in emit.anchors] if emit.anchors else None
            if emit.task is not None:
                collector.emit_direct(emit.task, emit.values, emit.stream, anchors)
                self._task_ids = [emit.task]
            else:
                self._task_ids = collector.emit(emit.values, emit.stream, anchors)
        elif command == "ack":
            collector.ack(self._take(message.get("id"), "ack"))
        elif command == "fail":
            collector.fail(self._take(message.get("id"), "fail"))
        elif command == "log":
            log_from_child(self.name, message)
        elif command == "error":
            error = f"pystorm bolt {self.name}: {message.get('msg', '')}"
            logger.error("%s", error)
            collector.report_error(error)
        elif command == "metrics":
            self.metrics_reported[str(message.get("name"))] = message.get("params")
        elif command != "sync":
            msg = f"pystorm bolt {self.name} sent {message!r:.200}, which is no multilang command"
            raise ProtocolError(msg)

    def _lookup(self, tid: str) -> Tuple:
        tup = self._pending.get(tid)
        if tup is None:
            msg = f"emit anchored on tuple id {tid!r}, which is not pending (acked or failed already)"
            raise ProtocolError(msg)
        return tup

    def _take(self, tid: Any, what: str) -> Tuple:
        tup = self._pending.pop(str(tid), None)
        if tup is None:
            msg = f"{what} of tuple id {tid!r}, which is not pending (acked or failed already)"
            raise ProtocolError(msg)
        return tup

    def execute(self, tup: Tuple) -> None:
        bolt = self._bolt
        tid = str(next(self._ids))
        self._pending[tid] = tup
        src = tup.source
        fields = bolt._source_tuple_types.get(src.component, {}).get(src.stream)
        values = fields(*tup.values) if fields is not None else tuple(tup.values)
        self._current = self._ptuple(tid, src.component, src.stream, src.task, values)
        try:
            bolt._run()
        except Exception as exc:
            logger.error("pystorm bolt %s: %s raised on %r", self.name, type(bolt).__name__, tup, exc_info=exc)
            try:
                bolt._handle_run_exception(exc)
            except Exception as again:  # the bolt is rebuilt below either way; say what its handler raised
                logger.error(
                    "pystorm bolt %s: handling that exception raised too: %s: %s",
                    self.name,
                    type(again).__name__,
                    again,
                    exc_info=again,
                )
            self.collector.report_error(f"pystorm bolt {self.name}: {type(exc).__name__}: {exc}")
            if getattr(bolt, "exit_on_exception", True):
                self.rebuilds += 1  # a child would exit here and be started again: so does its state
                self._bolt = self._build()

    def cleanup(self) -> None:
        """Fail what the bolt never acked (a batching bolt's last batch), flushed from this thread."""
        if not self._pending:
            return
        make = getattr(self.collector, "for_thread", None)
        collector = make() if make is not None else self.collector
        for tup in self._pending.values():
            collector.fail(tup)
        self._pending.clear()
        flush = getattr(collector, "flush", None)
        if flush is not None:
            flush()
