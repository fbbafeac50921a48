"""The one exception tree of spark-storm.

::

    StormError                          root: ``except StormError`` catches everything we raise
    +-- ConfigError (ValueError)        a config key or option has a bad value; names key and fix
        +-- TargetError                 a dotted path does not import (spark_storm.plugins words it)
    +-- MissingExtraError (ImportError) an optional part is used but its extra is not installed; names it
    +-- WireFormatError                 bytes on a connection are not a valid frame stream
        +-- GroupRejectedError          a delivery group held a payload the worker cannot decode (none queued)
        +-- ProtocolError               a multilang child wrote something that is not a message of the protocol
    +-- ReportFormatError (ValueError)  a heartbeat or /health record is not of the shape a worker writes
    +-- TransportError                  something went wrong with a context or connection
        +-- UnknownTransportError       storm.messaging.transport names nothing we can load
        +-- TransportInitError          the plugin was found but its constructor failed (cause chained)
        +-- UnsupportedOperationError   a client-only call on a server, or the reverse
        +-- ConnectionClosedError       *you* closed it (or term()'d the context), then used it
        +-- ConnectionBrokenError       it failed under you: peer gone, protocol violated
            +-- AuthenticationError     the peer failed the handshake (secret, magic, version, topology)
        +-- SendTimeoutError            send() stayed blocked on the high watermark past its deadline
        +-- RequestTimeoutError         request() got no answer in time
        +-- DeliveryError               a Spark writer task did not get every ack in time (Spark retries it)
    +-- MultilangError                  a multilang child (ShellBolt/ShellSpout) could not start or failed
    +-- WindowError                     a windowed bolt's tuple has no usable event time, or its window was misused
    +-- ClusterError                    cluster mode: ZooKeeper state, nimbus, supervisors, the UI's sources
        +-- ZooKeeperUnavailableError   ZooKeeper did not answer within the retry budget
        +-- NoNimbusError               no nimbus leader is running for this ZooKeeper
        +-- TopologyExistsError         a topology of that name is already submitted
        +-- UnknownTopologyError (LookupError)  no topology of that name (UI/REST: 404)
        +-- ActionNotSupportedError     the cluster cannot do that action, e.g. rebalance a local cluster (501)
        +-- TopologyActionError         an action reached the workers and some refused or were unreachable (502)
        +-- DeployError                 deploy() cannot host the topology in the Spark application, or hosting failed
    +-- StateError                      a stateful bolt's state: a value it cannot store, a checkpoint that failed
        +-- StateCorruptError           a state or log file (or Redis entry) is corrupt or truncated
        +-- StateUnavailableError       the state backend cannot be reached (Redis down); names task and address
        +-- CheckpointError             a checkpoint round could not complete (the sink's commit fails with it)
            +-- CoordinatorBusyError    a worker follows another coordinator right now (its lease)
        +-- SavepointError              a savepoint is missing, partial, corrupt, newer, another topology's or unmatched
    +-- ServerPackageError              a Spark Connect server's Python workers cannot import spark-storm
    +-- ServiceError                    a server the project's tools run could not start, be reached or stop
        +-- ZooKeeperServerError, KafkaBrokerError, RedisServerError, SparkStandaloneError

Every exception class the package raises is in this tree and defined here; the modules
that raise them import them (and some re-export them where their users look).

"Closed" versus "broken" follows trio: the first is a bug in the caller, the second is
the network or the peer and is usually worth a retry.
"""

from __future__ import annotations

__all__ = [
    "ActionNotSupportedError",
    "AuthenticationError",
    "CheckpointError",
    "ClusterError",
    "ConfigError",
    "ConnectionBrokenError",
    "ConnectionClosedError",
    "CoordinatorBusyError",
    "DeliveryError",
    "DeployError",
    "GroupRejectedError",
    "KafkaBrokerError",
    "MissingExtraError",
    "MultilangError",
    "NoNimbusError",
    "ProtocolError",
    "RedisServerError",
    "ReportFormatError",
    "RequestTimeoutError",
    "SavepointError",
    "SendTimeoutError",
    "ServerPackageError",
    "ServiceError",
    "SparkStandaloneError",
    "StateCorruptError",
    "StateError",
    "StateUnavailableError",
    "StormError",
    "TargetError",
    "TopologyActionError",
    "TopologyExistsError",
    "TransportError",
    "TransportInitError",
    "UnknownTopologyError",
    "UnknownTransportError",
    "UnsupportedOperationError",
    "WindowError",
    "WireFormatError",
    "ZooKeeperServerError",
    "ZooKeeperUnavailableError",
]


class StormError(Exception):
    """Root of every exception raised by spark-storm."""


class ConfigError(StormError, ValueError):
    """A configuration key or option holds a value we cannot use."""


class MissingExtraError(StormError, ImportError):
    """An optional part is used, but the extra that installs its library is not (``pip install 'spark-storm[x]'``)."""


class WireFormatError(StormError):
    """A byte stream is not a valid spark-storm frame stream.

    Raised by the codec; a server that sees it closes that one connection,
    logs the peer and this message, counts it, and keeps serving the others.
    """


