"""Kafka transport: worker messaging through a Kafka cluster (kafka-python).

Addressing.  Kafka has no ports, so (topology, port) names topics:
``<prefix><topology>-<port>`` carries client records to the server bound there, and
``<prefix><topology>-<port>-reply`` carries the server's answers back.  ``connect``'s host is
not used (the brokers come from ``storm.messaging.kafka.bootstrap.servers``).  ``bind(.., 0)``
picks a free port number by creating a topic that did not exist yet.

Records.  A record's value is frames of the ordinary wire codec (docs/reference/protocol.md), so the
transport adds no format of its own:

* client -> server: ``SEQ + data frames``, ``BATCH_HEADER + SEQ + data frames`` (a delivery
  group, atomic: one record), ``LOAD``, ``BATCH_COMMIT`` or ``CLOSE``.  The key is the client's
  session id (one client's records stay in order in one partition); headers: ``t`` topology
  id, ``tasks`` the task ids in the record (comma separated, for Kafka tooling), ``m`` the MAC.
* server -> clients: ``RECEIPT``, ``BATCH_ACK`` and ``FAILURE`` keyed by the client's session
  id; ``HELLO`` (the server's announcement, repeated every ``heartbeat.ms``; its session field
  is the server's instance id), ``LOAD``, ``BACKPRESSURE`` and ``CLOSE`` with an empty key, for
  every client.

Delivery.  The server consumes with a manually assigned partition set and commits offsets
only after the receive callback returned for every record of a poll, then sends RECEIPTs:
a restarted server resumes after the last delivered record, and records sent while no
server ran are waiting for it.  Records are handed to the same sans-I/O session protocol
as tcp and zmq (one ``ServerPeer`` per client session, ``ClientProtocol`` on the client),
started past the handshake since each record is authenticated on its own: duplicates
inside one server's life are dropped by session sequence numbers, groups are bounded and
assembled the same way; across a restart, records
delivered but not yet committed come again (at-least-once; Spark groups are deduplicated
by the delivery ledger).  Clients keep tcp's watermarks on bytes the server has not
receipted, so a stopped server holds its producers back instead of filling the topic.

Auth.  With a shared secret every record carries ``HMAC-SHA256`` over role, topology, key
and value (:func:`~spark_storm.messaging.handshake.record_mac`), in both directions; a server
refuses records with a bad or missing MAC (counted in ``auth_failures``, answered with
FAILURE), and a client ignores server records it cannot verify.  Replays of a client's
records are dropped by their sequence numbers; who may write the topics at all is Kafka's
ACLs' business (``storm.messaging.kafka.client.config`` takes SASL/TLS settings).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from traceback import format_exc
from typing import Any, ClassVar, TypeVar

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError, UnknownTopicOrPartitionError
from kafka.structs import OffsetAndMetadata

from spark_storm.config import (
    KAFKA_BOOTSTRAP,
    KAFKA_CLIENT_CONFIG,
    KAFKA_HEARTBEAT_MS,
    KAFKA_LINGER_MS,
    KAFKA_PARTITIONS,
    KAFKA_POLL_MAX_RECORDS,
    KAFKA_REPLICATION,
    KAFKA_TOPIC_PREFIX,
    STORM_GROUP_MAX_BYTES,
    STORM_GROUP_MAX_FRAMES,
    STORM_MAX_FRAME_BYTES,
    STORM_SERVER_MAX_CONNECTIONS,
    STORM_SERVER_SESSIONS_MAX,
    TCP_FLUSH_TIMEOUT_MS,
    Config,
)
from spark_storm.errors import (
    AuthenticationError,
    ConfigError,
    ConnectionBrokenError,
    ConnectionClosedError,
    TransportError,
    TransportInitError,
    WireFormatError,
)
from spark_storm.messaging.api import CallbackLike, IClient, IServer
from spark_storm.messaging.handshake import (
    NO_SECRET,
    WRONG_SECRET,
    new_session_id,
    record_mac,
    refused,
    verify_record_mac,
)
from spark_storm.messaging.message import BackpressureStatus, ConnectionStatus, TaskMessage
from spark_storm.messaging.wire import (
    HEADER_SIZE,
    PROTOCOL_VERSION,
    BatchCommit,
    BatchHeader,
    Close,
    ControlRequest,
    Failure,
    FrameDecoder,
    Hello,
    LoadMetrics,
    Receipt,
    check_messages,
    encode_control,
)
from spark_storm.netutil import FIRST_EPHEMERAL_PORT
from spark_storm.transport._base import ClientBase, ServerBase, TrackingContext, as_batch
from spark_storm.transport._client import check_group_size
from spark_storm.transport._session import (
    MAX_CONTROLS_PER_MESSAGE,
    ClientProtocol,
    ClientSession,
    PeerLimits,
    ServerPeer,
    SessionTable,
    server_fault,
)

__all__ = ["Context", "reply_topic", "topic_for"]

logger = logging.getLogger(__name__)

_CLIENT = b"client"
_SERVER = b"server"
_BROADCAST = b""
_TOPIC_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_POLL_MS = 100
_REFUSED_MEMORY = 1024
_RECORD_SLACK = 64 * 1024  # headers, key and frame overhead on top of the largest frame


def topic_for(prefix: str, topology_id: str, port: int) -> str:
    """Return the topic a server bound to (topology, port) consumes."""
    name = f"{prefix}{_TOPIC_CHARS.sub('_', topology_id)}-{port}"
    if len(name) > 240:
        msg = f"Kafka topic name {name[:60]}... is {len(name)} characters; shorten the topology id or the prefix"
        raise ConfigError(msg)
    return name


def reply_topic(data_topic: str) -> str:
    """Return the topic a server answers its clients on."""
    return f"{data_topic}-reply"


_T = TypeVar("_T")


def _once_known(lookup: Callable[[], _T], within_s: float = 10.0) -> _T:
    """Run an offsets lookup, again while the broker does not know the topic yet (created just now).

    A topic ``ensure_topics`` created can be unknown to the broker that answers for a moment
    (seen as a restarted worker exiting on ``UnknownTopicOrPartitionError`` for its reply topic).
    """
    deadline = time.monotonic() + within_s
    while True:
        try:
            return lookup()
        except UnknownTopicOrPartitionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _headers(record: Any) -> dict[str, bytes]:
    return {name: value for name, value in (record.headers or [])}


class Context(TrackingContext):
    """The kafka transport's context: one producer, one admin client, per-connection consumers."""

    alias: ClassVar[str] = "kafka"
    crosses_processes: ClassVar[bool] = True

    def __init__(self, conf: Config) -> None:
        super().__init__(conf)
        self.bootstrap = conf.get_str(KAFKA_BOOTSTRAP)
        self.prefix = conf.get_str(KAFKA_TOPIC_PREFIX)
        self.partitions = conf.get_int(KAFKA_PARTITIONS, minimum=1)
        self.replication = conf.get_int(KAFKA_REPLICATION, minimum=1)
        self.heartbeat_s = conf.get_int(KAFKA_HEARTBEAT_MS, minimum=10) / 1000
        self.max_frame = conf.get_int(STORM_MAX_FRAME_BYTES, minimum=64)
        self.secret = conf.auth_secret()
        self.client_config = conf.get_mapping(KAFKA_CLIENT_CONFIG)
        known = (
            set(KafkaProducer.DEFAULT_CONFIG) | set(KafkaConsumer.DEFAULT_CONFIG) | set(KafkaAdminClient.DEFAULT_CONFIG)
        )
        unknown = sorted(set(self.client_config) - known)
        if unknown:
            msg = (
                f"config key {KAFKA_CLIENT_CONFIG!r}: {', '.join(unknown)} is not a kafka-python setting; use "
                "kafka-python's names (e.g. security_protocol, sasl_mechanism, ssl_cafile, request_timeout_ms)"
            )
            raise ConfigError(msg)
        self._linger_ms = conf.get_int(KAFKA_LINGER_MS, minimum=0)
        self._producer: KafkaProducer | None = None
        self._admin: KafkaAdminClient | None = None
        self._kafka_lock = threading.Lock()

    # --- shared Kafka clients ------------------------------------------------------------
    def _kafka_args(self, cls: type, **extra: Any) -> dict[str, Any]:
        # Each kafka-python class gets the user's settings it knows (a producer-only one such
        # as compression_type would make the consumer's constructor fail).
        mine = {k: v for k, v in self.client_config.items() if k in cls.DEFAULT_CONFIG}  # type: ignore[attr-defined]
        return {"bootstrap_servers": self.bootstrap.split(","), **mine, **extra}

    def _unreachable(self, exc: Exception) -> TransportError:
        msg = (
            f"kafka transport: cannot reach the Kafka brokers {self.bootstrap!r} ({exc!r}); "
            f"check {KAFKA_BOOTSTRAP} and that the cluster is up"
        )
        return TransportInitError(msg)

    def check_reachable(self) -> None:
        """Fail fast, naming the key, when no bootstrap broker accepts a TCP connection.

        Also spares kafka-python's constructors a failed bootstrap (they leak their sockets).
        """
        errors = []
        for server in self.bootstrap.split(","):
            host, _, port = server.strip().rpartition(":")
            try:
                socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=5).close()
                return
            except (OSError, ValueError) as exc:
                errors.append(f"{server.strip()}: {exc}")
        raise self._unreachable(ConnectionError("; ".join(errors)))

    def producer(self) -> KafkaProducer:
        """Return the context's producer (thread-safe; shared by its clients and servers)."""
        with self._kafka_lock:
            if self._producer is None:
                self.check_reachable()
                try:
                    self._producer = KafkaProducer(
                        **self._kafka_args(
                            KafkaProducer,
                            acks="all",
                            enable_idempotence=True,
                            linger_ms=self._linger_ms,
                            max_request_size=self.max_frame + _RECORD_SLACK,
                            batch_size=256 * 1024,
                        )
                    )
                except KafkaError as exc:
                    raise self._unreachable(exc) from exc
            return self._producer

    def consumer(self, group_id: str | None) -> KafkaConsumer:
        """Return a new consumer (not thread-safe: one per reading thread)."""
        self.check_reachable()
        try:
            return KafkaConsumer(
                **self._kafka_args(
                    KafkaConsumer,
                    group_id=group_id,
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    max_partition_fetch_bytes=self.max_frame + _RECORD_SLACK,
                    fetch_max_wait_ms=50,
                )
            )
        except KafkaError as exc:
            raise self._unreachable(exc) from exc

    def ensure_topics(self, data_topic: str, *, must_be_new: bool = False) -> bool:
        """Create the data and reply topics if missing; False if ``must_be_new`` and it existed."""
        with self._kafka_lock:
            if self._admin is None:
                self.check_reachable()
                try:
                    self._admin = KafkaAdminClient(**self._kafka_args(KafkaAdminClient, client_id="spark-storm-admin"))
                except KafkaError as exc:
                    raise self._unreachable(exc) from exc
            admin = self._admin
        config = {"max.message.bytes": str(self.max_frame + _RECORD_SLACK)}
        for topic in (data_topic, reply_topic(data_topic)):
            try:
                admin.create_topics([NewTopic(topic, self.partitions, self.replication, topic_configs=config)])
            except TopicAlreadyExistsError:
                if must_be_new and topic == data_topic:
                    return False
            except KafkaError as exc:
                msg = f"kafka transport: creating topic {topic!r} on {self.bootstrap!r} failed: {exc!r}"
                raise TransportError(msg) from exc
        return True

    def partitions_of(self, consumer: KafkaConsumer, topic: str) -> list[TopicPartition]:
        """Every partition of ``topic`` (the configured count while metadata is not in yet)."""
        found = consumer.partitions_for_topic(topic) or set(range(self.partitions))
        return [TopicPartition(topic, p) for p in sorted(found)]

    def sign(self, role: bytes, topology_id: str, key: bytes, value: bytes) -> list[tuple[str, bytes]]:
        """Record headers: topology id, and the MAC when a secret is set."""
        headers = [("t", topology_id.encode("utf-8"))]
        if self.secret is not None:
            headers.append(("m", record_mac(self.secret, role, topology_id, key, value)))
        return headers

    # --- IContext ------------------------------------------------------------------------
    def _new_server(self, topology_id: str, port: int, callback: CallbackLike | None) -> IServer:
        if not 0 <= port <= 65535:
            msg = f"port {port} is outside 0..65535"
            raise TransportError(msg)
        if port == 0:
            for _ in range(100):
                candidate = random.randint(FIRST_EPHEMERAL_PORT, 65535)
                if self.ensure_topics(topic_for(self.prefix, topology_id, candidate), must_be_new=True):
                    port = candidate
                    break
            else:  # pragma: no cover - 100 random picks all taken
                msg = f"no free kafka port for topology {topology_id!r} after 100 tries"
                raise TransportError(msg)
        else:
            topic = topic_for(self.prefix, topology_id, port)
            self.ensure_topics(topic)
            self._wait_until_unserved(topic, port)
        return KafkaServer(self, topology_id, port, callback)

    def _live_servers(self, topic: str) -> dict[bytes, float]:
        """Server instances announcing on ``topic``'s reply topic lately, with their last announcement's age in s."""
        consumer = self.consumer(group_id=None)
        try:
            parts = self.partitions_of(consumer, reply_topic(topic))
            consumer.assign(parts)
            ends = _once_known(lambda: consumer.end_offsets(parts))
            starts = _once_known(lambda: consumer.beginning_offsets(parts))
            for tp in parts:
                consumer.seek(tp, max(starts[tp], ends[tp] - 100))
            last: dict[bytes, tuple[int, bool]] = {}  # instance -> (timestamp ms, closed)
            deadline = time.monotonic() + 10
            while any(consumer.position(tp) < ends[tp] for tp in parts) and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=_POLL_MS).values():
                    for record in records:
                        instance = _headers(record).get("i")
                        if record.key or instance is None:
                            continue
                        with contextlib.suppress(WireFormatError):
                            for item in FrameDecoder(self.max_frame).feed(record.value or b""):
                                if isinstance(item, Hello | Close):
                                    last[instance] = (record.timestamp, isinstance(item, Close))
        finally:
            consumer.close(autocommit=False)
        now_ms = time.time() * 1000
        window_ms = 3 * self.heartbeat_s * 1000
        return {i: (now_ms - ts) / 1000 for i, (ts, closed) in last.items() if not closed and now_ms - ts < window_ms}

    def _wait_until_unserved(self, topic: str, port: int) -> None:
        """Bind only where no live server consumes: a crashed one's announcements expire first.

        Raises
        ------
        TransportError
            Another server kept announcing on this (topology, port) for 3 heartbeats.
        """
        deadline = time.monotonic() + 3 * self.heartbeat_s + 1
        while True:
            live = self._live_servers(topic)
            if not live:
                return
            if time.monotonic() > deadline:
                who = ", ".join(f"{i.hex()[:12]} ({age:.1f}s ago)" for i, age in live.items())
                msg = (
                    f"kafka port {port} ({topic}) is served by a live server (instance {who}); "
                    "close it first or bind another port"
                )
                raise TransportError(msg)
            time.sleep(self.heartbeat_s / 2)

    def _new_client(self, topology_id: str, host: str, port: int) -> IClient:
        self.ensure_topics(topic_for(self.prefix, topology_id, port))
        return KafkaClient(self, topology_id, host, port)

    def _release(self) -> None:
        with self._kafka_lock:
            producer, self._producer = self._producer, None
            admin, self._admin = self._admin, None
        if producer is not None:
            producer.close(timeout=self.conf.get_int(TCP_FLUSH_TIMEOUT_MS, minimum=0) / 1000)
        if admin is not None:
            admin.close()


