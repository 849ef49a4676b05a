"""What the backend contract suite needs from a backend under test.

A third-party backend passes the contract by subclassing
:class:`elastic.testing.contract.BackendContract` and providing a ``harness`` fixture that
returns a :class:`BackendHarness`. Fault injection (stopping the server under a live client)
is part of the harness, as in kazoo's test harness.
"""

from __future__ import annotations

import abc

from backends.api import KVBackend


class BackendHarness(abc.ABC):
    """A running server (real or fake) and a way to open clients and inject faults."""

    #: Short name used in test ids and messages, e.g. "etcd", "tcp", "fake".
    name: str = "backend"

    #: Whether :meth:`start_server` brings back the data and history it had (etcd does; a
    #: restarted store with fresh state does not, and its watches must then say "compacted").
    restart_keeps_history: bool = True

    @abc.abstractmethod
    def connect(self, *, request_timeout: float = 5.0) -> KVBackend:
        """Open a new client to the running server with valid credentials."""

    @abc.abstractmethod
    def connect_with_wrong_credentials(self) -> KVBackend:
        """Open a client with wrong credentials.

        The client may raise ``BackendAuthError`` here or on its first request; either passes.
        """

    @abc.abstractmethod
    def stop_server(self) -> None:
        """Stop the server abruptly while clients stay open (clients must then fail fast)."""

    @abc.abstractmethod
    def start_server(self) -> None:
        """Start the server again after :meth:`stop_server`, at the same address."""

    def close(self) -> None:
        """Release everything the harness started (called once per harness)."""