class ReportFormatError(StormError, ValueError):
    """A worker's heartbeat or metrics record (file, znode, ``/health``) is not of the shape a worker writes."""


class TransportError(StormError):
    """Base of errors raised by contexts and connections."""


class UnknownTransportError(TransportError):
    """``storm.messaging.transport`` names no alias, module or class we can load."""


class TransportInitError(TransportError):
    """A transport plugin was found but building its context failed."""


class UnsupportedOperationError(TransportError):
    """The call belongs to the other side of a connection (client vs server)."""


class ConnectionClosedError(TransportError):
    """The connection or its context was closed by this process, then used."""


class ConnectionBrokenError(TransportError):
    """The connection failed under the caller: peer gone or protocol violated."""


class AuthenticationError(ConnectionBrokenError):
    """The peer failed the connection handshake.

    ``reason`` is what the refusing side tells the peer (its FAILURE frame): the message
    without this side's name for the peer; the message itself unless given.
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = message if reason is None else reason


class SendTimeoutError(TransportError):
    """``send`` stayed blocked above the high write watermark past its deadline."""


class RequestTimeoutError(TransportError):
    """A coordination request got no answer within its timeout (the peer is slow, gone, or reconnecting)."""


class MultilangError(StormError):
    """A multilang child process could not start, or failed (exited, hung, wrote garbage); names its command."""


class WindowError(StormError):
    """A windowed bolt: a tuple whose event time is missing or not a time, or a window asked for what it lacks."""


class ClusterError(StormError):
    """Base of cluster-mode errors (ZooKeeper state, nimbus, supervisors, the UI's cluster sources)."""


class ZooKeeperUnavailableError(ClusterError):
    """ZooKeeper did not answer within the retry budget (``storm.zookeeper.retry.*``)."""


class NoNimbusError(ClusterError):
    """No nimbus leader is running for this ZooKeeper (and root)."""


class TopologyExistsError(ClusterError):
    """A topology of that name is already submitted; kill it first or rename."""


class UnknownTopologyError(ClusterError, LookupError):
    """No topology of that name is submitted (or running, for the UI)."""


class ActionNotSupportedError(ClusterError):
    """The cluster behind the UI cannot carry out this topology action (the message says what can)."""


class TopologyActionError(ClusterError):
    """A topology action was sent to the workers and at least one refused it or could not be reached."""


class DeployError(ClusterError):
    """A topology cannot be hosted by the Spark application (``deploy()``), or its hosting failed; names the fix.

    Too few task slots, a state provider other hosts cannot reach, Spark Connect without what it
    needs, workers that did not come up in time, a supervisor task that failed past its resubmits.
    """


class StateError(StormError):
    """A stateful bolt's state: a key or value it cannot store, a checkpoint that failed."""


class StateCorruptError(StateError):
    """A state or input-log file (or Redis entry) is corrupt or truncated; the message names the task and where."""


class StateUnavailableError(StateError):
    """The state backend cannot be reached (e.g. Redis is down); the message names the task and the address."""


class CheckpointError(StateError):
    """A checkpoint round could not complete: a worker stayed unreachable, or kept failing tuples on replay."""


class CoordinatorBusyError(CheckpointError):
    """A worker is coordinated by someone else right now (try again once its lease ends)."""


class SavepointError(StateError):
    """A savepoint cannot be written, read or restored; the message names the file or component and the fix."""


class TargetError(ConfigError):
    """A dotted path did not import; ``kind`` says why (:func:`spark_storm.plugins.import_target`).

    Attributes
    ----------
    kind : str
        A :class:`spark_storm.plugins.Problem`: not a path, no such module (``missing``
        names the module Python could not find: the target's own, or one it imports), a
        syntax error, the module raised while importing, or no such attribute.
    module, attr : str
        The parts of the path.
    """

    def __init__(
        self, kind: str, module: str, attr: str, cause: BaseException | None = None, missing: str | None = None
    ) -> None:
        super().__init__(f"{kind}: {module}:{attr}")
        self.kind = kind
        self.module = module
        self.attr = attr
        self.cause = cause
        self.missing = missing


class GroupRejectedError(WireFormatError):
    """A delivery group held a payload the worker cannot decode; nothing of it was queued (the sender resends it)."""


class ProtocolError(WireFormatError):
    """A multilang child wrote something that is not a message of the protocol."""


class DeliveryError(TransportError):
    """A Spark writer task did not get every ack in time (Spark retries the task)."""


class ServerPackageError(StormError):
    """The Spark Connect server's Python workers cannot import spark-storm (or run another version)."""


class ServiceError(StormError):
    """A server one of the project's tools runs could not be started, reached or stopped."""


class ZooKeeperServerError(ServiceError):
    """The ZooKeeper server could not be started, reached or stopped."""


class KafkaBrokerError(ServiceError):
    """The Kafka broker could not be started, reached or stopped."""


class RedisServerError(ServiceError):
    """The Redis server could not be started, reached or stopped."""


class SparkStandaloneError(ServiceError):
    """The Spark standalone master or worker could not be started or reached."""
