"""Throwaway TLS material for tests: a self-signed CA and server/client certificates for loopback.

Uses the ``cryptography`` package (a test dependency). Keys are EC P-256; every certificate is
valid for a day, and server certificates name ``localhost``, ``127.0.0.1`` and ``::1``.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TlsFiles:
    """PEM files written by :func:`make_tls_files`."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(directory: Path, client_name: str = "root") -> TlsFiles:
    """Write a CA, a loopback server certificate and a client certificate into ``directory``.

    The client certificate's common name is ``client_name`` (etcd maps it to a user when
    client-certificate auth is on).

    Raises:
        RuntimeError: the ``cryptography`` package is not installed.
    """
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise RuntimeError("TLS tests need the 'cryptography' package: pip install cryptography.") from error

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(common_name: str) -> "x509.Name":
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def builder(subject: str, issuer: str, public_key: object) -> "x509.CertificateBuilder":
        return (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def write(path: Path, key: object, cert: "x509.Certificate") -> None:
        path.with_suffix(".key").write_bytes(
            key.private_bytes(  # type: ignore[attr-defined]
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        builder("etcd-elastic test CA", "etcd-elastic test CA", ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    write(directory / "ca", ca_key, ca_cert)

    def leaf(stem: str, common_name: str, usages: list["x509.ObjectIdentifier"], san: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        cert_builder = builder(common_name, "etcd-elastic test CA", key.public_key()).add_extension(
            x509.ExtendedKeyUsage(usages), critical=False
        )
        if san:
            cert_builder = cert_builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.IPAddress(ipaddress.ip_address("::1")),
                    ]
                ),
                critical=False,
            )
        write(directory / stem, key, cert_builder.sign(ca_key, hashes.SHA256()))

    # The server certificate also allows client use: etcd dials itself with it (gateway, health).
    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    leaf("server", "localhost", both, san=True)
    leaf("client", client_name, [ExtendedKeyUsageOID.CLIENT_AUTH], san=False)
    return TlsFiles(
        ca_cert=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
    )
