"""TLS for the tcp transport: ``ssl`` contexts built from ``storm.messaging.tcp.tls.*``.

Storm 2.x encrypts Netty connections with TLS (``storm.messaging.netty.tls.*``, Java
keystores); we read PEM files with the standard library's :mod:`ssl`:

* a server presents ``cert.file``/``key.file`` and, per ``client.auth``, asks for
  (``optional``) or demands (``required``: mutual TLS) a client certificate signed by a CA
  of ``ca.file``;
* a client verifies the server's certificate against ``ca.file`` (or the system CAs) and,
  unless ``hostname.verification`` is off, that it names the host it connects to; it
  presents ``cert.file`` when one is set.

TLS runs below the session protocol: the HELLO/CHALLENGE/AUTH handshake (and its shared
secret, if any) still runs inside the encrypted connection.
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from spark_storm.config import (
    TLS_CA_FILE,
    TLS_CERT_FILE,
    TLS_CLIENT_AUTH,
    TLS_ENABLE,
    TLS_HOSTNAME_VERIFICATION,
    TLS_KEY_FILE,
    TLS_KEY_PASSWORD,
    TLS_MIN_VERSION,
    Config,
)
from spark_storm.errors import ConfigError

__all__ = ["client_context", "server_context", "wrap"]

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def _file(conf: Config, key: str) -> str | None:
    path = conf.get_optional_str(key)
    if path is not None and not Path(path).is_file():
        msg = f"config key {key!r}: {path!r} is not a readable file"
        raise ConfigError(msg)
    return path


def _load_chain(ctx: ssl.SSLContext, conf: Config, cert: str, key: str | None) -> None:
    password = conf.get_optional_str(TLS_KEY_PASSWORD)
    try:
        # Never None: OpenSSL would then ask for a passphrase on the terminal and hang a worker.
        ctx.load_cert_chain(cert, key, password if password is not None else _no_password)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        msg = (
            f"config keys {TLS_CERT_FILE!r} / {TLS_KEY_FILE!r}: cannot load certificate {cert!r} with key "
            f"{key or cert!r} ({reason}); check that the key matches the certificate and, for an encrypted "
            f"key, that {TLS_KEY_PASSWORD!r} is its password"
        )
        raise ConfigError(msg) from exc


def _no_password() -> str:
    return ""


def _load_cas(ctx: ssl.SSLContext, conf: Config, purpose: ssl.Purpose) -> None:
    ca = _file(conf, TLS_CA_FILE)
    if ca is None:
        ctx.load_default_certs(purpose)
        return
    try:
        ctx.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        msg = f"config key {TLS_CA_FILE!r}: {ca!r} is not a PEM bundle of CA certificates ({exc.reason or exc})"
        raise ConfigError(msg) from exc


def _base(conf: Config, side: int) -> ssl.SSLContext:
    ctx = ssl.SSLContext(side)
    ctx.minimum_version = _VERSIONS[conf.get_choice(TLS_MIN_VERSION, tuple(_VERSIONS))]
    return ctx


def server_context(conf: Config) -> ssl.SSLContext | None:
    """Build the server side's context; None when ``storm.messaging.tcp.tls.enable`` is false.

    Raises
    ------
    ConfigError
        TLS is on but the certificate or key is missing or unreadable, or a key is invalid.
    """
    if not conf.get_bool(TLS_ENABLE):
        return None
    cert = _file(conf, TLS_CERT_FILE)
    if cert is None:
        msg = (
            f"{TLS_ENABLE} is true but {TLS_CERT_FILE!r} is not set: a TLS server needs its certificate "
            f"(PEM) and {TLS_KEY_FILE!r} its private key"
        )
        raise ConfigError(msg)
    ctx = _base(conf, ssl.PROTOCOL_TLS_SERVER)
    _load_chain(ctx, conf, cert, _file(conf, TLS_KEY_FILE))
    mode = _CLIENT_AUTH[conf.get_choice(TLS_CLIENT_AUTH, tuple(_CLIENT_AUTH))]
    if mode != ssl.CERT_NONE:
        _load_cas(ctx, conf, ssl.Purpose.CLIENT_AUTH)
    ctx.verify_mode = mode
    return ctx


def client_context(conf: Config) -> ssl.SSLContext | None:
    """Build the client side's context; None when TLS is off.

    Raises
    ------
    ConfigError
        A configured file is missing or invalid.
    """
    if not conf.get_bool(TLS_ENABLE):
        return None
    ctx = _base(conf, ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = conf.get_bool(TLS_HOSTNAME_VERIFICATION)
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load_cas(ctx, conf, ssl.Purpose.SERVER_AUTH)
    cert = _file(conf, TLS_CERT_FILE)
    if cert is not None:
        _load_chain(ctx, conf, cert, _file(conf, TLS_KEY_FILE))
    return ctx


def wrap(
    ctx: ssl.SSLContext, sock: socket.socket, *, server_side: bool, server_hostname: str | None = None
) -> ssl.SSLSocket:
    """``ctx.wrap_socket(sock)`` that leaves no socket open when it fails.

    A server side only wraps (its handshake runs in the I/O loop); a client side also
    handshakes, bounded by the timeout set on ``sock``.  On any error ``sock`` is closed
    and the error raised.  CPython's ``SSLSocket._create`` takes over ``sock``'s descriptor
    and, when the peer reset the connection before the wrap (a listener closed with the
    connection in its backlog, a client that gave up before it was accepted), raises
    ``ConnectionResetError`` without closing the half-built ``SSLSocket``: its descriptor
    stays open until the garbage collector finds it.  That object is the ``self`` of the
    ``_create`` frame in the traceback; it is closed here.
    """
    try:
        return ctx.wrap_socket(
            sock, server_side=server_side, server_hostname=server_hostname, do_handshake_on_connect=not server_side
        )
    except (OSError, ValueError) as exc:  # ssl.SSLError and timeouts are OSErrors
        sock.close()  # a no-op once detached
        tb = exc.__traceback__
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            if isinstance(owner, ssl.SSLSocket):
                owner.close()
            tb = tb.tb_next
        raise
