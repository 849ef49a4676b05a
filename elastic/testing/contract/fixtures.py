"""What every part of the backend contract shares: the per-test client and key prefix, the lease
TTL, and reading watch events."""

from __future__ import annotations

import time
import uuid

import pytest

from backends.api import KVBackend, WatchEvent
from backends.errors import BackendError
from elastic.testing.harness import BackendHarness

LEASE_TTL = 2.0
"""Lease TTL the suite uses: etcd's minimum, so every backend is held to the same promise."""


def collect_events(watch, count: int, timeout: float) -> list[WatchEvent]:
    """Read from ``watch`` until ``count`` events arrived or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    events: list[WatchEvent] = []
    while len(events) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        events.extend(watch.get(timeout=remaining))
    return events


def describe(events: list[WatchEvent]) -> list[tuple[str, str, bytes]]:
    """Events as comparable (type, key, value) tuples."""
    return [(event.type.value, event.kv.key, event.kv.value) for event in events]


class ContractFixtures:
    """The fixtures of every contract test: ``harness`` (the subclass's), a ``backend`` client and a
    fresh key ``prefix``, both cleaned up afterwards."""

    @pytest.fixture
    def harness(self) -> BackendHarness:  # pragma: no cover - must be overridden
        raise NotImplementedError("A BackendContract subclass must define a `harness` fixture.")

    @pytest.fixture
    def backend(self, harness: BackendHarness):
        client = harness.connect()
        yield client
        client.close()

    @pytest.fixture
    def prefix(self, backend: KVBackend):
        name = f"/contract/{uuid.uuid4().hex[:12]}/"
        yield name
        try:
            backend.delete_prefix(name)
        except BackendError:
            pass
