"""Multilang components: Storm's ShellBolt and ShellSpout, as a spark-storm Bolt and Spout.

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
(doubling up to the max, reset once a child lived that long).  A command that cannot
start is a ConfigError when the worker starts.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, Final

from spark_storm.codec.tuples import CLIENT_COMPONENT, Tuple
from spark_storm.errors import ConfigError, MultilangError
from spark_storm.multilang.process import Backoff, Outbox, ShellProcess, check_command
from spark_storm.multilang.protocol import (
    BOLT_COMMANDS,
    SPOUT_COMMANDS,
    build_context,
    command_of,
    handshake,
    heartbeat_tuple,
    log_level,
    parse_emit,
    spout_command,
)
from spark_storm.multilang.serializers import ProtocolError, Serializer, TupleRecord, make_serializer
from spark_storm.topology.model import DEFAULT_STREAM, MULTILANG_COMMAND, MULTILANG_DIR
from spark_storm.worker.bolt import Bolt, OutputCollector, TopologyContext
from spark_storm.worker.spout import Spout, SpoutOutputCollector

__all__ = ["MultilangSettings", "ShellBolt", "ShellSpout", "handshake_conf", "handshake_context"]

logger = logging.getLogger(__name__)
child_logger = logging.getLogger("spark_storm.multilang.child")

_SECRET_WORDS: Final = ("secret", "password")
_GROUPING_TYPES: Final = {
    "shuffle": "SHUFFLE",
    "fields": "FIELDS",
    "all": "ALL",
    "global": "GLOBAL",
    "direct": "DIRECT",
    "local_or_shuffle": "LOCAL_OR_SHUFFLE",
    "none": "NONE",
    "load_aware": "SHUFFLE",
    "custom": "CUSTOM",
}


def _num(conf: Mapping[str, Any], key: str, default: float) -> float:
    value = conf.get(key, default)
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if number < 0 or isinstance(value, bool):
        msg = f"config key {key!r} must be a number >= 0, got {value!r}"
        raise ConfigError(msg)
    return number


class MultilangSettings:
    """The multilang keys of a component's configuration, checked once."""

    def __init__(self, conf: Mapping[str, Any], where: str) -> None:
        command = conf.get(MULTILANG_COMMAND)
        if isinstance(command, str):
            command = command.split()
        if not isinstance(command, list) or not command:
            msg = f"{where}: {MULTILANG_COMMAND!r} must give the child's command as a list, got {command!r}"
            raise ConfigError(msg)
        self.command = [str(c) for c in command]
        cwd = conf.get(MULTILANG_DIR)
        self.cwd = str(cwd) if cwd else None
        env = conf.get("topology.multilang.env") or {}
        if not isinstance(env, Mapping):
            msg = f"{where}: 'topology.multilang.env' must be a mapping of variable to value, got {env!r}"
            raise ConfigError(msg)
        self.env = {str(k): str(v) for k, v in env.items()}
        self.serializer: Serializer = make_serializer(str(conf.get("topology.multilang.serializer") or "json"))
        timeout = conf.get("topology.subprocess.timeout.secs")
        key = "topology.subprocess.timeout.secs" if timeout is not None else "supervisor.worker.timeout.secs"
        self.timeout_s = _num(conf, key, 30.0)
        if self.timeout_s <= 0:
            msg = f"config key {key!r} must be > 0 seconds (how long a silent child lives), got {conf.get(key)!r}"
            raise ConfigError(msg)
        self.heartbeat_s = _num(conf, "topology.multilang.heartbeat.interval.ms", 1000.0) / 1000
        self.backoff_min_s = _num(conf, "topology.multilang.restart.backoff.min.ms", 100.0) / 1000
        self.backoff_max_s = _num(conf, "topology.multilang.restart.backoff.max.ms", 30000.0) / 1000
        self.max_pending = int(_num(conf, "topology.shellbolt.max.pending", 100.0)) or 1
        self.max_message_bytes = int(_num(conf, "topology.multilang.max.message.bytes", 16 * 1024 * 1024))
        self.shutdown_s = _num(conf, "topology.multilang.shutdown.timeout.ms", 5000.0) / 1000


def handshake_conf(conf: Mapping[str, Any], topology_name: str) -> dict[str, Any]:
    """Return the configuration a child gets: JSON-able values, secrets left out, ``topology.name`` set."""
    out: dict[str, Any] = {}
    for key, value in conf.items():
        if any(w in key for w in _SECRET_WORDS) or key == "topology.flux.construct":
            continue
        if isinstance(value, (str, int, float, bool, type(None), list, dict)):
            out[key] = value
    out["topology.name"] = topology_name
    return out


