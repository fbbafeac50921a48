"""CURVE keys for the zmq transport: from config, or derived from the shared secret.

ZeroMQ's CURVE mechanism (CurveZMQ: X25519 key agreement, XSalsa20-Poly1305 boxes,
short-term keys per connection) authenticates both ends of every zmq connection and
encrypts it.  Authentication then belongs to the connection: a peer without an allowed
key never completes the ZMTP handshake, so libzmq never hands the server one byte of its
data, whatever routing id it claims.  Which client keys are allowed is checked by a ZAP
handler (pyzmq's :class:`zmq.auth.thread.ThreadAuthenticator`) the zmq context runs.

Keys come from one of two places:

* **Explicit** (``storm.messaging.zmq.curve.*``, Z85 text): servers need their secret key and
  the allowed client public keys, clients the server's public key and their own secret key.
  Run ``python -m spark_storm.transport.curve`` to print a fresh keypair.
* **Derived** from ``storm.messaging.auth.secret`` when no explicit key is set: each of the
  two keypairs' secret key is ``HKDF-SHA256(secret, salt="spark-storm zmq curve v1",
  info="server"|"client")`` (RFC 5869; X25519 takes any 32 bytes as a secret key).  Holding
  the shared secret is then exactly what lets a process act as a server or a client, the
  same trust the HMAC handshake already places in it, and HKDF's domain separation keeps
  these keys independent of each other and of the handshake's HMAC.  As with any
  secret-derived key, its strength is the secret's: use a random one of 32 bytes or more
  (``openssl rand -hex 32``); a guessable secret can be found offline from one recorded
  handshake, as with the HMAC handshake.  Forward secrecy is CurveZMQ's own (short-term
  keys per connection).
"""

from __future__ import annotations

import hmac
import logging
import struct
import sys
from dataclasses import dataclass
from hashlib import sha256

import zmq
from zmq.utils import z85

from spark_storm.config import (
    STORM_AUTH_SECRET,
    ZMQ_CURVE_ALLOWED,
    ZMQ_CURVE_CLIENT_SECRET,
    ZMQ_CURVE_SERVER_PUBLIC,
    ZMQ_CURVE_SERVER_SECRET,
    Config,
)
from spark_storm.errors import ConfigError

__all__ = ["CurveKeys", "curve_keys", "derive_secret_key"]

logger = logging.getLogger(__name__)

_SALT = b"spark-storm zmq curve v1"
_WEAK_SECRET_BYTES = 16
_EXPLICIT = (ZMQ_CURVE_SERVER_PUBLIC, ZMQ_CURVE_SERVER_SECRET, ZMQ_CURVE_CLIENT_SECRET)


def derive_secret_key(secret: bytes, role: bytes) -> bytes:
    """Return the Z85 CURVE secret key of ``role`` (b"server" or b"client") derived from ``secret``.

    HKDF-SHA256 (RFC 5869) extract-then-expand with one output block of 32 bytes.
    """
    prk = hmac.new(_SALT, secret, sha256).digest()
    okm = hmac.new(prk, role + b"\x01", sha256).digest()
    return z85.encode(okm)


def _public(secret_key: bytes) -> bytes:
    return zmq.curve_public(secret_key)


def _z85_key(conf: Config, key: str) -> bytes | None:
    text = conf.get_optional_str(key)
    if text is None:
        return None
    return _check_z85(text, key)


def _check_z85(text: str, key: str) -> bytes:
    raw = text.strip().encode("ascii", "replace")
    try:
        ok = len(raw) == 40 and len(z85.decode(raw)) == 32
    except (ValueError, KeyError, IndexError, struct.error):
        ok = False
    if not ok:
        msg = (
            f"config key {key!r} must be a 40-character Z85 CURVE key (as printed by "
            f"`python -m spark_storm.transport.curve`), got {len(raw)} characters"
        )
        raise ConfigError(msg)
    return raw


