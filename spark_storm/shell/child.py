"""The child process of one multilang task, supervised: started, heard from, restarted after it dies.

:class:`ShellBolt` and :class:`ShellSpout` each run one child per task and differ only in
how they talk to it (a bolt streams tuples through an outbox; a spout makes one round trip
per ``next``/``ack``/``fail``).  What a child's life takes is here, once: the settings and
the handshake, the launch, the ``log``/``error``/``metrics`` commands every component may
send, and the restarts after ``topology.multilang.restart.backoff.*`` (doubling up to the
max, back to the min once a child lived that long), each death and failed restart logged
and reported with the command and the child's last stderr line.

Threads: the owner (the task's executor thread, or its own monitor thread) calls
:meth:`ShellChild.start`, :meth:`ShellChild.died` and :meth:`ShellChild.restart`; the
reader thread of the process calls :meth:`ShellChild.on_common` for the messages it
decodes (only ``metrics_reported``, a dict its owner reads, changes there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from spark_storm.backoff import Backoff
from spark_storm.errors import ConfigError, MultilangError
from spark_storm.multilang.process import ShellProcess, check_command
from spark_storm.multilang.protocol import handshake
from spark_storm.multilang.serializers import ProtocolError
from spark_storm.shell.settings import MultilangSettings, handshake_conf, handshake_context, log_from_child
from spark_storm.worker.bolt import TopologyContext

__all__ = ["ShellChild"]

logger = logging.getLogger(__name__)


class ShellChild:
    """The child of task ``context`` of a multilang ``kind`` ("bolt" or "spout").

    Parameters
    ----------
    kind : str
        "bolt" or "spout", in every message about the child.
    conf : Mapping
        The component's configuration (its ``topology.multilang.*`` keys are read once).
    context : TopologyContext
    report_error : callable
        The component's collector's ``report_error``: deaths and failed restarts go there too.

    Raises
    ------
    ConfigError
        A bad setting, or a command that cannot start (checked before any child runs).
    """

    def __init__(
        self, kind: str, conf: Mapping[str, Any], context: TopologyContext, report_error: Callable[[str], None]
    ) -> None:
        where = f"component {context.component_id!r}"
        self.kind = kind
        self.name = f"{context.component_id}:{context.task_id}"
        self.settings = s = MultilangSettings(conf, where)
        check_command(s.command, s.cwd, where)
        self._handshake = handshake(handshake_conf(conf, context.topology_id), handshake_context(context), "")
        self._backoff = Backoff(round(s.backoff_min_s * 1000), round(s.backoff_max_s * 1000))
        self._attempt = 0
        self._report_error = report_error
        #: When to start the next child (None: none is planned).
        self.restart_at: float | None = None
        self.restarts = 0
        self.metrics_reported: dict[str, Any] = {}

    def start(self) -> ShellProcess:
        """Start a child and handshake with it; the owner records it, then calls its ``run``.

        Raises
        ------
        ConfigError, MultilangError
            It could not start, or failed the handshake (its stderr is quoted).
        """
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
        logger.info("multilang %s %s: started %s (pid %d)", self.kind, self.name, " ".join(s.command), pid)
        self.restart_at = None
        return proc

    def _delay_s(self, lived_s: float) -> float:
        if lived_s >= self.settings.backoff_max_s:
            self._attempt = 0  # it lived long enough: back to the shortest wait
        delay = self._backoff.delay_ms(self._attempt) / 1000
        self._attempt += 1
        return delay

    def died(self, proc: ShellProcess, reason: str, what: str = "", *, report: bool = True) -> float:
        """Note that ``proc`` is gone (``reason``) and plan the next start; return the delay in seconds.

        ``what`` adds what its death did (e.g. "; failed its 3 pending tuples").  With
        ``report`` the death is logged at ERROR and reported; a child stopped on purpose is not.
        """
        delay = self._delay_s(time.monotonic() - proc.started)
        self.restart_at = time.monotonic() + delay
        if report:
            self._error(f"child {proc.describe()} {reason}{proc.stderr_hint()}{what}; restarting it in {delay:.1f}s")
        return delay

    def due(self) -> bool:
        """Whether a planned restart's time has come."""
        return self.restart_at is not None and time.monotonic() >= self.restart_at

    def restart(self) -> ShellProcess | None:
        """Start the next child; None (another try planned, the error reported) if it cannot start."""
        self.restarts += 1
        try:
            return self.start()
        except (ConfigError, MultilangError) as exc:
            delay = self._delay_s(0.0)
            self.restart_at = time.monotonic() + delay
            self._error(f"restart failed: {exc}; trying again in {delay:.1f}s")
            return None

    def on_common(self, command: str, message: Mapping[str, Any], report_error: Callable[[str], None]) -> bool:
        """Handle a ``log``, ``error`` or ``metrics`` command (True), or say it is another (False)."""
        if command == "log":
            log_from_child(self.name, message)
        elif command == "error":
            error = f"multilang {self.kind} {self.name}: the child reported: {message.get('msg', '')}"
            logger.error("%s", error)
            report_error(error)
        elif command == "metrics":
            name = message.get("name")
            if not isinstance(name, str) or not name:
                msg = f"a metrics command needs a 'name', got {message!r:.200}"
                raise ProtocolError(msg)
            self.metrics_reported[name] = message.get("params")
        else:
            return False
        return True

    def _error(self, text: str) -> None:
        error = f"multilang {self.kind} {self.name}: {text}"
        logger.error("%s", error)
        self._report_error(error)