def handshake_context(context: TopologyContext) -> dict[str, Any]:
    """Storm 0.10's handshake context of a task, from the plan."""
    plan = context.plan
    if plan is None:
        msg = f"component {context.component_id!r}: a multilang child needs the topology's plan in its context"
        raise ConfigError(msg)
    topo = plan.topology
    me = topo.components[context.component_id]
    targets: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in me.outputs}
    for stream in me.outputs:
        for consumer, inp in topo.consumers(me.id, stream):
            targets[stream][consumer.id] = _grouping(inp.grouping, inp.fields)
    sources: dict[str, dict[str, dict[str, Any]]] = {}
    fields: dict[str, dict[str, list[str]]] = {}
    for inp in me.inputs:
        sources.setdefault(inp.component, {})[inp.stream] = _grouping(inp.grouping, inp.fields)
        fields.setdefault(inp.component, {})[inp.stream] = list(topo.components[inp.component].fields_of(inp.stream))
    if me.source:  # tuples from Spark come from "__client"
        sources[CLIENT_COMPONENT] = {DEFAULT_STREAM: _grouping(me.grouping, me.grouping_fields)}
        fields[CLIENT_COMPONENT] = {DEFAULT_STREAM: list(me.fields_of(DEFAULT_STREAM))}
    return build_context(
        task_id=context.task_id,
        component_id=context.component_id,
        task_component=plan.task_component,
        outputs=me.outputs,
        targets=targets,
        sources=sources,
        source_fields=fields,
    )