@dataclass(frozen=True)
class CurveKeys:
    """The CURVE keys of one process: what its servers and its clients use (Z85 bytes)."""

    server_public: bytes | None
    server_secret: bytes | None
    client_public: bytes | None
    client_secret: bytes | None
    allowed: frozenset[bytes]
    derived: bool

    def for_server(self) -> tuple[bytes, frozenset[bytes]]:
        """Return (server secret key, allowed client public keys).

        Raises
        ------
        ConfigError
            Explicit keys are configured but a server's are missing.
        """
        if self.server_secret is None or not self.allowed:
            msg = (
                f"zmq CURVE keys are configured explicitly, so a server needs {ZMQ_CURVE_SERVER_SECRET!r} and "
                f"at least one key in {ZMQ_CURVE_ALLOWED!r} (or remove the explicit keys to derive them "
                f"from {STORM_AUTH_SECRET!r})"
            )
            raise ConfigError(msg)
        return self.server_secret, self.allowed

    def for_client(self) -> tuple[bytes, bytes, bytes]:
        """Return (server public key, client public key, client secret key).

        Raises
        ------
        ConfigError
            Explicit keys are configured but a client's are missing.
        """
        if self.server_public is None or self.client_secret is None or self.client_public is None:
            msg = (
                f"zmq CURVE keys are configured explicitly, so a client needs {ZMQ_CURVE_SERVER_PUBLIC!r} and "
                f"{ZMQ_CURVE_CLIENT_SECRET!r} (or remove the explicit keys to derive them from {STORM_AUTH_SECRET!r})"
            )
            raise ConfigError(msg)
        return self.server_public, self.client_public, self.client_secret


def curve_keys(conf: Config) -> CurveKeys | None:
    """Return the CURVE keys ``conf`` asks for, or None when zmq runs without security.

    Raises
    ------
    ConfigError
        A key is not Z85, a public key does not match its secret key, or libzmq was built
        without CURVE while security is asked for.
    """
    explicit = {key: _z85_key(conf, key) for key in _EXPLICIT}
    allowed = frozenset(_check_z85(k, ZMQ_CURVE_ALLOWED) for k in conf.get_str_list(ZMQ_CURVE_ALLOWED))
    secret = conf.auth_secret()
    if not any(explicit.values()) and not allowed and secret is None:
        return None
    if not zmq.has("curve"):
        msg = (
            f"the zmq transport secures connections with CURVE when {STORM_AUTH_SECRET!r} or CURVE keys are set, "
            f"but this libzmq ({zmq.zmq_version()}) was built without it: install a pyzmq whose libzmq has CURVE, "
            "or use the tcp transport"
        )
        raise ConfigError(msg)
    if any(explicit.values()) or allowed:
        server_secret = explicit[ZMQ_CURVE_SERVER_SECRET]
        server_public = explicit[ZMQ_CURVE_SERVER_PUBLIC]
        if server_secret is not None:
            derived_public = _public(server_secret)
            if server_public is not None and server_public != derived_public:
                msg = f"config keys {ZMQ_CURVE_SERVER_PUBLIC!r} and {ZMQ_CURVE_SERVER_SECRET!r} are not one keypair"
                raise ConfigError(msg)
            server_public = derived_public
        client_secret = explicit[ZMQ_CURVE_CLIENT_SECRET]
        client_public = _public(client_secret) if client_secret is not None else None
        return CurveKeys(server_public, server_secret, client_public, client_secret, allowed, derived=False)
    assert secret is not None
    if len(secret) < _WEAK_SECRET_BYTES:
        logger.warning(
            "%s is %d bytes: the zmq CURVE keys derived from it are only as strong as the secret; "
            "use 32 random bytes or more (openssl rand -hex 32)",
            STORM_AUTH_SECRET,
            len(secret),
        )
    server_secret = derive_secret_key(secret, b"server")
    client_secret = derive_secret_key(secret, b"client")
    client_public = _public(client_secret)
    return CurveKeys(
        _public(server_secret), server_secret, client_public, client_secret, frozenset({client_public}), derived=True
    )


def main() -> None:
    """Print a fresh CURVE keypair (Z85) for the explicit-key settings."""
    public, secret = zmq.curve_keypair()
    sys.stdout.write(f"public: {public.decode()}\nsecret: {secret.decode()}\n")


if __name__ == "__main__":
    main()
