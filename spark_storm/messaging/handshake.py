"""The connection handshake, as two small state machines shared by every socket transport.

::

    client                                   server
      HELLO(magic, version, session, nonce_c, topology)  ->
                                         <-  CHALLENGE(magic, version, auth?, nonce_s)
      AUTH(mac_c or empty)                ->
                                         <-  OK(resume_after, mac_s)  |  FAILURE(reason), close

``mac_c = HMAC-SHA256(secret, "spark-storm/1 client" | nonce_s | nonce_c | session | topology)``
and ``mac_s`` the same with "server": both sides prove the secret without sending it, and
fresh nonces on both sides stop replays.  ``resume_after`` is the last sequence number the
server delivered for this session (-1 if none), so a reconnecting client resends only
what the server did not get.

A refused client reports one message, :func:`refused`, whichever side noticed first: the
server checking the client's proof (tcp, zmq without CURVE), libzmq's CURVE handshake, a
kafka server checking a record's MAC, or a kafka client that cannot verify the server's
records.  Its reason is one of the constants below, so a wrong secret reads the same on
every transport.
"""

from __future__ import annotations

import hmac
import os
from hashlib import sha256

from spark_storm.errors import AuthenticationError
from spark_storm.messaging.wire import (
    NONCE_SIZE,
    PROTOCOL_VERSION,
    SESSION_ID_SIZE,
    Auth,
    Challenge,
    Hello,
    Ok,
)

__all__ = [
    "NO_SECRET",
    "WRONG_SECRET",
    "ClientHandshake",
    "ServerHandshake",
    "new_session_id",
    "record_mac",
    "refused",
    "verify_record_mac",
]

WRONG_SECRET = "wrong shared secret (storm.messaging.auth.secret differs between the client and the server)"
"""Why a client with another secret than the server's is refused, on every transport."""
NO_SECRET = "no shared secret: the server requires storm.messaging.auth.secret and the client has none"
"""Why a client without a secret is refused by a server that requires one, on every transport."""


def refused(server: str, reason: str) -> str:
    """Return a client's ``last_error`` for a handshake the server refused (or will refuse) for ``reason``."""
    return f"authentication failed: server {server} refused the handshake: {reason}"


def new_session_id() -> bytes:
    """Return a random client session id (stable across one client's reconnects)."""
    return os.urandom(SESSION_ID_SIZE)


def _mac(secret: bytes, role: bytes, first: bytes, second: bytes, session: bytes, topo: str) -> bytes:
    text = b"spark-storm/1 " + role + first + second + session + topo.encode("utf-8")
    return hmac.new(secret, text, sha256).digest()


def record_mac(secret: bytes, role: bytes, topology_id: str, key: bytes, value: bytes) -> bytes:
    """MAC of one self-contained record (transports without a connection, e.g. kafka).

    ``HMAC-SHA256(secret, "spark-storm/1 record " | role | len+topology | len+key | value)``;
    ``role`` (b"client" or b"server") stops a record being reflected back as the other side's.
    """
    topo = topology_id.encode("utf-8")
    text = b"".join(
        (b"spark-storm/1 record ", role, len(topo).to_bytes(4, "big"), topo, len(key).to_bytes(4, "big"), key, value)
    )
    return hmac.new(secret, text, sha256).digest()


def verify_record_mac(secret: bytes, role: bytes, topology_id: str, key: bytes, value: bytes, mac: bytes) -> bool:
    """Check ``mac`` against :func:`record_mac` of the record (constant-time compare)."""
    return hmac.compare_digest(record_mac(secret, role, topology_id, key, value), mac)


