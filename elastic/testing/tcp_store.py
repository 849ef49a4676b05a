"""A :class:`~elastic.testing.harness.BackendHarness` for the built-in TCP store.

Runs an embedded server on a free loopback port with a random token. ``stop_server`` and
``start_server`` restart it on the same port; by default the restarted store has fresh state,
like a restarted ``elastic-store`` process (pass ``keep_state=True`` to restart with the data).
"""

from __future__ import annotations

import secrets

from backends.kvstate import KVState
from backends.tcp.client import TcpStoreBackend
from backends.tcp.config import TcpStoreConfig
from backends.tcp.server import StoreServerHandle, start_server
from elastic.testing.harness import BackendHarness

__all__ = ["TcpStoreHarness"]


class TcpStoreHarness(BackendHarness):
    """An embedded TCP store on loopback and clients for it."""

    name = "tcp"

    def __init__(self, *, keep_state: bool = False, host: str = "127.0.0.1", **server_options: object) -> None:
        self.token = secrets.token_hex(16)
        self.host = host
        self.keep_state = keep_state
        self.restart_keeps_history = keep_state
        self._server_options = server_options
        self._handle: StoreServerHandle | None = start_server(host, 0, self.token, **server_options)  # type: ignore[arg-type]
        self.port = self._handle.port
        self._state: KVState = self._handle.state

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def state(self) -> KVState:
        """The state the running (or last) server serves."""
        return self._state

    def config(self, **options: object) -> TcpStoreConfig:
        """A client config for this store with the right token, plus ``options``."""
        settings: dict[str, object] = {"token": self.token, **options}
        return TcpStoreConfig(self.endpoint, **settings)  # type: ignore[arg-type]

    def connect(self, *, request_timeout: float = 5.0) -> TcpStoreBackend:
        return TcpStoreBackend(self.config(request_timeout=request_timeout)).connect()

    def connect_with_wrong_credentials(self) -> TcpStoreBackend:
        return TcpStoreBackend(self.config(token="not-" + self.token))

    def stop_server(self) -> None:
        if self._handle is not None:
            self._handle.stop()
            self._handle = None

    def start_server(self) -> None:
        if self._handle is not None:
            return
        state = self._state if self.keep_state else None
        self._handle = start_server(self.host, self.port, self.token, state=state, **self._server_options)  # type: ignore[arg-type]
        self._state = self._handle.state

    def close(self) -> None:
        self.stop_server()
