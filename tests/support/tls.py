"""Certificates made by the tests themselves (cryptography): a CA, node certificates, a rogue CA."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    """Paths of PEM files: ``ca`` signs ``node`` (127.0.0.1, localhost; server and client use)
    and ``wrong_host`` (other.example only); ``rogue_ca`` signs ``rogue``."""

    ca: Path
    node_cert: Path
    node_key: Path
    wrong_host_cert: Path
    wrong_host_key: Path
    rogue_ca: Path
    rogue_cert: Path
    rogue_key: Path
    encrypted_key: Path  # node_key encrypted with the password "pw"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> None:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    )
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))


def _ca(directory: Path, name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key, path


def _leaf(
    directory: Path,
    name: str,
    names: list[x509.GeneralName],
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey, Path],
) -> tuple[Path, Path, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key, _ = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path = directory / f"{name}.pem"
    key_path = directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return cert_path, key_path, key


def make_pki(directory: Path) -> Pki:
    """Write a small PKI into ``directory`` and return its paths."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "test-ca")
    rogue = _ca(directory, "rogue-ca")
    local = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    node_cert, node_key, key = _leaf(directory, "node", local, ca)
    wrong_cert, wrong_key, _ = _leaf(directory, "wrong-host", [x509.DNSName("other.example")], ca)
    rogue_cert, rogue_key, _ = _leaf(directory, "rogue", local, rogue)
    encrypted = directory / "node-encrypted.key"
    _write_key(encrypted, key, b"pw")
    return Pki(ca[2], node_cert, node_key, wrong_cert, wrong_key, rogue[2], rogue_cert, rogue_key, encrypted)


def tls_conf(pki: Pki, **extra: object) -> dict[str, object]:
    """A tcp conf with TLS on, this node's certificate and mutual TLS required."""
    return {
        "storm.messaging.transport": "tcp",
        "storm.messaging.tcp.tls.enable": True,
        "storm.messaging.tcp.tls.cert.file": str(pki.node_cert),
        "storm.messaging.tcp.tls.key.file": str(pki.node_key),
        "storm.messaging.tcp.tls.ca.file": str(pki.ca),
        "storm.messaging.tcp.tls.client.auth": "required",
        **extra,
    }
