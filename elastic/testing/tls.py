"""Throwaway TLS material for tests: a self-signed CA and server/client certificates for loopback.

Uses the ``cryptography`` package (a test dependency). Keys are EC P-256; every certificate is
valid for a day, and server certificates name ``localhost``, ``127.0.0.1`` and ``::1``. Each CA
has a name of its own and key identifiers, as real ones do: a bundle of two test CAs then
verifies certificates of either (OpenSSL picks an issuer by name and key identifier).
:func:`rotate_server_ca` rotates a server to a new CA the way operators do.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable


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

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = f"etcd-elastic test CA {secrets.token_hex(4)}"

    def builder(subject: str, public_key: object) -> "x509.CertificateBuilder":
        return (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(ca_name))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)  # type: ignore[arg-type]
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
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

    ca_cert = (
        builder(ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    write(directory / "ca", ca_key, ca_cert)

    def leaf(stem: str, common_name: str, usages: list["x509.ObjectIdentifier"], san: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        cert_builder = builder(common_name, key.public_key()).add_extension(
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


def rotate_server_ca(files: TlsFiles, directory: Path, ca_bundles: Iterable[Path] = ()) -> TlsFiles:
    """Rotate the server of ``files`` to a new CA the usual way, before its restart.

    Every CA file (``files.ca_cert`` and each of ``ca_bundles``) is rewritten in place to hold
    the old CA and the new one, and the server certificate and key at ``files``' paths are
    replaced by ones the new CA signed. The client certificates stay the old CA's (still
    trusted: the bundles hold it). Returns the new CA's own files (written into ``directory``).
    """
    new = make_tls_files(directory)
    both = files.ca_cert.read_bytes() + new.ca_cert.read_bytes()
    for bundle in (files.ca_cert, *ca_bundles):
        bundle.write_bytes(both)
    shutil.copyfile(new.server_key, files.server_key)
    shutil.copyfile(new.server_cert, files.server_cert)
    return new
