"""One ZooKeeper session: its address, its lifecycle, the retrying call, raw reads, writes and watches.

:class:`ZooKeeperSession` owns kazoo's client; nothing else in spark-storm touches it.
The session survives a lost session: kazoo reconnects, kazoo's watch recipes re-arm
themselves, and the ephemeral nodes registered here are created again on the new session.
Reads and writes retry through a connection loss (``storm.zookeeper.retry.*``) and then
raise :class:`~spark_storm.errors.ZooKeeperUnavailableError`; a call is never queued on a
dead connection (kazoo would block it until ZooKeeper came back).

Watch callbacks run on the ZooKeeper client's event thread: keep them short (set an event,
hand work to a thread of your own) and do not block in them.

:class:`~spark_storm.cluster.state.ClusterState` builds the cluster's typed operations on
this session; :meth:`ZooKeeperSession.read` and :meth:`ZooKeeperSession.children` are the
public reads for anything else.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import ConnectionClosedError as KazooClosedError
from kazoo.exceptions import (
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.election import Election
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from spark_storm.config import Config
from spark_storm.errors import ClusterError, ConfigError, ZooKeeperUnavailableError

__all__ = ["Watch", "Znode", "ZooKeeperAddress", "ZooKeeperSession"]

logger = logging.getLogger(__name__)

_CHROOT = re.compile(r"^(/[A-Za-z0-9._-]+)+$")


# ------------------------------------------------------------------ address
@dataclass(frozen=True)
class ZooKeeperAddress:
    """Where the cluster's state lives: ZooKeeper servers and the root znode.

    Attributes
    ----------
    hosts : str
        ``host:port,host:port``.
    root : str
        The chroot every path lives under (``/storm``), or ``""`` for the top.
    """

    hosts: str
    root: str

    def __str__(self) -> str:
        return self.hosts + self.root

    @property
    def spec(self) -> str:
        """``HOST:PORT[,...]/root`` that :meth:`parse` reads back to this address (``/`` for the top)."""
        return self.hosts + (self.root or "/")

    @classmethod
    def parse(cls, spec: str | None, conf: Mapping[str, Any] | None = None) -> ZooKeeperAddress:
        """Parse ``HOST:PORT[,HOST:PORT][/chroot]``; None (or parts left out) come from ``conf``.

        A host without a port gets ``storm.zookeeper.port``; no chroot means
        ``storm.zookeeper.root``; a lone ``/`` means the top of the tree.

        Raises
        ------
        ConfigError
            The value is not of that form (the message names it and shows an example).
        """
        config = Config.of(conf)
        default_port = config.get_int("storm.zookeeper.port", minimum=1)
        example = "e.g. 127.0.0.1:2181 or zk1:2181,zk2:2181/storm"
        if spec is None:
            servers = config["storm.zookeeper.servers"]
            if isinstance(servers, str):
                servers = [servers]
            if not isinstance(servers, list) or not servers or not all(isinstance(s, str) for s in servers):
                msg = f"config key 'storm.zookeeper.servers' must be a list of hosts, got {servers!r}"
                raise ConfigError(msg)
            hosts_part, root = ",".join(servers), str(config["storm.zookeeper.root"] or "")
        else:
            text = spec.strip()
            cut = text.find("/")
            hosts_part = text if cut < 0 else text[:cut]
            root = str(config["storm.zookeeper.root"] or "") if cut < 0 else text[cut:]
        hosts = []
        for part in hosts_part.split(","):
            host, sep, port_text = part.strip().rpartition(":")
            if not sep:
                host, port_text = part.strip(), str(default_port)
            if not host or not port_text.isdigit() or not 0 < int(port_text) <= 65535:
                msg = f"ZooKeeper address {spec or hosts_part!r} is not HOST:PORT[,HOST:PORT][/chroot] ({example})"
                raise ConfigError(msg)
            hosts.append(f"{host}:{int(port_text)}")
        root = root.rstrip("/")
        if root and not _CHROOT.match(root):
            msg = f"ZooKeeper chroot {root!r} in {spec!r} must look like /name or /a/b ({example})"
            raise ConfigError(msg)
        return cls(",".join(hosts), root)


# ------------------------------------------------------------------ what reads return
@dataclass(frozen=True)
class Znode:
    """A znode's data and the parts of its stat spark-storm uses.

    Attributes
    ----------
    data : bytes
    version : int
        The data version: it changes with every write (liveness is judged by it, on the
        reader's own clock, never by another host's timestamps).
    created, modified : float
        ZooKeeper's ``ctime`` and ``mtime``, in seconds (the server's clock, for people).
    ephemeral_owner : int
        The session id holding an ephemeral node, 0 for a persistent one.
    """

    data: bytes
    version: int
    created: float
    modified: float
    ephemeral_owner: int


class Watch(Protocol):
    """A registered watch: ``cancel()`` stops further callbacks."""

    def cancel(self) -> None:
        """Stop calling the callback (idempotent)."""


class _Cancellable:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _safe(callback: Callable[..., None], *args: Any, what: str) -> None:
    try:
        callback(*args)
    except Exception as exc:  # a watch callback raising must not end kazoo's watch
        logger.exception("%s: callback %r failed: %r", what, callback, exc)


# ------------------------------------------------------------------ the session
class ZooKeeperSession:
    """One ZooKeeper session, reconnected forever, with a bounded retry per call.

    Parameters
    ----------
    zookeeper : str or ZooKeeperAddress, optional
        ``HOST:PORT[,HOST:PORT][/chroot]``; default from ``conf`` (``storm.zookeeper.*``).
    conf : Mapping, optional
        Configuration (defaults fill the rest).

    Paths given to the methods are absolute inside the chroot: build them with :meth:`path`.
    """

    def __init__(self, zookeeper: str | ZooKeeperAddress | None = None, conf: Mapping[str, Any] | None = None) -> None:
        self.conf = Config.of(conf)
        self.address = (
            zookeeper if isinstance(zookeeper, ZooKeeperAddress) else ZooKeeperAddress.parse(zookeeper, self.conf)
        )
        self.timeout_s = self.conf.get_int("storm.zookeeper.session.timeout", minimum=1) / 1000
        self._connect_timeout = self.conf.get_int("storm.zookeeper.connection.timeout", minimum=1) / 1000
        retry_times = self.conf.get_int("storm.zookeeper.retry.times", minimum=0)
        retry_delay = self.conf.get_int("storm.zookeeper.retry.interval", minimum=1) / 1000
        retry_ceiling = self.conf.get_int("storm.zookeeper.retry.intervalceiling.millis", minimum=1) / 1000
        self._retry_times, self._retry_delay, self._retry_ceiling = retry_times, retry_delay, retry_ceiling
        self._client = KazooClient(
            hosts=self.address.hosts,
            timeout=self.timeout_s,
            # Reconnect forever: a process in cluster mode waits out a ZooKeeper outage.
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 2.0},
            command_retry={"max_tries": retry_times + 1, "delay": retry_delay, "max_delay": retry_ceiling},
        )
        self._lock = threading.Lock()
        self._ephemeral: dict[str, bytes] = {}  # path -> data, re-created after a lost session
        self._listeners: list[Callable[[str], None]] = []
        self._restore_needed = False
        self._closed = False
        self.session_losses = 0
        self._client.add_listener(self._on_state)

    # -- lifecycle ------------------------------------------------------------------
    def start(self, timeout: float | None = None) -> ZooKeeperSession:
        """Connect, within ``storm.zookeeper.connection.timeout`` unless ``timeout`` is given.

        Raises
        ------
        ZooKeeperUnavailableError
            No ZooKeeper answered in time (the message names the address and the fix).
        """
        wait = self._connect_timeout if timeout is None else timeout
        try:
            self._client.start(timeout=wait)
        except KazooTimeoutError as exc:
            msg = (
                f"cannot connect to ZooKeeper at {self.address.hosts} within {wait:.0f}s: start it "
                "(`spark-storm zookeeper start`) or fix --zookeeper / storm.zookeeper.servers"
            )
            raise ZooKeeperUnavailableError(msg) from exc
        logger.info("connected to ZooKeeper %s (session timeout %.1fs)", self.address, self.timeout_s)
        return self

    def close(self) -> None:
        """Delete this process's ephemeral nodes (by closing the session) and disconnect; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._ephemeral.clear()
        try:
            self._client.stop()
        finally:
            self._client.close()

    @property
    def connected(self) -> bool:
        """Whether the session is connected right now."""
        return bool(self._client.connected)

    def wait_connected(self, timeout: float) -> bool:
        """Wait until the session is connected; False after ``timeout`` s (at once once closed)."""
        deadline = time.monotonic() + timeout
        while not self._client.connected:
            if time.monotonic() > deadline or self._closed:
                return False
            time.sleep(0.05)
        return True

    def add_state_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener("connected" | "suspended" | "lost")`` on session changes (event thread)."""
        self._listeners.append(listener)

    def session_id(self) -> int | None:
        """Return the session id (it changes after a lost session), or None when not connected."""
        cid = self._client.client_id
        return None if cid is None else int(cid[0])

    def session_handle(self) -> tuple[int, bytes] | None:
        """Return ``(session id, password)``: what another client needs to take this session over.

        Tests expire a session this way, as ZooKeeper's own tests and Curator's ``KillSession`` do.
        """
        cid = self._client.client_id
        return None if cid is None else (int(cid[0]), bytes(cid[1]))

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: no ZooKeeper calls here.
        if self._closed:
            return
        if state == KazooState.LOST:
            self.session_losses += 1
            self._restore_needed = True
            logger.warning("ZooKeeper session lost (%s); reconnecting with a new session", self.address)
            name = "lost"
        elif state == KazooState.SUSPENDED:
            logger.warning("ZooKeeper connection suspended (%s); retrying", self.address)
            name = "suspended"
        else:
            logger.info("ZooKeeper connected (%s)", self.address)
            name = "connected"
            if self._restore_needed and not self._closed:
                self._restore_needed = False
                self._client.handler.spawn(self._restore_ephemerals)
        for listener in list(self._listeners):
            try:
                listener(name)
            except Exception as exc:  # one failing listener must not starve the others
                logger.exception("ZooKeeper state listener %r failed on %r: %r", listener, name, exc)

    # -- ephemeral nodes --------------------------------------------------------------
    def register_ephemeral(self, path: str, data: bytes) -> None:
        """Create an ephemeral node, and create it again on every new session until unregistered.

        Raises
        ------
        ClusterError
            Another live session holds the node (another process registered the same id).
        """
        with self._lock:
            self._ephemeral[path] = data
        self._create_ephemeral(path, data)

    def unregister_ephemeral(self, path: str) -> None:
        """Delete an ephemeral node this session registered (gone already is fine)."""
        with self._lock:
            self._ephemeral.pop(path, None)
        with contextlib.suppress(NoNodeError):
            self.call(f"delete {path}", "delete", path)

    def _restore_ephemerals(self) -> None:
        with self._lock:
            nodes = dict(self._ephemeral)
        for path, data in nodes.items():
            try:
                self._create_ephemeral(path, data)
                logger.info("re-registered %s after a lost ZooKeeper session", path)
            except (ZooKeeperUnavailableError, KazooException) as exc:
                logger.warning("could not re-register %s yet (%r); will retry on the next connection", path, exc)
                self._restore_needed = True

    def _create_ephemeral(self, path: str, data: bytes) -> None:
        try:
            self.call(f"create {path}", "create", path, data, ephemeral=True, makepath=True)
        except NodeExistsError:
            _, stat = self.call(f"read {path}", "get", path)
            if stat.ephemeralOwner != self.session_id():
                msg = (
                    f"znode {path} is held by another live ZooKeeper session (another process with the same id); "
                    "stop it or use another id"
                )
                raise ClusterError(msg) from None
            self.call(f"write {path}", "set", path, data)

    # -- the retrying call ----------------------------------------------------------
    def path(self, *parts: str) -> str:
        """Return the absolute path of ``parts`` under this session's root (``/storm/assignments/wc``)."""
        return self.address.root + "/".join(("", *(p.strip("/") for p in parts)))

    def call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run kazoo's ``<method>_async(*args, **kwargs)`` with the retry budget and return its result.

        Each attempt is made only while connected and waits at most the session timeout;
        between attempts it waits (with backoff, ``storm.zookeeper.retry.*``) for the
        connection to come back.  ZooKeeper's answers (``NoNodeError``, ``NodeExistsError``,
        ``BadVersionError``...) are raised as kazoo raises them.

        Raises
        ------
        ZooKeeperUnavailableError
            No answer within the retry budget, or the session is closed (``what`` is in the message).
        """
        call = getattr(self._client, f"{method}_async")
        delay, last = self._retry_delay, "not connected"
        for attempt in range(self._retry_times + 1):
            if self._client.connected:
                try:
                    return call(*args, **kwargs).get(timeout=self.timeout_s)
                except (ConnectionLoss, SessionExpiredError, KazooTimeoutError) as exc:
                    last = type(exc).__name__
                except KazooClosedError as exc:
                    raise self._unavailable(what, "client closed") from exc
            if attempt < self._retry_times:
                self.wait_connected(delay)
                delay = min(delay * 2, self._retry_ceiling)
        raise self._unavailable(what, last)

    def _unavailable(self, what: str, reason: str) -> ZooKeeperUnavailableError:
        msg = (
            f"ZooKeeper at {self.address} did not answer ({what}: {reason}); check that it runs "
            "(`spark-storm zookeeper status`) and is reachable, or raise storm.zookeeper.retry.times"
        )
        return ZooKeeperUnavailableError(msg)

    # -- reads and writes -------------------------------------------------------------
    def read(self, path: str) -> Znode | None:
        """Return the znode at ``path``, or None when there is none.

        Raises
        ------
        ZooKeeperUnavailableError
            ZooKeeper did not answer within the retry budget.
        """
        try:
            data, stat = self.call(f"read {path}", "get", path)
        except NoNodeError:
            return None
        return Znode(bytes(data or b""), stat.version, stat.ctime / 1000, stat.mtime / 1000, stat.ephemeralOwner)

    def children(self, path: str) -> list[str]:
        """Return the names of ``path``'s children, sorted ([] when ``path`` does not exist)."""
        try:
            return sorted(self.call(f"list {path}", "get_children", path))
        except NoNodeError:
            return []

    def ensure_path(self, path: str) -> None:
        """Create ``path`` and its parents where missing (empty data)."""
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            node = "/" + "/".join(parts[:i])
            with contextlib.suppress(NodeExistsError):
                self.call(f"create {node}", "create", node, b"")

    def delete_tree(self, path: str) -> None:
        """Delete ``path`` and everything under it (gone already is fine)."""
        for child in self.children(path):
            self.delete_tree(f"{path}/{child}")
        # NotEmpty: a child was written meanwhile; the next pass removes it.
        with contextlib.suppress(NoNodeError, NotEmptyError):
            self.call(f"delete {path}", "delete", path)

    def put_nowait(self, path: str, data: bytes, on_done: Callable[[str | None], None]) -> bool:
        """Write ``data`` to ``path`` (creating it and its parents) without waiting for ZooKeeper.

        ``on_done(None)`` once written, ``on_done(reason)`` if the write failed; both on the
        ZooKeeper event thread.  Returns False, calling nothing, when the session is not
        connected right now (nothing is queued: a caller that writes periodically sends
        a fresher value next time).
        """
        if not self._client.connected:
            return False

        def created(result: Any) -> None:
            try:
                result.get_nowait()
                on_done(None)
            except NodeExistsError:
                self._client.set_async(path, data).rawlink(written)
            except Exception as exc:  # reported to the caller, who decides what to log
                on_done(type(exc).__name__)

        def written(result: Any) -> None:
            try:
                result.get_nowait()
                on_done(None)
            except NoNodeError:
                self._client.create_async(path, data, makepath=True).rawlink(created)
            except Exception as exc:  # reported to the caller, who decides what to log
                on_done(type(exc).__name__)

        try:
            self._client.set_async(path, data).rawlink(written)
        except (KazooException, KazooTimeoutError) as exc:
            on_done(type(exc).__name__)
            return False
        return True

    # -- watches and recipes ----------------------------------------------------------
    def watch_data(self, path: str, on_data: Callable[[bytes | None], None], *, what: str) -> Watch:
        """Call ``on_data(data)`` now and on every change of ``path``; ``on_data(None)`` while it is absent.

        The watch survives a lost session (re-armed on the new one).  ``what`` names the
        watch in the log when the callback raises (the watch goes on).
        """
        handle = _Cancellable()

        def fire(data: bytes | None, _stat: Any) -> bool | None:
            if handle.cancelled:
                return False
            _safe(on_data, None if data is None else bytes(data), what=what)
            return None

        DataWatch(self._client, path, fire)
        return handle

    def watch_children(self, path: str, on_children: Callable[[list[str]], None], *, what: str) -> Watch:
        """Call ``on_children(sorted names)`` now and whenever a child of ``path`` comes or goes."""
        handle = _Cancellable()

        def fire(children: list[str]) -> bool | None:
            if handle.cancelled:
                return False
            _safe(on_children, sorted(children), what=what)
            return None

        ChildrenWatch(self._client, path, fire)
        return handle

    def election(self, path: str, identifier: str) -> Any:
        """Return kazoo's ``Election`` (a lock recipe: one sequential node per contender under ``path``)."""
        return Election(self._client, path, identifier)
