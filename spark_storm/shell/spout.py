"""Storm's ShellSpout: each task a child process; ``next``/``ack``/``fail`` are synchronous round trips.

Its child is supervised as a :class:`~spark_storm.shell.bolt.ShellBolt`'s is
(:class:`~spark_storm.shell.child.ShellChild`): a child that dies or stays silent past
``topology.subprocess.timeout.secs`` is started again after the restart backoff, from the
executor's thread, at the next command.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from typing import Any

from spark_storm.errors import ConfigError
from spark_storm.multilang.process import ShellProcess
from spark_storm.multilang.protocol import SPOUT_COMMANDS, command_of, parse_emit, spout_command
from spark_storm.multilang.serializers import ProtocolError
from spark_storm.shell.child import ShellChild
from spark_storm.worker.bolt import TopologyContext
from spark_storm.worker.spout import Spout, SpoutOutputCollector

__all__ = ["ShellSpout"]


class ShellSpout(Spout):
    """Storm's ShellSpout: each task is a child process; ``next``/``ack``/``fail`` are synchronous round trips.

    The executor's thread sends a command and applies the child's emits until its
    ``sync``; a child that stays silent longer than ``topology.subprocess.timeout.secs``
    while it owes a ``sync`` is killed and started again (its trees' acks and fails are
    then not delivered to the new child, which did not emit them).
    """

    def open(self, conf: Mapping[str, Any], context: TopologyContext, collector: SpoutOutputCollector) -> None:
        super().open(conf, context, collector)
        self._child = ShellChild("spout", conf, context, collector.report_error)
        self.name = self._child.name
        self.settings = self._child.settings
        self._inbox: list[Any] = []
        self._cond = threading.Condition()
        self._proc: ShellProcess | None = None
        self._incarnation = 0
        self._dead: str | None = None
        self._run(self._child.start())

    @property
    def restarts(self) -> int:
        """Children started again after one died."""
        return self._child.restarts

    @property
    def metrics_reported(self) -> dict[str, Any]:
        """The child's ``metrics`` commands, by name."""
        return self._child.metrics_reported

    def _run(self, proc: ShellProcess) -> None:
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
        if not self._child.due():
            return False
        proc = self._child.restart()
        if proc is None:
            return False
        self._run(proc)
        return True

    def _died(self, proc: ShellProcess, reason: str) -> None:
        self._proc = None
        self._child.died(proc, reason)
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
        else:
            self._child.on_common(command, message, self.collector.report_error)
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
