"""In-memory fake backend for unit tests of the engine: etcd semantics, no network.

:class:`InMemoryStore` plays the server: one :class:`~backends.kvstate.KVState` (the same
state machine the TCP store serves, so the two cannot disagree), a lock, the live watches,
and a sweeper thread that expires leases on time. :meth:`InMemoryStore.client` opens
:class:`FakeBackend` clients on it.

Fault injection is public API, as in kazoo's test harness: :meth:`InMemoryStore.stop` makes
every client call fail with :class:`BackendConnectionError` until :meth:`InMemoryStore.start`;
live watches stay registered and deliver what happens after the store is back, as a backend's
watch resumes from its last revision (the contract, :mod:`backends.api`).
:meth:`InMemoryStore.expire_lease` expires a lease at once.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from backends.api import (
    NO_LEASE,
    KVBackend,
    Lease,
    QueueWatch,
    RangeResult,
    ReadResult,
    Watch,
    WatchEvent,
    WriteResult,
)
from backends.errors import BackendAuthError, BackendClosedError, BackendConnectionError
from backends.kvstate import DEFAULT_HISTORY_LIMIT, DEFAULT_MAX_VALUE_BYTES, KVState, Outcome, StateLimits
from backends.txn import Txn, TxnResult


class InMemoryStore:
    """The fake's "server": shared state, watches and lease expiry for any number of clients.

    Args:
        token: when set, clients must present it (wrong token: BackendAuthError).
        clock: monotonic clock; with a fake clock pass ``auto_expire=False`` and call
            :meth:`expire_due` yourself.
        auto_expire: run a sweeper thread that expires leases when they are due.
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        auto_expire: bool = True,
    ) -> None:
        self.token = token
        self.state = KVState(clock=clock, limits=StateLimits(max_value_bytes=max_value_bytes, history_limit=history_limit))
        self._clock = clock
        self._lock = threading.Condition()
        self._watches: list[tuple[str, QueueWatch]] = []
        self._available = True
        self._shutdown = False
        self._sweeper = None
        if auto_expire:
            self._sweeper = threading.Thread(target=self._sweep, name="fake-store-lease-sweeper", daemon=True)
            self._sweeper.start()

    def client(self, token: str | None = None) -> "FakeBackend":
        """Open a client; ``token`` defaults to the store's own (valid) token."""
        return FakeBackend(self, self.token if token is None else token)

    # -- fault injection -----------------------------------------------------------------------
    def stop(self) -> None:
        """Make the store unreachable: calls raise BackendConnectionError. Live watches wait
        (nothing changes while it is stopped) and carry on once it is started again."""
        with self._lock:
            self._available = False

    def start(self, *, renew_leases: bool = False) -> None:
        """Make the store reachable again, with its data intact.

        By default leases whose TTL passed meanwhile expire at once (the store's clock ran on,
        as for a client cut off from a healthy etcd). ``renew_leases`` gives every lease its
        full TTL again instead, as a new etcd leader does after a quorum loss.
        """
        with self._lock:
            if renew_leases:
                self.state.renew_all_leases()
            self._available = True
            self._lock.notify_all()

    def expire_lease(self, lease_id: int) -> None:
        """Expire ``lease_id`` now, as if its TTL had passed (its keys are deleted, watchers told)."""
        self.call(lambda state: state.revoke(lease_id))

    def expire_due(self) -> None:
        """Expire every lease whose deadline has passed on the store's clock."""
        self.call(lambda state: Outcome(None, state.expire_due()))

    def close(self) -> None:
        """Stop the sweeper thread; idempotent."""
        with self._lock:
            self._shutdown = True
            self._lock.notify_all()

    # -- used by clients ------------------------------------------------------------------------
    def call(self, operation):
        """Run ``operation(state)`` under the lock; fan out the events of its Outcome, if any.

        Raises:
            BackendConnectionError: the store is stopped.
        """
        with self._lock:
            if not self._available:
                raise BackendConnectionError("The in-memory store is stopped (fault injection); retry after start().")
            outcome = operation(self.state)
            self._lock.notify_all()  # a grant or keepalive may move the next expiry
            if not isinstance(outcome, Outcome):
                return outcome
            if outcome.events:
                self._fan_out(outcome.events)
            return outcome.result

    def open_watch(self, prefix: str, start_revision: int | None) -> QueueWatch:
        """Register a watch, replaying history from ``start_revision`` atomically with registration."""
        with self._lock:
            if not self._available:
                raise BackendConnectionError("The in-memory store is stopped (fault injection); retry after start().")
            start = self.state.revision + 1 if start_revision is None else start_revision
            holder: list[QueueWatch] = []
            watch = QueueWatch(start, on_cancel=lambda: self._drop_watch(holder[0]))
            holder.append(watch)
            try:
                watch.deliver(self.state.events_since(prefix, start))
            except Exception as error:  # CompactedError reaches the caller through the watch
                watch.fail(error)  # type: ignore[arg-type]
                return watch
            self._watches.append((prefix, watch))
            return watch

    def _drop_watch(self, watch: QueueWatch) -> None:
        with self._lock:
            self._watches = [(prefix, live) for prefix, live in self._watches if live is not watch]

    def _fan_out(self, events: tuple[WatchEvent, ...]) -> None:
        for prefix, watch in self._watches:
            matching = [event for event in events if event.kv.key.startswith(prefix)]
            if matching:
                watch.deliver(matching)

    def _sweep(self) -> None:
        with self._lock:
            while not self._shutdown:
                due = self.state.next_expiry()
                timeout = None if due is None else max(due - self._clock(), 0.0)
                if timeout is None or timeout > 0:
                    self._lock.wait(timeout)
                    continue
                if self._available:
                    events = self.state.expire_due()
                    if events:
                        self._fan_out(events)
                else:
                    self._lock.wait(0.05)


