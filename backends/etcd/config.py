"""Settings of the etcd v3 backend: endpoints, TLS, credentials and timeouts, validated eagerly."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from backends.endpoints import UNIX, Endpoint, parse_endpoints
from backends.etcd.channel_options import DEFAULT_MAX_RESPONSE_BYTES
from backends.errors import EndpointError
from backends.retry import RetryPolicy

log = logging.getLogger(__name__)

DEFAULT_PORT = 2379
"""etcd's client port, used when an endpoint names none."""

MAX_VALUE_BYTES = 1024 * 1024
"""Largest value we send; etcd's own request limit (``--max-request-bytes``) is 1.5 MiB by default."""


_MAX_MESSAGE_BYTES = 2**31 - 1 - 512 * 1024
"""gRPC message limits are C ints; the send limit adds etcd's 512 KiB overhead to max_value_bytes."""


def _default_retry() -> RetryPolicy:
    # Attempts are bounded by the request deadline anyway; backoff matches the channel's
    # reconnect backoff (100 ms .. 1 s) so a restarted member is found again quickly.
    return RetryPolicy(max_attempts=8, initial_backoff=0.1, max_backoff=1.0)


@dataclass(frozen=True)
class EtcdConfig:
    """How to reach an etcd v3 cluster.

    ``endpoints`` may be given as ``"host:port,host:port"`` or a sequence of strings; it is
    stored parsed; ``unix:///path/to/etcd.sock`` names a unix socket (without TLS). TLS is used
    when any endpoint is ``https://`` or any certificate path is set; every endpoint then uses TLS.

    Attributes:
        endpoints: the cluster members' client URLs, tried in order with failover.
        ca_cert: PEM file of the CA that signed the servers' certificates (None: system roots).
        client_cert: PEM client certificate, for servers with ``--client-cert-auth``.
        client_key: PEM key of ``client_cert``.
        user: etcd user name (auth enabled on the server); needs ``password``.
        password: that user's password.
        dial_timeout: seconds to wait for a connection to one endpoint before trying the next.
        request_timeout: seconds one call may take in all, including failover and retries.
        watch_reconnect_timeout: seconds between two warnings that lost watches still wait for an
            endpoint (they keep resuming until one answers, or the watch is cancelled or the client closed).
        watch_progress_interval: seconds between two progress requests on the watch stream, which
            keep each watch's resume point fresh while its prefix is quiet (see :mod:`backends.etcd.watch`).
        max_value_bytes: largest value a write accepts (checked before sending).
        max_response_bytes: largest response accepted (32 MiB by default); a larger one fails
            the call with a :class:`~backends.errors.ProtocolError` instead of taking memory.
        retry: backoff between rounds over the endpoints, for requests safe to resend.

    Raises (from the constructor):
        EndpointError: an endpoint, a timeout, the credentials or a certificate path is invalid.
    """

    endpoints: tuple[Endpoint, ...] | str | Sequence[str]
    ca_cert: str | Path | None = None
    client_cert: str | Path | None = None
    client_key: str | Path | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    dial_timeout: float = 5.0
    request_timeout: float = 5.0
    watch_reconnect_timeout: float = 30.0
    watch_progress_interval: float = 5.0
    max_value_bytes: int = MAX_VALUE_BYTES
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    retry: RetryPolicy = field(default_factory=_default_retry)

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", _normalize_endpoints(self.endpoints))
        for name in ("dial_timeout", "request_timeout", "watch_reconnect_timeout", "watch_progress_interval"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise EndpointError(f"The etcd {name} ({value!r}) must be a positive number of seconds.")
        for name in ("max_value_bytes", "max_response_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= _MAX_MESSAGE_BYTES:
                raise EndpointError(
                    f"The etcd {name} ({value!r}) must be a positive integer of at most {_MAX_MESSAGE_BYTES} bytes."
                )
        _check_credentials(self.user, self.password)
        _check_certificates(self.ca_cert, self.client_cert, self.client_key)
        if self.tls and any(endpoint.scheme == UNIX for endpoint in self.endpoints):  # type: ignore[union-attr]
            raise EndpointError(
                f"The etcd endpoints {self.endpoint_list} mix TLS with a unix: socket, which is not supported; "
                "use https:// host:port endpoints for TLS, or a unix: socket without certificates."
            )
        networked = any(endpoint.scheme != UNIX for endpoint in self.endpoints)  # type: ignore[union-attr]
        if self.user is not None and not self.tls and networked:
            log.warning(
                "The etcd password of user %r goes to %s over plain http, readable by anyone on the "
                "network path; use https:// endpoints (or --rdzv-conf protocol=https) with cacert=.",
                self.user, self.endpoint_list,
            )

    @property
    def tls(self) -> bool:
        """Whether connections use TLS (an https:// endpoint, or a certificate was given)."""
        return any(endpoint.scheme == "https" for endpoint in self.endpoints) or any(  # type: ignore[union-attr]
            path is not None for path in (self.ca_cert, self.client_cert, self.client_key)
        )

    @property
    def endpoint_list(self) -> str:
        """The endpoints as ``host:port,host:port``, for messages."""
        return ",".join(str(endpoint) for endpoint in self.endpoints)  # type: ignore[union-attr]


def _normalize_endpoints(value: object) -> tuple[Endpoint, ...]:
    if isinstance(value, tuple) and value and all(isinstance(item, Endpoint) for item in value):
        return value
    if isinstance(value, (str, list, tuple)):
        return parse_endpoints(value, DEFAULT_PORT, allow_unix=True)  # type: ignore[arg-type]
    raise EndpointError(
        f"The etcd endpoints ({value!r}) must be a string like '127.0.0.1:2379,10.0.0.2:2379' or a list of them."
    )


def _check_credentials(user: str | None, password: str | None) -> None:
    if user is None and password is None:
        return
    if not user:
        raise EndpointError("An etcd password was given without a user name; set both or neither.")
    if password is None:
        raise EndpointError(f"The etcd user {user!r} was given without a password; set both or neither.")


def _check_certificates(ca_cert: object, client_cert: object, client_key: object) -> None:
    if (client_cert is None) != (client_key is None):
        raise EndpointError("An etcd client certificate needs its key and a key needs its certificate; set both.")
    for name, path in (("ca_cert", ca_cert), ("client_cert", client_cert), ("client_key", client_key)):
        if path is not None and not os.access(path, os.R_OK):  # type: ignore[arg-type]
            raise EndpointError(f"The etcd {name} file {str(path)!r} does not exist or is not readable.")
