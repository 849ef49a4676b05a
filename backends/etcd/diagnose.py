"""A second look at etcd endpoints that would not connect: TLS on one side only, or not etcd?

gRPC reports a TLS mismatch as a closed connection ("Socket closed", "Handshake read failed"),
as it does a service that is not etcd, or etcd restarting. At start-up, before the launcher
gives up, one TLS handshake per endpoint (the certificate not checked: only whether the port
speaks TLS) tells them apart, so the one line says "use https://", "use http://" or "not an
etcd client URL" instead of a guess.
"""

from __future__ import annotations

import socket
import ssl
from typing import Callable

from backends.endpoints import UNIX, Endpoint
from backends.etcd.config import EtcdConfig
from backends.etcd.translate import DialFailure, RequestNotSent

PROBE_TIMEOUT_S = 2.0
"""At most this long per endpoint for the handshake (it runs only on the way to an error)."""

SERVES_TLS = ("it serves TLS while the endpoint says plain http; use https:// endpoints (or --rdzv-conf "
              "protocol=https) with --rdzv-conf cacert=CA_FILE")
NOT_ETCD = ("it accepted the connection but does not speak etcd's gRPC; it is not an etcd client URL (etcd serves "
            "clients on port 2379 by default: check the port), or etcd is restarting")
SERVES_PLAIN = ("it serves plain http while TLS is configured; use http:// endpoints without cacert=/cert=/key=, "
                "or start etcd with --cert-file/--key-file and https:// client URLs")


def speaks_tls(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> bool | None:
    """Whether ``host:port`` answers a TLS handshake in TLS (True: it completes or the server
    sends a TLS alert), accepts TCP but not TLS (False), or cannot be reached (None: no conclusion)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    with raw:
        try:
            with context.wrap_socket(raw, server_hostname=host):
                return True
        except ssl.SSLError as error:
            # A TLS alert (e.g. "bad certificate": a client certificate is required) is TLS
            # spoken back; a plain server closes the connection or answers with bytes that
            # are no TLS record ("wrong version number").
            return "ALERT" in (error.reason or "").upper()
        except TimeoutError:
            return None  # a silent port (a stopped process): no conclusion
        except OSError:
            return False


def second_look(error: RequestNotSent, config: EtcdConfig,
                probe: Callable[[str, int], bool | None] = speaks_tls) -> RequestNotSent | None:
    """The error naming the cause behind ``error`` when a handshake at every endpoint that
    answered shows it (TLS on one side only; else, for a closed or garbled connection, not
    etcd); None when it shows nothing (the error stands as it is).

    Only for connections that something accepted and then dropped or garbled: a refused
    connection, a name that does not resolve, a failed TLS handshake have their own line.
    """
    if error.kind not in (DialFailure.CLOSED, DialFailure.PROTOCOL):
        return None
    endpoints = [endpoint for endpoint in config.endpoints if isinstance(endpoint, Endpoint) and endpoint.scheme != UNIX]
    if not endpoints:
        return None
    seen = [probe(endpoint.host, endpoint.port) for endpoint in endpoints]
    answered = [(endpoint, tls) for endpoint, tls in zip(endpoints, seen) if tls is not None]
    mismatched = [endpoint for endpoint, tls in answered if tls != config.tls]
    if not answered or mismatched and len(mismatched) != len(answered):
        return None
    where = ", ".join(endpoint.netloc for endpoint, _ in answered)
    if mismatched:
        advice, kind = (SERVES_PLAIN if config.tls else SERVES_TLS), DialFailure.TLS
    else:
        advice, kind = NOT_ETCD, DialFailure.PROTOCOL
    return RequestNotSent(f"Could not connect to etcd at {where}: {advice}.", kind, endpoint=where, advice=advice)