class ClientHandshake:
    """Client side: build HELLO, answer CHALLENGE, check OK.

    Parameters
    ----------
    topology_id : str
        Topology the client wants to talk to; the server refuses any other.
    session_id : bytes
        This client's session id (the same for every reconnect of one client).
    secret : bytes or None
        Shared secret, or None when auth is off.
    peer : str
        ``host:port`` of the server, for error messages.
    """

    def __init__(self, topology_id: str, session_id: bytes, secret: bytes | None, peer: str) -> None:
        self.topology_id = topology_id
        self.session_id = session_id
        self._secret = secret
        self._peer = peer
        self._nonce = os.urandom(NONCE_SIZE)
        self._server_nonce = b""

    def hello(self) -> Hello:
        """Return the HELLO frame that opens the connection."""
        return Hello(PROTOCOL_VERSION, self.topology_id, self.session_id, self._nonce)

    def on_challenge(self, challenge: Challenge) -> Auth:
        """Answer the server's challenge.

        Raises
        ------
        AuthenticationError
            The server speaks another protocol version.
        """
        if challenge.version != PROTOCOL_VERSION:
            msg = (
                f"server {self._peer} speaks protocol version {challenge.version}, this client "
                f"speaks {PROTOCOL_VERSION}: run the same spark-storm version on both sides"
            )
            raise AuthenticationError(msg)
        # Without a secret we still answer (with no proof): the server then refuses us with
        # a reason it logs on its side and sends back, so both operators see the cause.
        self._server_nonce = challenge.nonce
        if self._secret is None:
            return Auth(b"")
        return Auth(_mac(self._secret, b"client", challenge.nonce, self._nonce, self.session_id, self.topology_id))

    def on_ok(self, ok: Ok) -> int:
        """Check the server's proof and return its ``resume_after`` sequence.

        Raises
        ------
        AuthenticationError
            We have a secret and the server could not prove it has the same one.
        """
        if self._secret is not None:
            want = _mac(self._secret, b"server", self._nonce, self._server_nonce, self.session_id, self.topology_id)
            if not hmac.compare_digest(want, ok.mac):
                msg = (
                    f"server {self._peer} failed to prove the shared secret: it is not the "
                    "server you configured, or its storm.messaging.auth.secret differs"
                )
                raise AuthenticationError(msg)
        return ok.resume_after


class ServerHandshake:
    """Server side: check HELLO, issue CHALLENGE, verify AUTH, build OK.

    Parameters
    ----------
    topology_id : str
        The topology this server was bound for.
    secret : bytes or None
        Shared secret, or None when auth is off.
    peer : str
        ``host:port`` of the client, for error messages.
    """

    def __init__(self, topology_id: str, secret: bytes | None, peer: str) -> None:
        self.topology_id = topology_id
        self._secret = secret
        self._peer = peer
        self._nonce = os.urandom(NONCE_SIZE)
        self.hello: Hello | None = None

    def on_hello(self, hello: Hello) -> Challenge:
        """Check the client's HELLO and return the CHALLENGE to send.

        Raises
        ------
        AuthenticationError
            Protocol version or topology id do not match.
        """
        if hello.version != PROTOCOL_VERSION:
            msg = f"client {self._peer} speaks protocol version {hello.version}, server speaks {PROTOCOL_VERSION}"
            raise AuthenticationError(msg)
        if hello.topology_id != self.topology_id:
            msg = (
                f"client {self._peer} asked for topology {hello.topology_id!r} but this server "
                f"serves {self.topology_id!r}"
            )
            raise AuthenticationError(msg)
        if len(hello.session_id) != SESSION_ID_SIZE or len(hello.nonce) != NONCE_SIZE:
            msg = f"client {self._peer} sent a malformed HELLO"  # pragma: no cover - codec sizes
            raise AuthenticationError(msg)
        self.hello = hello
        return Challenge(PROTOCOL_VERSION, self._secret is not None, self._nonce)

    def on_auth(self, auth: Auth, resume_after: int) -> Ok:
        """Verify the client's proof and return the OK to send.

        Raises
        ------
        AuthenticationError
            Wrong or missing proof.
        """
        hello = self.hello
        if hello is None:
            msg = f"client {self._peer} sent AUTH before HELLO"
            raise AuthenticationError(msg)
        if self._secret is None:
            return Ok(b"", resume_after)
        if not auth.mac:
            msg = f"client {self._peer} failed authentication: {NO_SECRET}"
            raise AuthenticationError(msg, NO_SECRET)
        want = _mac(self._secret, b"client", self._nonce, hello.nonce, hello.session_id, self.topology_id)
        if not hmac.compare_digest(want, auth.mac):
            msg = f"client {self._peer} failed authentication: {WRONG_SECRET}"
            raise AuthenticationError(msg, WRONG_SECRET)
        proof = _mac(self._secret, b"server", hello.nonce, self._nonce, hello.session_id, self.topology_id)
        return Ok(proof, resume_after)