class KafkaServer(ServerBase):
    """Consumes (topology, port)'s topic and delivers it; answers on the reply topic."""

    def __init__(self, context: Context, topology_id: str, port: int, callback: CallbackLike | None) -> None:
        super().__init__(context.conf, topology_id, callback)
        self._context = context
        self._port = port
        self.topic = topic_for(context.prefix, topology_id, port)
        self.reply_topic = reply_topic(self.topic)
        self.instance_id = new_session_id()
        self._sessions = SessionTable(context.conf.get_int(STORM_SERVER_SESSIONS_MAX, minimum=1))
        self._limits = PeerLimits.from_conf(context.conf)
        self._max_peers = context.conf.get_int(STORM_SERVER_MAX_CONNECTIONS, minimum=1)
        self._peers: OrderedDict[bytes, ServerPeer] = OrderedDict()  # by client session id
        self._refused: OrderedDict[bytes, None] = OrderedDict()
        self._max_records = context.conf.get_int(KAFKA_POLL_MAX_RECORDS, minimum=1)
        self._producer = context.producer()
        self._consumer = context.consumer(group_id=self.topic)
        self._consumer.assign(context.partitions_of(self._consumer, self.topic))
        self._stop = threading.Event()
        self._announce()
        self._thread = threading.Thread(target=self._run, name=f"kafka-server-{self.topic}", daemon=True)
        self._thread.start()
        self._beat = threading.Thread(target=self._heartbeat, name=f"kafka-beat-{self.topic}", daemon=True)
        self._beat.start()
        logger.info("bound %s", self.describe())

    @property
    def port(self) -> int:
        return self._port

    def describe(self) -> str:
        return f"kafka server {self.topic}"

    # --- replies -------------------------------------------------------------------------
    def _reply(self, key: bytes, value: bytes) -> None:
        headers = self._context.sign(_SERVER, self.topology_id, key, value)
        headers.append(("i", self.instance_id))
        try:
            self._producer.send(self.reply_topic, key=key or None, value=value, headers=headers)
        except KafkaError as exc:
            logger.warning("%s: reply to %s failed: %r", self.describe(), self.reply_topic, exc)

    def _announce(self) -> None:
        hello = Hello(PROTOCOL_VERSION, self.topology_id, self.instance_id, os.urandom(16))
        self._reply(_BROADCAST, encode_control(hello))

    def _heartbeat(self) -> None:
        while not self._stop.wait(self._context.heartbeat_s):
            self._announce()

    def send_load_metrics(self, loads: Mapping[int, float]) -> None:
        self._reply(_BROADCAST, encode_control(LoadMetrics(dict(loads))))

    def send_backpressure_status(self, status: BackpressureStatus) -> None:
        self._reply(_BROADCAST, encode_control(status))

    # --- the consumer thread ---------------------------------------------------------------
    def _run(self) -> None:
        consumer = self._consumer
        try:
            while not self._stop.is_set() and not self.closed:
                polled = consumer.poll(timeout_ms=_POLL_MS, max_records=self._max_records)
                if not polled:
                    continue
                receipts: dict[bytes, int] = {}
                offsets: dict[TopicPartition, OffsetAndMetadata] = {}
                for tp, records in polled.items():
                    for record in records:
                        if self.closed:
                            break
                        self._on_record(record, receipts)
                        offsets[tp] = OffsetAndMetadata(record.offset + 1, "", -1)
                if offsets:
                    self._commit(offsets)
                for session, seq in receipts.items():  # sent within linger.ms; no flush of the
                    self._reply(session, encode_control(Receipt(seq)))  # shared producer here
        except Exception as exc:
            if self.closed:
                logger.debug("%s: consumer thread ended while closing: %r", self.describe(), exc)
            else:
                self.count("consumer_failures")
                logger.exception(
                    "%s: consumer thread failed (%r); the server stops receiving and announcing (clients see it gone)",
                    self.describe(),
                    exc,
                )
        finally:
            self._stop.set()
            consumer.close(autocommit=False)

    def _commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        try:
            self._consumer.commit(offsets)
        except KafkaError as exc:
            # The records stay delivered; a restart before the next commit gets them again.
            logger.warning("%s: committing offsets failed (%r); will retry with the next poll", self.describe(), exc)

    def _refuse(self, session: bytes, reason: str, counter: str) -> None:
        self.count(counter)
        if session in self._refused:
            return
        self._refused[session] = None
        while len(self._refused) > _REFUSED_MEMORY:
            self._refused.popitem(last=False)
        logger.warning("%s: refusing client %s: %s", self.describe(), session.hex()[:12], reason)
        self._reply(session, encode_control(Failure(reason)))
        self._producer.flush()

    def _on_record(self, record: Any, receipts: dict[bytes, int]) -> None:
        session: bytes = record.key or b""
        value: bytes = record.value or b""
        headers = _headers(record)
        topology = headers.get("t", b"").decode("utf-8", "replace")
        if topology != self.topology_id:
            reason = f"client is for topology {topology!r} but this server serves {self.topology_id!r}"
            self._refuse(session, reason, "auth_failures")
            return
        secret = self._context.secret
        if secret is not None:
            mac = headers.get("m")
            if mac is None:
                self._refuse(session, NO_SECRET, "auth_failures")
                return
            if not verify_record_mac(secret, _CLIENT, self.topology_id, session, value, mac):
                self._refuse(session, WRONG_SECRET, "auth_failures")
                return
        # The same session protocol as tcp and zmq: a peer per client session, authenticated
        # record by record above (MAC), so it starts past the handshake.
        peer = self._peer(session)
        try:
            peer.on_bytes(value)
            peer.check_eof()  # a record holds whole frames
        except (WireFormatError, AuthenticationError) as exc:
            self._forget(session)
            self._refuse(session, f"bad record at offset {record.offset}: {exc}", "protocol_errors")
            return
        except Exception as exc:  # a fault this client's record reached: it loses its session, not all others theirs
            if session not in self._refused:  # logged once per client, as its refusal is
                logger.error(
                    "%s: record at offset %d failed: %r\n%s", self.describe(), record.offset, exc, format_exc()
                )
            self._forget(session)
            self._refuse(session, f"record at offset {record.offset}: {server_fault(exc)}", "protocol_errors")
            return
        if peer.receipt_due:
            peer.receipt_due = False
            receipts[session] = peer.delivered_upto
        if peer.closed_by_peer:
            self._forget(session)

    def _peer(self, session: bytes) -> ServerPeer:
        peer = self._peers.get(session)
        if peer is not None:
            self._peers.move_to_end(session)
            return peer
        peer = ServerPeer.authenticated(
            self,
            self._sessions,
            session,
            f"kafka client {session.hex()[:12]}",
            self._limits,
            functools.partial(self._reply, session),
            message_controls=MAX_CONTROLS_PER_MESSAGE,
            receipts=False,
        )
        self._peers[session] = peer
        while len(self._peers) > self._max_peers:  # the least recently heard-from client
            self._peers.popitem(last=False)[1].release()
        return peer

    def _forget(self, session: bytes) -> None:
        peer = self._peers.pop(session, None)
        if peer is not None:
            peer.release()

    # --- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        if not self.mark_closed():
            return
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(30)
        self._reply(_BROADCAST, encode_control(Close()))
        self._producer.flush()
        self._context.forget(self)
        logger.info("closed %s", self.describe())


