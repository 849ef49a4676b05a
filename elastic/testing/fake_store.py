"""Harness for the in-memory fake backend (unit tests; no server process)."""

from __future__ import annotations

from backends.api import KVBackend
from backends.fake import InMemoryStore
from elastic.testing.harness import BackendHarness


class FakeHarness(BackendHarness):
    """An :class:`InMemoryStore` with a token; stopping it is the store's fault injection."""

    name = "fake"

    def __init__(self) -> None:
        self.store = InMemoryStore(token="fake-token")

    def connect(self, *, request_timeout: float = 5.0) -> KVBackend:
        return self.store.client()

    def connect_with_wrong_credentials(self) -> KVBackend:
        return self.store.client(token="wrong-token")

    def stop_server(self) -> None:
        self.store.stop()

    def start_server(self) -> None:
        self.store.start()

    def close(self) -> None:
        self.store.close()
