"""Storm's ShellBolt: each task a child process speaking the multilang protocol.

A component whose class is :class:`ShellBolt` (YAML ``shell: [cmd, ...]``, or a Flux
``FluxShellBolt``) runs each task in a child process that speaks Storm's multilang
protocol (:mod:`spark_storm.multilang`): Storm's own ``storm.py``/``storm.js``
components, and streamparse/pystorm bolts (``streamparse_run pkg.mod.Class``) unchanged.

Per task, the bolt runs one child with three I/O threads (reader, writer, stderr) and a
monitor thread:

* ``execute`` only queues the tuple (bounded by ``topology.shellbolt.max.pending``: a
  child that stops reading holds its executor back, and through it the senders);
* the writer sends everything queued with one ``write``; the reader decodes whole chunks
  of the child's output and applies its emits, acks and fails through a collector of its
  own thread, flushed once per chunk — the same batching as an executor;
* the monitor sends a ``__heartbeat`` tuple every ``topology.multilang.heartbeat.interval.ms``
  and kills a child that said nothing for ``topology.subprocess.timeout.secs`` (default
  ``supervisor.worker.timeout.secs``).

A child that exits, hangs or writes garbage fails its pending tuples (their trees fail,
so Spark replays their groups at once), the error names the command and the child's last
stderr line, and the child is started again after ``topology.multilang.restart.backoff.*``
(doubling up to the max, reset once a child lived that long; :class:`~spark_storm.shell.child.ShellChild`
supervises it, for the spouts too).  A command that cannot start is a ConfigError when the
worker starts.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from spark_storm.codec.tuples import Tuple
from spark_storm.multilang.process import Outbox, ShellProcess
from spark_storm.multilang.protocol import BOLT_COMMANDS, command_of, heartbeat_tuple, parse_emit
from spark_storm.multilang.serializers import ProtocolError, TupleRecord
from spark_storm.shell.child import ShellChild
from spark_storm.worker.bolt import Bolt, OutputCollector, TopologyContext

__all__ = ["ShellBolt"]

logger = logging.getLogger(__name__)


class ShellBolt(Bolt):
    """Storm's ShellBolt: each task is a child process speaking the multilang protocol.

    The component's configuration names the child (``topology.multilang.command``, a
    list; ``topology.multilang.dir``, its directory) and the wire format
    (``topology.multilang.serializer``: ``json``, or ``msgpack`` for pystorm started with
    ``-s msgpack``).
    """

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self._child = ShellChild("bolt", conf, context, collector.report_error)
        self.name = self._child.name
        self.settings = s = self._child.settings
        self._ids = itertools.count(1)
        self._inflight: dict[str, Tuple] = {}
        self._outbox = Outbox(s.max_pending)
        self._lock = threading.Lock()
        self._proc: ShellProcess | None = None
        self._closing = threading.Event()
        self._thread_collectors: dict[int, Any] = {}
        self._handlers = {"emit": self._on_emit, "ack": self._on_ack, "fail": self._on_fail, "sync": None}
        self._run(self._child.start())  # a child that cannot start fails the worker's start, with its stderr
        self._monitor = threading.Thread(target=self._monitor_loop, name=f"spark-storm-multilang-{self.name}-monitor")
        self._monitor.daemon = True
        self._monitor.start()

    @property
    def restarts(self) -> int:
        """Children started again after one died."""
        return self._child.restarts

    @property
    def metrics_reported(self) -> dict[str, Any]:
        """The child's ``metrics`` commands, by name."""
        return self._child.metrics_reported

    # ------------------------------------------------------------------ the child
    def _run(self, proc: ShellProcess) -> None:
        with self._lock:  # recorded before its reader may report its exit
            self._proc = proc
            self._heartbeat_sent = 0.0
        proc.run(self._outbox, self._encode, self._on_messages, self._on_exit)

    def _collector(self) -> Any:
        """Return the collector of the calling thread (a reader's, or the executor's at cleanup)."""
        ident = threading.get_ident()
        tc = self._thread_collectors.get(ident)
        if tc is None:
            make = getattr(self.collector, "for_thread", None)
            tc = make() if make is not None else self.collector
            if len(self._thread_collectors) > 64:
                self._thread_collectors.clear()
            self._thread_collectors[ident] = tc
        return tc

    def _flush(self, tc: Any) -> None:
        flush = getattr(tc, "flush", None)
        if flush is not None:
            flush()

    def _encode(self, control: list[Any], items: list[tuple[str, Tuple]]) -> bytes:
        """Writer thread: register the tuples as sent, then encode everything at once."""
        serializer = self.settings.serializer
        inflight = self._inflight
        records: list[TupleRecord] = []
        for tid, tup in items:
            inflight[tid] = tup
            src = tup.source
            records.append((tid, src.component, src.stream, src.task, tup.values))
        head = serializer.encode(control) if control else b""
        if not records:
            return head
        try:
            return head + serializer.encode_tuples(records)
        except (TypeError, ValueError, OverflowError):
            return head + self._encode_one_by_one(records)

    def _encode_one_by_one(self, records: list[TupleRecord]) -> bytes:
        serializer = self.settings.serializer
        out = []
        tc = self._collector()
        for record in records:
            try:
                out.append(serializer.encode_tuples([record]))
            except (TypeError, ValueError, OverflowError) as exc:
                tup = self._inflight.pop(record[0], None)
                error = f"multilang bolt {self.name}: cannot send a tuple as {serializer.name}: {exc}; tuple failed"
                logger.error("%s", error)
                tc.report_error(error)
                if tup is not None:
                    tc.fail(tup)
        self._flush(tc)
        return b"".join(out)

    # ------------------------------------------------------------------ the child's messages (reader thread)
    def _on_messages(self, messages: list[Any]) -> None:
        tc = self._collector()
        handlers = self._handlers
        try:
            for message in messages:
                command = message.get("command") if type(message) is dict else None
                if command in handlers:
                    handler = handlers[command]
                    if handler is not None:
                        handler(tc, message)
                elif not self._child.on_common(command_of(message, BOLT_COMMANDS), message, tc.report_error):
                    msg = f"multilang bolt {self.name} sent {message!r:.200}, which a bolt does not send"
                    raise ProtocolError(msg)
        finally:
            self._flush(tc)

    def _anchors(self, ids: tuple[str, ...]) -> list[Tuple]:
        inflight = self._inflight
        out = []
        for aid in ids:
            tup = inflight.get(aid)
            if tup is None:
                msg = f"emit anchored on tuple id {aid!r}, which is not pending (acked, failed or never sent)"
                raise ProtocolError(msg)
            out.append(tup)
        return out

    def _on_emit(self, tc: Any, message: dict[str, Any]) -> None:
        emit = parse_emit(message)
        anchors = self._anchors(emit.anchors) if emit.anchors else None
        if emit.task is not None:
            tc.emit_direct(emit.task, emit.values, emit.stream, anchors)
            return
        tasks = tc.emit(emit.values, emit.stream, anchors)
        if emit.need_task_ids:
            self._outbox.put_control(tasks)

    def _pending(self, message: dict[str, Any], what: str) -> Tuple:
        tid = message.get("id")
        tup = self._inflight.pop(tid if isinstance(tid, str) else str(tid), None)
        if tup is None:
            msg = f"{what} of tuple id {tid!r}, which is not pending (acked or failed already, or never sent)"
            raise ProtocolError(msg)
        return tup

    def _on_ack(self, tc: Any, message: dict[str, Any]) -> None:
        tc.ack(self._pending(message, "ack"))

    def _on_fail(self, tc: Any, message: dict[str, Any]) -> None:
        tc.fail(self._pending(message, "fail"))

    def _on_exit(self, proc: ShellProcess, reason: str) -> None:
        """Reader thread: the child is gone; fail what it held, then plan a restart."""
        with self._lock:
            if proc is not self._proc:
                return
            self._proc = None  # no restart is planned until what it held has failed
            closing = self._closing.is_set()
        proc.close(0.0)  # its writer is joined first: nothing more is registered as sent to it
        pending, self._inflight = self._inflight, {}
        tc = self._collector()
        for tup in pending.values():
            tc.fail(tup)
        self._flush(tc)
        if closing:
            logger.info("multilang bolt %s: child %s %s", self.name, proc.describe(), reason)
            return
        with self._lock:
            if not self._closing.is_set():
                self._child.died(proc, reason, f"; failed its {len(pending)} pending tuples")

    # ------------------------------------------------------------------ monitor thread
    def _monitor_loop(self) -> None:
        s = self.settings
        while not self._closing.wait(min(s.heartbeat_s, 0.25) if s.heartbeat_s else 0.25):
            now = time.monotonic()
            with self._lock:
                proc = self._proc
                due = proc is None and self._child.due()
            if proc is None:
                if due:
                    self._restart()
                continue
            if now - proc.last_heard > s.timeout_s:
                proc.kill(
                    f"heartbeat timeout: nothing from the child for {now - proc.last_heard:.1f}s "
                    f"(topology.subprocess.timeout.secs / supervisor.worker.timeout.secs = {s.timeout_s:g})"
                )
                continue
            if s.heartbeat_s and now - self._heartbeat_sent >= s.heartbeat_s:
                self._heartbeat_sent = now
                self._outbox.put_control(heartbeat_tuple(f"hb{next(self._ids)}"))

    def _restart(self) -> None:
        proc = self._child.restart()
        if proc is not None:
            self._run(proc)

    # ------------------------------------------------------------------ the bolt API
    def in_flight(self) -> int:
        """Tuples queued for the child or sent to it and not yet acked or failed by it."""
        return len(self._outbox) + len(self._inflight)

    def execute(self, tup: Tuple) -> None:
        if not self._outbox.put_tuple((str(next(self._ids)), tup)):
            self.collector.fail(tup)  # closing: nobody will process it

    def cleanup(self) -> None:
        """Give the child ``topology.multilang.shutdown.timeout.ms`` to finish, then close it."""
        deadline = time.monotonic() + self.settings.shutdown_s
        while (len(self._outbox) or self._inflight) and time.monotonic() < deadline and self._proc is not None:
            time.sleep(0.01)
        self._closing.set()
        self._outbox.close()
        with self._lock:
            proc = self._proc
        if proc is not None:
            proc.close(max(0.5, deadline - time.monotonic()))
        self._monitor.join(2.0)
        tc = self._collector()
        left = [tup for _, tup in self._outbox.drain_tuples()]
        pending, self._inflight = self._inflight, {}
        for tup in [*pending.values(), *left]:
            tc.fail(tup)
        self._flush(tc)
        if pending or left:
            n = len(pending) + len(left)
            logger.warning("multilang bolt %s: %d tuples were not done when it stopped; failed them", self.name, n)