def _grouping(kind: str, fields: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": _GROUPING_TYPES.get(kind, kind.upper())}
    if kind == "fields":
        out["fields"] = list(fields)
    return out


def _log_from_child(name: str, message: Mapping[str, Any]) -> None:
    child_logger.log(log_level(message), "%s: %s", name, message.get("msg", ""))


class ShellBolt(Bolt):
    """Storm's ShellBolt: each task is a child process speaking the multilang protocol.

    The component's configuration names the child (``topology.multilang.command``, a
    list; ``topology.multilang.dir``, its directory) and the wire format
    (``topology.multilang.serializer``: ``json``, or ``msgpack`` for pystorm started with
    ``-s msgpack``).
    """

    def prepare(self, conf: Mapping[str, Any], context: TopologyContext, collector: OutputCollector) -> None:
        super().prepare(conf, context, collector)
        self.name = f"{context.component_id}:{context.task_id}"
        self.settings = s = MultilangSettings(conf, f"component {context.component_id!r}")
        check_command(s.command, s.cwd, f"component {context.component_id!r}")
        self._handshake = handshake(handshake_conf(conf, context.topology_id), handshake_context(context), "")
        self._ids = itertools.count(1)
        self._inflight: dict[str, Tuple] = {}
        self._outbox = Outbox(s.max_pending)
        self._backoff = Backoff(s.backoff_min_s, s.backoff_max_s)
        self._lock = threading.Lock()
        self._proc: ShellProcess | None = None
        self._restart_at: float | None = None
        self._closing = threading.Event()
        self._thread_collectors: dict[int, Any] = {}
        self.restarts = 0
        self.metrics_reported: dict[str, Any] = {}
        self._handlers = {
            "emit": self._on_emit,
            "ack": self._on_ack,
            "fail": self._on_fail,
            "log": self._on_log,
            "error": self._on_error,
            "metrics": self._on_metrics,
            "sync": None,
        }
        self._launch()  # a child that cannot start fails the worker's start, with its stderr
        self._monitor = threading.Thread(target=self._monitor_loop, name=f"spark-storm-multilang-{self.name}-monitor")
        self._monitor.daemon = True
        self._monitor.start()

    # ------------------------------------------------------------------ the child
    def _launch(self) -> None:
        s = self.settings
        proc = ShellProcess(
            s.command,
            cwd=s.cwd,
            env=s.env,
            serializer=s.serializer,
            name=self.name,
            max_message_bytes=s.max_message_bytes,
        )
        pid = proc.start(self._handshake, s.timeout_s)
        logger.info("multilang bolt %s: started %s (pid %d)", self.name, " ".join(s.command), pid)
        with self._lock:
            self._proc = proc
            self._restart_at = None
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
                if command not in handlers:
                    command_of(message, BOLT_COMMANDS)  # raises, naming what is wrong
                handler = handlers[str(command)]
                if handler is not None:
                    handler(tc, message)
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

    def _on_log(self, tc: Any, message: dict[str, Any]) -> None:
        _log_from_child(self.name, message)

    def _on_error(self, tc: Any, message: dict[str, Any]) -> None:
        error = f"multilang bolt {self.name}: the child reported: {message.get('msg', '')}"
        logger.error("%s", error)
        tc.report_error(error)

    def _on_metrics(self, tc: Any, message: dict[str, Any]) -> None:
        name = message.get("name")
        if not isinstance(name, str) or not name:
            msg = f"a metrics command needs a 'name', got {message!r:.200}"
            raise ProtocolError(msg)
        self.metrics_reported[name] = message.get("params")

    def _on_exit(self, proc: ShellProcess, reason: str) -> None:
        """Reader thread: the child is gone; fail what it held and plan a restart."""
        with self._lock:
            if proc is not self._proc:
                return
            self._proc = None  # no restart is planned until what it held has failed
            closing = self._closing.is_set()
            delay = self._backoff.next_delay(time.monotonic() - proc.started)
        proc.close(0.0)  # its writer is joined first: nothing more is registered as sent to it
        pending, self._inflight = self._inflight, {}
        tc = self._collector()
        for tup in pending.values():
            tc.fail(tup)
        self._flush(tc)
        if closing:
            logger.info("multilang bolt %s: child %s %s", self.name, proc.describe(), reason)
            return
        error = (
            f"multilang bolt {self.name}: child {proc.describe()} {reason}{proc.stderr_hint()}; "
            f"failed its {len(pending)} pending tuples; restarting it in {delay:.1f}s"
        )
        logger.error("%s", error)
        tc.report_error(error)
        with self._lock:
            if not self._closing.is_set():
                self._restart_at = time.monotonic() + delay

    # ------------------------------------------------------------------ monitor thread
    def _monitor_loop(self) -> None:
        s = self.settings
        while not self._closing.wait(min(s.heartbeat_s, 0.25) if s.heartbeat_s else 0.25):
            now = time.monotonic()
            with self._lock:
                proc, restart_at = self._proc, self._restart_at
            if proc is None:
                if restart_at is not None and now >= restart_at:
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
        self.restarts += 1
        try:
            self._launch()
        except (ConfigError, MultilangError) as exc:
            delay = self._backoff.next_delay(0.0)
            with self._lock:
                self._restart_at = time.monotonic() + delay
            error = f"multilang bolt {self.name}: restart failed: {exc}; trying again in {delay:.1f}s"
            logger.error("%s", error)
            self.collector.report_error(error)

    # ------------------------------------------------------------------ the bolt API
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


class ShellSpout(Spout):
    """Storm's ShellSpout: each task is a child process; ``next``/``ack``/``fail`` are synchronous round trips.

    The executor's thread sends a command and applies the child's emits until its
    ``sync``; a child that stays silent longer than ``topology.subprocess.timeout.secs``
    while it owes a ``sync`` is killed and started again (its trees' acks and fails are
    then not delivered to the new child, which did not emit them).
    """

    def open(self, conf: Mapping[str, Any], context: TopologyContext, collector: SpoutOutputCollector) -> None:
        super().open(conf, context, collector)
        self.name = f"{context.component_id}:{context.task_id}"
        self.settings = s = MultilangSettings(conf, f"component {context.component_id!r}")
        check_command(s.command, s.cwd, f"component {context.component_id!r}")
        self._handshake = handshake(handshake_conf(conf, context.topology_id), handshake_context(context), "")
        self._backoff = Backoff(s.backoff_min_s, s.backoff_max_s)
        self._inbox: list[Any] = []
        self._cond = threading.Condition()
        self._proc: ShellProcess | None = None
        self._incarnation = 0
        self._restart_at = 0.0
        self._dead: str | None = None
        self.restarts = 0
        self.metrics_reported: dict[str, Any] = {}
        self._launch()

    def _launch(self) -> None:
        s = self.settings
        proc = ShellProcess(
            s.command,
            cwd=s.cwd,
            env=s.env,
            serializer=s.serializer,
            name=self.name,
            max_message_bytes=s.max_message_bytes,
        )
        pid = proc.start(self._handshake, s.timeout_s)
        logger.info("multilang spout %s: started %s (pid %d)", self.name, " ".join(s.command), pid)
        self._incarnation += 1
        self._dead = None
        with self._cond:
            self._inbox.clear()
        self._proc = proc
        proc.run(None, _no_encode, self._on_messages, self._on_exit)

    def _on_messages(self, messages: list[Any]) -> None:
        with self._cond:
            self._inbox.extend(messages)
            self._cond.notify_all()

    def _on_exit(self, proc: ShellProcess, reason: str) -> None:
        with self._cond:
            if proc is self._proc:
                self._dead = reason
            self._cond.notify_all()

    def _ready(self) -> bool:
        """Whether a child runs (starting one again once its backoff passed)."""
        if self._proc is not None and self._dead is None:
            return True
        if self._proc is not None:
            self._died(self._proc, self._dead or "exited")
        if time.monotonic() < self._restart_at:
            return False
        self.restarts += 1
        try:
            self._launch()
        except (ConfigError, MultilangError) as exc:
            self._restart_at = time.monotonic() + self._backoff.next_delay(0.0)
            error = f"multilang spout {self.name}: restart failed: {exc}"
            logger.error("%s", error)
            self.collector.report_error(error)
            return False
        return True

    def _died(self, proc: ShellProcess, reason: str) -> None:
        delay = self._backoff.next_delay(time.monotonic() - proc.started)
        self._restart_at = time.monotonic() + delay
        self._proc = None
        error = (
            f"multilang spout {self.name}: child {proc.describe()} {reason}{proc.stderr_hint()}; "
            f"restarting it in {delay:.1f}s"
        )
        logger.error("%s", error)
        self.collector.report_error(error)
        proc.close(0.0)

    def _command(self, command: str, message_id: Any = "") -> None:
        if not self._ready():
            return
        proc = self._proc
        assert proc is not None
        with contextlib.suppress(OSError):  # it died: the wait below hears about it
            proc.send_now([spout_command(command, message_id)])
        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            with self._cond:
                while not self._inbox and self._dead is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(min(left, 0.5))
                messages, self._inbox = self._inbox, []
                dead = self._dead
            try:
                for i, message in enumerate(messages):
                    if self._apply(proc, message):
                        with self._cond:
                            self._inbox[:0] = messages[i + 1 :]
                        return
            except (ProtocolError, ConfigError) as exc:
                proc.kill(f"sent a command that failed: {exc}")
                self._wait_dead(proc)
                return
            if dead is not None:
                self._died(proc, dead)
                return
            if time.monotonic() >= deadline:
                proc.kill(
                    f"heartbeat timeout: no sync for {command!r} within {self.settings.timeout_s:g}s "
                    "(topology.subprocess.timeout.secs / supervisor.worker.timeout.secs)"
                )
                self._wait_dead(proc)
                return

    def _wait_dead(self, proc: ShellProcess) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._dead is not None, 5.0)
        self._died(proc, self._dead or proc.kill_reason or "was killed")

    def _apply(self, proc: ShellProcess, message: Any) -> bool:
        """Act on one message; True at ``sync``."""
        command = command_of(message, SPOUT_COMMANDS)
        if command == "sync":
            return True
        if command == "emit":
            emit = parse_emit(message)
            message_id = None if emit.message_id is None else (self._incarnation, emit.message_id)
            if emit.task is not None:
                self.collector.emit_direct(emit.task, emit.values, emit.stream, message_id)
            else:
                tasks = self.collector.emit(emit.values, emit.stream, message_id)
                if emit.need_task_ids:
                    proc.send_now([tasks])
        elif command == "log":
            _log_from_child(self.name, message)
        elif command == "error":
            error = f"multilang spout {self.name}: the child reported: {message.get('msg', '')}"
            logger.error("%s", error)
            self.collector.report_error(error)
        elif command == "metrics":
            self.metrics_reported[str(message.get("name"))] = message.get("params")
        return False

    # ------------------------------------------------------------------ the spout API
    def next_tuple(self) -> None:
        self._command("next")

    def ack(self, message_id: Any) -> None:
        incarnation, child_id = message_id
        if incarnation == self._incarnation:
            self._command("ack", child_id)

    def fail(self, message_id: Any) -> None:
        incarnation, child_id = message_id
        if incarnation == self._incarnation:
            self._command("fail", child_id)

    def activate(self) -> None:
        self._command("activate")

    def deactivate(self) -> None:
        self._command("deactivate")

    def close(self) -> None:
        if self._proc is not None:
            self._proc.close(self.settings.shutdown_s)
            self._proc = None


def _no_encode(control: list[Any], tuples: list[Any]) -> bytes:  # pragma: no cover - spouts run no writer
    return b""
