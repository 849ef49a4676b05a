"""What a test etcd is: the options it is started with, the interface every mode serves, and its error.

The modes (:mod:`.local`, :mod:`.container`, :mod:`.external`) subclass :class:`EtcdServer`;
:func:`~elastic.testing.etcd_server.start.start_etcd_server` picks one.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from backends.etcd import EtcdBackend, EtcdConfig
from elastic.testing.tls import TlsFiles

ENV_MODE = "ETCD_TEST_BACKEND"
ROOT_USER = "root"


class EtcdServerError(RuntimeError):
    """No etcd could be started or reached for the tests; the message says how to provide one."""


@dataclass(frozen=True)
class EtcdServerOptions:
    """How a test etcd is set up.

    Attributes:
        auth: enable auth with user ``root`` and ``password``.
        password: the root user's password.
        tls: serve clients over TLS, with certificates from a throwaway CA.
        client_cert_auth: also require client certificates (implies ``tls``).
        max_request_bytes: etcd's ``--max-request-bytes`` (None: etcd's default, 1.5 MiB).
        auth_token_ttl: etcd's ``--auth-token-ttl``, seconds an unused auth token lives (None:
            etcd's default, 300 s); short values test token expiry.
        startup_timeout: seconds to wait for ``/health`` to answer.
        unix_socket: also serve clients on a unix socket (binary mode; see
            :attr:`BinaryEtcdServer.unix_endpoint`).
    """

    auth: bool = False
    password: str = "etcd-elastic-test"
    tls: bool = False
    client_cert_auth: bool = False
    max_request_bytes: int | None = None
    auth_token_ttl: int | None = None
    startup_timeout: float = 30.0
    unix_socket: bool = False

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.client_cert_auth

    def limit_flags(self) -> list[str]:
        """etcd flags for the limits set here (the same for the binary and the container)."""
        flags = []
        if self.max_request_bytes is not None:
            flags.append(f"--max-request-bytes={self.max_request_bytes}")
        if self.auth_token_ttl is not None:
            flags.append(f"--auth-token-ttl={self.auth_token_ttl}")
        return flags


class EtcdServer(abc.ABC):
    """A running etcd for tests; use as a context manager or call :meth:`close`."""

    mode: str = "abstract"

    def __init__(self, options: EtcdServerOptions) -> None:
        self.options = options
        self.tls_files: TlsFiles | None = None

    @property
    @abc.abstractmethod
    def endpoints(self) -> str:
        """Client URLs as ``host:port,...`` (``https://`` when TLS is on)."""

    def client_config(self, **overrides: Any) -> EtcdConfig:
        """An :class:`EtcdConfig` with valid credentials and certificates; ``overrides`` win."""
        settings: dict[str, Any] = {"endpoints": self.endpoints}
        if self.options.auth:
            settings.update(user=ROOT_USER, password=self.options.password)
        if self.tls_files is not None:
            settings.update(ca_cert=self.tls_files.ca_cert)
            if self.options.client_cert_auth:
                settings.update(client_cert=self.tls_files.client_cert, client_key=self.tls_files.client_key)
        settings.update(overrides)
        return EtcdConfig(**settings)

    def connect(self, **overrides: Any) -> EtcdBackend:
        """A new client with :meth:`client_config`."""
        return EtcdBackend(self.client_config(**overrides))

    def stop(self, graceful: bool = True) -> None:
        """Stop etcd, keeping its data, so :meth:`start` can bring it back on the same address."""
        raise self._not_restartable()

    def start(self) -> None:
        """Start etcd again after :meth:`stop`."""
        raise self._not_restartable()

    def failure_log(self) -> str:
        """What etcd wrote, for a failed startup's message ("" when the tests cannot read it)."""
        return ""

    def _not_restartable(self) -> EtcdServerError:
        return EtcdServerError(
            f"An etcd in {self.mode!r} mode cannot be stopped and restarted by the tests; "
            f"run them with {ENV_MODE}=binary (a local etcd binary)."
        )

    @abc.abstractmethod
    def close(self) -> None:
        """Stop etcd and remove what it used; idempotent."""

    def __enter__(self) -> "EtcdServer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
