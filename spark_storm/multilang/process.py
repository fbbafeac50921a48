"""One multilang child process: launch, handshake, batched I/O threads, stderr, kill (Storm's ShellProcess).

A :class:`ShellProcess` is one incarnation of a child.  After :meth:`ShellProcess.start`
(spawn, handshake, pid) :meth:`ShellProcess.run` starts three threads:

* the *reader* reads stdout in chunks of up to 1 MiB (``os.read`` releases the GIL while
  it waits), decodes every complete message of a chunk at once and hands them to the
  owner's ``on_messages`` in one call;
* the *writer* takes everything queued in the owner's :class:`Outbox` (control messages
  first, then tuples), encodes it with one call and writes it with one ``write``;
* the *stderr* thread logs the child's stderr line by line and keeps the last line, which
  every error about the child quotes.

When the child exits, closes stdout, writes garbage or is killed (a heartbeat timeout),
the reader calls ``on_exit(process, reason)`` once.  Restarting is the owner's decision
(spark_storm.shell's ``ShellChild``).  Nothing here knows about bolts, spouts or workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from spark_storm.errors import ConfigError, MultilangError
from spark_storm.multilang.protocol import pid_of
from spark_storm.multilang.serializers import MultilangSerializer, ProtocolError

__all__ = ["Outbox", "ShellProcess", "check_command"]

logger = logging.getLogger(__name__)
child_logger = logging.getLogger("spark_storm.multilang.child")

_CHUNK: Final = 1 << 20


def check_command(command: Sequence[str], cwd: str | None, where: str) -> None:
    """Check that ``command`` can be started from ``cwd`` (clear error at start, not a dying child later).

    Raises
    ------
    ConfigError
        Empty command, missing directory, or an executable that is neither on PATH nor a file.
    """
    if not command or not all(isinstance(c, str) and c for c in command):
        msg = f"{where}: the multilang command must be a non-empty list of strings, got {list(command)!r}"
        raise ConfigError(msg)
    if cwd is not None and not os.path.isdir(cwd):
        msg = f"{where}: the child's directory {cwd!r} (topology.multilang.dir) does not exist"
        raise ConfigError(msg)
    exe = command[0]
    if os.sep in exe:
        path = exe if os.path.isabs(exe) else os.path.join(cwd or os.getcwd(), exe)
        found = os.path.isfile(path) and os.access(path, os.X_OK)
    else:
        found = shutil.which(exe) is not None
    if not found:
        msg = (
            f"{where}: multilang command {' '.join(command)!r} cannot start: {exe!r} is not "
            f"{'an executable file' if os.sep in exe else 'on PATH'} (looked from {cwd or os.getcwd()!r}); "
            "fix the command (FluxShellBolt/FluxShellSpout constructorArgs, or topology.multilang.command) "
            "or install it"
        )
        raise ConfigError(msg)


class Outbox:
    """What waits for a child's writer thread: control messages, then tuples (bounded: back-pressure).

    ``put_tuple`` blocks while ``max_tuples`` are queued, so a child that stops reading
    holds its executor back (and through it, the senders), as Storm's
    ``topology.shellbolt.max.pending`` does.
    """

    def __init__(self, max_tuples: int) -> None:
        self.max_tuples = max(1, max_tuples)
        self._cond = threading.Condition()
        self._control: list[Any] = []
        self._tuples: list[Any] = []
        self._closed = False

    def __len__(self) -> int:
        return len(self._tuples) + len(self._control)

    def put_control(self, message: Any) -> None:
        """Queue a control message (task ids, a heartbeat); never blocks."""
        with self._cond:
            self._control.append(message)
            self._cond.notify_all()

    def put_tuple(self, item: Any) -> bool:
        """Queue a tuple; False when the outbox was closed."""
        with self._cond:
            while len(self._tuples) >= self.max_tuples and not self._closed:
                self._cond.wait(0.5)
            if self._closed:
                return False
            self._tuples.append(item)
            if len(self._tuples) == 1:
                self._cond.notify_all()
            return True

    def take(self, stop: threading.Event, wait_s: float = 0.5) -> tuple[list[Any], list[Any]] | None:
        """Return (control, tuples) queued so far, waiting for some; None once ``stop`` is set."""
        with self._cond:
            while not (self._control or self._tuples):
                if stop.is_set() or self._closed:
                    return None
                self._cond.wait(wait_s)
            if stop.is_set():
                return None
            control, self._control = self._control, []
            tuples, self._tuples = self._tuples, []
            self._cond.notify_all()  # room for blocked put_tuple calls
            return control, tuples

    def drain_tuples(self) -> list[Any]:
        """Remove and return the queued tuples (a shutdown that gives up on them)."""
        with self._cond:
            tuples, self._tuples = self._tuples, []
            self._cond.notify_all()
            return tuples

    def wake(self) -> None:
        """Wake a writer waiting in :meth:`take` (to see its stop flag)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse further tuples and wake everyone waiting."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class ShellProcess:
    """One incarnation of a multilang child.

    Parameters
    ----------
    command : sequence of str
        Program and arguments (no shell).
    cwd : str, optional
        The child's working directory (Storm: the topology's resources directory).
    env : mapping, optional
        Extra environment (``PATH`` is appended to the worker's, as Storm's ShellProcess does).
    serializer : MultilangSerializer
    name : str
        What log lines call it (``component:task``).
    max_message_bytes : int
        Largest message accepted from the child.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        serializer: MultilangSerializer,
        name: str,
        max_message_bytes: int,
    ) -> None:
        self.command = list(command)
        self.cwd = cwd
        self.serializer = serializer
        self.name = name
        self.pid: int | None = None
        self.started = 0.0
        self.last_heard = 0.0
        self.last_stderr = ""
        self.kill_reason: str | None = None
        self.exit_reason: str | None = None
        self._env = dict(os.environ)
        for key, value in (env or {}).items():
            appended = key == "PATH" and "PATH" in self._env
            self._env[key] = f"{self._env['PATH']}{os.pathsep}{value}" if appended else value
        self._decoder = serializer.decoder(max_message_bytes)
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid_dir: str | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._early: list[Any] = []  # messages that came with the pid
        self._exit_once = threading.Lock()

    # ------------------------------------------------------------------ description
    def describe(self) -> str:
        """Return "`command` (pid N)" for log and error lines."""
        pid = f" (pid {self.pid})" if self.pid else ""
        return f"`{' '.join(self.command)}`{pid}"

    def stderr_hint(self) -> str:
        """Return "; its last stderr line: ..." (or that it wrote none)."""
        if self.last_stderr:
            return f"; its last stderr line: {self.last_stderr!r}"
        return "; it wrote nothing on stderr"

    @property
    def returncode(self) -> int | None:
        """The child's exit code, None while it runs."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def alive(self) -> bool:
        """Whether the child runs and nothing reported it gone."""
        return self._proc is not None and self._proc.poll() is None and self.exit_reason is None

    # ------------------------------------------------------------------ start
    def start(self, handshake: Mapping[str, Any], timeout_s: float) -> int:
        """Spawn the child, send the handshake and wait for its pid.

        Raises
        ------
        ConfigError
            The command cannot be started (not found, not executable).
        MultilangError
            The child exited, stayed silent for ``timeout_s`` or answered something else
            (the message names the command and quotes its last stderr line).
        """
        self._pid_dir = tempfile.mkdtemp(prefix="spark-storm-multilang-")
        message = {**handshake, "pidDir": self._pid_dir}
        try:
            self._proc = subprocess.Popen(  # the topology's own command, no shell
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.cwd,
                env=self._env,
                bufsize=0,
                close_fds=True,
            )
        except OSError as exc:
            self._cleanup_dir()
            msg = f"{self.name}: cannot start multilang command {' '.join(self.command)!r}: {exc.strerror or exc}"
            raise ConfigError(msg) from exc
        self.started = self.last_heard = time.monotonic()
        self._spawn(self._stderr_loop, "stderr")
        assert self._proc.stdout is not None
        with contextlib.suppress(OSError):  # it died already: the read below says how
            self._write_all(self.serializer.encode([message]))
        deadline = time.monotonic() + timeout_s
        fd = self._proc.stdout.fileno()
        messages: list[Any] = []
        try:
            while not messages:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill("no answer to the handshake")
                    msg = (
                        f"{self.name}: multilang child {self.describe()} did not answer the handshake within "
                        f"{timeout_s:g}s (topology.subprocess.timeout.secs); does it speak "
                        f"{self.serializer.name} (topology.multilang.serializer)?{self._stderr_after_exit()}"
                    )
                    raise MultilangError(msg)
                ready, _, _ = select.select([fd], [], [], min(left, 0.5))
                if not ready:
                    continue
                data = os.read(fd, _CHUNK)
                if not data:
                    code = self._wait_exit(2.0)
                    msg = (
                        f"{self.name}: multilang child {self.describe()} exited with code {code} during the "
                        f"handshake{self._stderr_after_exit()}"
                    )
                    raise MultilangError(msg)
                messages = self._decoder.feed(data)
            self.pid = pid_of(messages[0])
        except ProtocolError as exc:
            self.kill("garbage in the handshake")
            msg = (
                f"{self.name}: multilang child {self.describe()} answered the handshake with something else: {exc}; "
                f"does it speak {self.serializer.name} (topology.multilang.serializer)?{self._stderr_after_exit()}"
            )
            raise MultilangError(msg) from None
        except MultilangError:
            self.close(0.5)
            raise
        self._early = messages[1:]
        self.last_heard = time.monotonic()
        return self.pid

    def _stderr_after_exit(self) -> str:
        for t in self._threads:
            if t.name.endswith("stderr"):
                t.join(1.0)
        return self.stderr_hint()

    def _wait_exit(self, timeout_s: float) -> int | None:
        assert self._proc is not None
        try:
            return self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    # ------------------------------------------------------------------ running
    def run(
        self,
        outbox: Outbox | None,
        encode: Callable[[list[Any], list[Any]], bytes],
        on_messages: Callable[[list[Any]], None],
        on_exit: Callable[[ShellProcess, str], None],
    ) -> None:
        """Start the reader and writer threads.

        ``encode(control, tuples)`` turns what the writer took from ``outbox`` into bytes
        (the owner registers the tuples as sent there); ``on_messages`` gets every
        message the child wrote, a chunk at a time; ``on_exit`` is called once when the
        child is gone, with the reason.  Without an ``outbox`` no writer runs: the owner
        writes with :meth:`send_now` (a spout's synchronous commands).
        """
        self._spawn(lambda: self._read_loop(on_messages, on_exit), "reader")
        if outbox is not None:
            box = outbox
            self._spawn(lambda: self._write_loop(box, encode), "writer")

    def _spawn(self, target: Callable[[], None], what: str) -> None:
        t = threading.Thread(target=target, name=f"spark-storm-multilang-{self.name}-{what}", daemon=True)
        t.start()
        self._threads.append(t)

    def _read_loop(
        self, on_messages: Callable[[list[Any]], None], on_exit: Callable[[ShellProcess, str], None]
    ) -> None:
        assert self._proc is not None
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        reason = ""
        try:
            if self._early:
                early, self._early = self._early, []
                on_messages(early)
            while True:
                try:
                    data = os.read(fd, _CHUNK)
                except OSError as exc:
                    reason = f"its stdout failed: {exc.strerror or exc}"
                    break
                if not data:
                    break
                self.last_heard = time.monotonic()
                messages = self._decoder.feed(data)
                if messages:
                    on_messages(messages)
        except ProtocolError as exc:
            reason = f"wrote something that is not a multilang message: {exc}"
            self.kill(reason)
        except Exception as exc:  # an emit the topology refuses, an unknown id: the child broke the contract
            reason = f"sent a command that failed: {type(exc).__name__}: {exc}"
            logger.debug("%s: command from the child failed", self.name, exc_info=True)
            self.kill(reason)
        if not reason:
            code = self._wait_exit(1.0)
            if self.kill_reason is not None:
                reason = f"was killed: {self.kill_reason}"
            elif code is None:
                reason = "closed its stdout"
                self.kill(reason)
            else:
                reason = f"exited with code {code}"
        self._stderr_after_exit()
        self.exit_reason = reason
        self._stop.set()
        with self._exit_once:
            on_exit(self, reason)

    def _write_loop(self, outbox: Outbox, encode: Callable[[list[Any], list[Any]], bytes]) -> None:
        while True:
            batch = outbox.take(self._stop)
            if batch is None:
                return
            data = encode(*batch)
            try:
                self._write_all(data)
            except OSError as exc:
                logger.debug("%s: writing to the child failed: %s", self.name, exc)
                return  # the reader sees the child go and reports why

    def _write_all(self, data: bytes) -> None:
        assert self._proc is not None
        assert self._proc.stdin is not None
        fd = self._proc.stdin.fileno()
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def send_now(self, messages: Sequence[Any]) -> None:
        """Write ``messages`` from the calling thread (only when no writer thread runs: spouts)."""
        self._write_all(self.serializer.encode(messages))

    def _stderr_loop(self) -> None:
        assert self._proc is not None
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self.last_stderr = line[:500]
                child_logger.info("%s %s: %s", self.name, self.describe(), line)

    # ------------------------------------------------------------------ stopping
    def kill(self, reason: str) -> None:
        """Kill the child now (SIGKILL); ``reason`` is what ``on_exit`` will say."""
        if self.kill_reason is None:
            self.kill_reason = reason
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.kill()

    def close(self, grace_s: float) -> None:
        """Close the child's stdin (EOF: multilang children exit), kill it after ``grace_s``, join the threads."""
        self._stop.set()
        proc = self._proc
        if proc is not None:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill("it did not exit after its stdin closed")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5.0)
        current = threading.current_thread()
        for t in self._threads:
            if t is not current:
                t.join(2.0)
        if proc is not None:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        self._cleanup_dir()

    def _cleanup_dir(self) -> None:
        if self._pid_dir is not None:
            shutil.rmtree(self._pid_dir, ignore_errors=True)
            self._pid_dir = None