class KafkaClient(ClientBase):
    """Produces to (topology, port)'s topic; follows the reply topic for status and receipts."""

    def __init__(self, context: Context, topology_id: str, host: str, port: int) -> None:
        super().__init__(topology_id, host, port)
        conf = context.conf
        self._context = context
        self.topic = topic_for(context.prefix, topology_id, port)
        self.reply_topic = reply_topic(self.topic)
        self._session = ClientSession.from_conf(conf, self.topic)
        self.session_id = self._session.session_id
        # Records are authenticated one by one (MAC), so the protocol starts past the handshake.
        self._proto = ClientProtocol(self, self._session, None, self.topic, context.max_frame, handshake=False)
        self._flush_timeout = conf.get_int(TCP_FLUSH_TIMEOUT_MS, minimum=0) / 1000
        self._record_limit = context.max_frame
        self._group_max_frames = conf.get_int(STORM_GROUP_MAX_FRAMES, minimum=1)
        self._group_max_bytes = conf.get_int(STORM_GROUP_MAX_BYTES, minimum=1)
        self._producer = context.producer()
        self._send_lock = threading.Lock()
        self._status_cond = threading.Condition()
        self._server: bytes | None = None
        self._server_seen = 0.0
        self._refused = False
        self._closed = False
        self._last_instance: bytes | None = None
        self._reconnects = 0
        self._produce_errors = 0
        self.last_error: str | None = None
        self._consumer = context.consumer(group_id=None)
        parts = context.partitions_of(self._consumer, self.reply_topic)
        self._consumer.assign(parts)
        self._consumer.seek_to_end(*parts)
        for tp in parts:  # resolve now: every reply to what we send comes after this
            _once_known(functools.partial(self._consumer.position, tp))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kafka-client-{self.topic}", daemon=True)
        self._thread.start()

    def describe(self) -> str:
        return f"kafka client to {self.topic}"

    # --- status --------------------------------------------------------------------------
    def _alive(self) -> bool:
        return self._server is not None and time.monotonic() - self._server_seen < 3 * self._context.heartbeat_s

    @property
    def status(self) -> ConnectionStatus:
        if self._closed:
            return ConnectionStatus.CLOSED
        if self._refused or not self._alive():
            return ConnectionStatus.CONNECTING
        return ConnectionStatus.READY

    def wait_ready(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._status_cond:
            while self.status is ConnectionStatus.CONNECTING:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._status_cond.wait(0.1 if remaining is None else min(remaining, 0.1))
            return self.status is ConnectionStatus.READY

    # --- the reply thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for records in self._consumer.poll(timeout_ms=_POLL_MS).values():
                    for record in records:
                        self._on_reply(record)
        except Exception as exc:
            if self._stop.is_set():
                logger.debug("%s: reply thread ended while closing: %r", self.describe(), exc)
            else:
                self.last_error = f"reply thread failed: {exc!r}"
                logger.exception("%s: reply thread failed; status and receipts stop updating", self.describe())
        finally:
            self._consumer.close(autocommit=False)

    def _on_reply(self, record: Any) -> None:
        key: bytes = record.key or b""
        if key and key != self.session_id:
            return  # another client's receipt or ack
        value: bytes = record.value or b""
        headers = _headers(record)
        secret = self._context.secret
        if secret is not None:
            mac = headers.get("m")
            if mac is None or not verify_record_mac(secret, _SERVER, self.topology_id, key, value, mac):
                self._unverified(mac is None)
                return
        instance = headers.get("i", b"")
        try:
            items = FrameDecoder(self._context.max_frame).feed(value)
        except WireFormatError as exc:
            logger.warning("%s: bad reply record at offset %d: %s", self.describe(), record.offset, exc)
            return
        if instance and not (len(items) == 1 and isinstance(items[0], Close)):
            self._saw_server(instance)
        # What a server instance says about itself (announcement, goodbye, refusal) is kafka's
        # own; what it says about the session goes through the shared protocol object.
        session_frames = [item for item in items if not self._lifecycle(item, instance)]
        if session_frames:
            try:
                self._proto.on_frames(session_frames, [])
            except (WireFormatError, ConnectionBrokenError) as exc:
                logger.warning("%s: bad reply record at offset %d: %s", self.describe(), record.offset, exc)

    def _unverified(self, unsigned: bool) -> None:
        # A server record without a valid MAC is ignored; last_error says why (the status stays
        # CONNECTING).  Signed with another secret, it comes from a server that refuses every
        # record of ours (it checks them with that secret): the one message of a wrong secret,
        # whichever of its records comes first, its announcement or its FAILURE to us (which
        # we cannot verify either).
        if unsigned:
            self.last_error = (
                f"authentication failed: server {self.topic} failed to prove the shared secret: it has no "
                "storm.messaging.auth.secret while this client has one; its records are ignored"
            )
        else:
            self.last_error = refused(self.topic, WRONG_SECRET)

    def _saw_server(self, instance: bytes) -> None:
        """Any record from a server instance shows it is alive; a new instance is a reconnect."""
        with self._status_cond:
            was_ready = self.status is ConnectionStatus.READY
            if instance != self._last_instance:
                if self._last_instance is not None:
                    self._reconnects += 1
                self._last_instance = instance
            self._server = instance
            self._server_seen = time.monotonic()
            if not was_ready and not self._refused:
                self.last_error = None
                logger.info("%s: ready (server instance %s)", self.describe(), instance.hex()[:12])
            self._status_cond.notify_all()

    def _lifecycle(self, item: object, instance: bytes) -> bool:
        """Handle a server instance's announcement, goodbye or refusal; False for anything else."""
        if isinstance(item, Hello):
            return True  # an announcement: _saw_server already noted it
        if isinstance(item, Close):
            with self._status_cond:
                if instance == self._server:
                    self._server = None
                self._status_cond.notify_all()
            return True
        if isinstance(item, Failure):
            with self._status_cond:
                self._refused = True
                self.last_error = refused(self.topic, item.reason)
                self._status_cond.notify_all()
            logger.error("%s", self.last_error)
            return True
        return False

    # --- caller threads ------------------------------------------------------------------
    def _check_open(self, call: str) -> None:
        if self._closed:
            msg = f"{call} on closed {self.describe()}"
            raise ConnectionClosedError(msg)

    def _produce(self, chunk: bytes, tasks: AbstractSet[int] = frozenset()) -> None:
        # Caller holds _send_lock, so records leave in admission order.
        headers = self._context.sign(_CLIENT, self.topology_id, self.session_id, chunk)
        if tasks:
            headers.append(("tasks", ",".join(map(str, sorted(tasks))).encode()))
        future = self._producer.send(self.topic, key=self.session_id, value=chunk, headers=headers)
        future.add_errback(self._on_produce_error)

    def _on_produce_error(self, exc: BaseException) -> None:
        # kafka-python's I/O thread, or the sender's own when the future failed already
        with self._status_cond:
            self._produce_errors += 1
        self.last_error = f"producing to {self.topic} failed: {exc!r}"
        logger.error("%s: %s", self.describe(), self.last_error)

    def _admit(self, batch: Sequence[TaskMessage], header: BatchHeader | None) -> None:
        # admit() encodes (and so validates) the whole batch before anything is numbered.
        with self._send_lock:
            self._check_open("send")
            self._session.admit(batch, header)
            for chunk in self._session.take_outbox():  # one chunk, or none when the drop policy dropped it
                self._produce(chunk, {m[0] for m in batch})

    def send(self, messages: TaskMessage | Iterable[TaskMessage]) -> None:
        batch = as_batch(messages)
        if not batch:
            return
        self._check_open("send")
        try:
            size = sum(len(m[1]) for m in batch) + HEADER_SIZE * len(batch)
        except TypeError:  # a payload without a length: check_messages below names it
            size = self._record_limit + 1
        if size <= self._record_limit:
            self._admit(batch, None)  # the usual case: one record
            return
        # Larger than one record may be: slices of at most storm.messaging.max.frame.bytes,
        # every message checked first so that no slice leaves when a later one is bad.
        check_messages(batch)
        start, size = 0, 0
        for i, message in enumerate(batch):
            size += len(message.payload) + HEADER_SIZE
            if size > self._record_limit and i > start:
                self._admit(batch[start:i], None)
                start, size = i, len(message.payload) + HEADER_SIZE
        self._admit(batch[start:], None)

    def send_group(self, header: BatchHeader, messages: Sequence[TaskMessage]) -> None:
        if len(messages) != header.count:
            msg = f"group {header.key} announces {header.count} messages but {len(messages)} were given"
            raise ValueError(msg)
        check_group_size(header, messages, self._group_max_frames, self._group_max_bytes)
        size = sum(len(m.payload) + HEADER_SIZE for m in messages)
        if size > self._record_limit:
            msg = (
                f"group {header.key} is {size} bytes, over {STORM_MAX_FRAME_BYTES}={self._record_limit}; a group "
                "travels as one Kafka record: raise the key (and the brokers' message.max.bytes) or send smaller groups"
            )
            raise TransportError(msg)
        self._admit(messages, header)

    def _control(self, frame: Any) -> None:
        chunk = encode_control(frame)
        with self._send_lock:
            self._check_open(f"sending {type(frame).__name__}")
            self._produce(chunk)

    def send_commit(self, query_id: str, batch_id: int) -> None:
        self._control(BatchCommit(query_id, batch_id))

    def _send_request(self, frame: ControlRequest) -> None:
        self._control(frame)

    def send_load_metrics(self, loads: Mapping[int, float]) -> None:
        self._control(LoadMetrics(dict(loads)))

    def flush(self, timeout: float | None = None) -> bool:
        self._producer.flush(timeout)
        return self._session.wait_acked(timeout)

    def metrics(self) -> dict[str, Any]:
        s = self._session
        return {
            "sent": s.sent,
            "received": 0,
            "lost": s.lost + self._produce_errors,
            "pending": s.pending,
            "pending_bytes": s.pending_bytes,
            "resent": 0,
            "blocked": s.blocked,
            "reconnects": self._reconnects,
            "dest": self.topic,
            "src": self.topology_id,
            "status": self.status.value,
            "last_error": self.last_error,
        }

    def close(self) -> None:
        with self._send_lock:
            if self._closed:
                return
            try:
                self._produce(encode_control(Close()))
            except KafkaError as exc:
                logger.warning("%s: could not send CLOSE: %r", self.describe(), exc)
            self._closed = True
        # Records in the topic are durable: what Kafka acknowledged reaches the server even
        # after this client is gone, so only what Kafka did not take counts as lost.
        self._producer.flush(self._flush_timeout)
        self._session.close(unacked_are_lost=False)
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(10)
        with self._status_cond:
            self._status_cond.notify_all()
        self._context.forget(self)
