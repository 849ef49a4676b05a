"""The backend contract suite's view of a test etcd (:class:`~elastic.testing.harness.BackendHarness`)."""

from __future__ import annotations

from typing import Any

from backends.etcd import EtcdBackend
from elastic.testing.etcd_server.server import ROOT_USER, EtcdServer, EtcdServerError
from elastic.testing.harness import BackendHarness


class EtcdHarness(BackendHarness):
    """The contract suite's view of an etcd server (key prefixes per test come from the suite).

    ``stop_server``/``start_server`` restart the etcd process and need binary mode; other
    modes raise :class:`EtcdServerError` saying so. Wrong-credential tests need a server
    started with ``auth=True``.
    """

    name = "etcd"

    def __init__(self, server: EtcdServer, **client_settings: Any) -> None:
        """``client_settings``: extra :class:`EtcdConfig` fields of every client (e.g. ``max_response_bytes``)."""
        self.server = server
        self._client_settings = client_settings
        self._clients: list[EtcdBackend] = []
        self._stopped = False

    def connect(self, *, request_timeout: float = 5.0) -> EtcdBackend:
        client = self.server.connect(request_timeout=request_timeout, dial_timeout=min(request_timeout, 2.0),
                                     **self._client_settings)
        self._clients.append(client)
        return client

    def connect_with_wrong_credentials(self) -> EtcdBackend:
        if not self.server.options.auth:
            raise EtcdServerError("Wrong-credential tests need an etcd started with EtcdServerOptions(auth=True).")
        client = self.server.connect(user=ROOT_USER, password=self.server.options.password + "-wrong",
                                     **self._client_settings)
        self._clients.append(client)
        return client

    def stop_server(self) -> None:
        self.server.stop(graceful=False)
        self._stopped = True

    def start_server(self) -> None:
        self.server.start()
        self._stopped = False

    def close(self) -> None:
        """Close the clients it opened and restart the server if a test left it stopped."""
        clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        if self._stopped:
            self.start_server()