class FakeBackend(KVBackend):
    """A client of an :class:`InMemoryStore`; implements the whole contract in-process."""

    def __init__(self, store: InMemoryStore, token: str | None) -> None:
        self._store = store
        self._token = token
        self._closed = False
        self._watches: list[Watch] = []
        self.max_value_bytes = store.state.max_value_bytes

    def _call(self, operation):
        if self._closed:
            raise BackendClosedError("This fake backend client was closed.")
        if self._store.token is not None and self._token != self._store.token:
            raise BackendAuthError("The in-memory store rejected the token; pass the store's token.")
        return self._store.call(operation)

    def get(self, key: str) -> ReadResult:
        return self._call(lambda state: state.get(key))

    def get_prefix(self, prefix: str) -> RangeResult:
        return self._call(lambda state: state.get_prefix(prefix))

    def put(self, key: str, value: bytes, *, lease: int = NO_LEASE) -> int:
        return self._call(lambda state: state.put(key, value, lease)).revision

    def txn(self, txn: Txn) -> TxnResult:
        return self._call(lambda state: state.txn(txn))

    def delete(self, key: str) -> WriteResult:
        return self._call(lambda state: state.delete(key))

    def delete_prefix(self, prefix: str) -> int:
        return self._call(lambda state: state.delete_prefix(prefix))

    def grant(self, ttl: float) -> Lease:
        return self._call(lambda state: state.grant(ttl))

    def keepalive(self, lease_id: int) -> float:
        return self._call(lambda state: state.keepalive(lease_id))

    def revoke(self, lease_id: int) -> bool:
        return self._call(lambda state: state.revoke(lease_id))

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        self._call(lambda state: None)  # closed / auth / availability checks
        watch = self._store.open_watch(prefix, start_revision)
        self._watches.append(watch)
        return watch

    def compact(self, revision: int) -> None:
        self._call(lambda state: state.compact(revision))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for watch in self._watches:
            watch.cancel()
