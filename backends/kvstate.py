"""The in-memory key-value state machine with etcd v3 semantics, shared by every in-process host.

The TCP store server and the in-memory fake backend both keep their data in a
:class:`KVState`, so they cannot disagree on semantics. It is deliberately passive:

* no I/O and no threads; it is **not** thread-safe, its host serializes calls;
* time comes from an injected monotonic ``clock``; leases expire only when the host calls
  :meth:`KVState.expire_due` (schedule it at :meth:`KVState.next_expiry`);
* every mutating method returns an :class:`Outcome`: its result plus the watch events it
  produced, which the host fans out to the watchers whose prefix matches;
* what a peer holding the store's token can make it keep is bounded: keys and values
  (``max_live_bytes``, each key counting :data:`KEY_OVERHEAD_BYTES` too: the
  :class:`~backends.keyspace.KeySpace`), leases and their expiry heap (:class:`~backends.leases.LeaseTable`), and the history
  (:class:`~backends.history.EventHistory`); a write past a bound
  raises :class:`~backends.errors.LimitExceededError` and changes nothing.

Revisions follow etcd: an empty store is at revision 1; each write transaction that changes
something (a put, a delete of an existing key, a prefix delete, a lease revocation or expiry
that deletes keys) bumps the revision by exactly one, and all events of that transaction
carry it. Requests that change nothing leave the revision alone.
"""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Generic, Iterable, TypeVar

from backends.api import (
    NO_LEASE,
    EventType,
    KeyValue,
    Lease,
    RangeResult,
    ReadResult,
    WatchEvent,
    WriteResult,
)
from backends.errors import LeaseNotFoundError
from backends.history import DEFAULT_HISTORY_BYTES, DEFAULT_HISTORY_LIMIT, EventHistory
from backends.keyspace import KEY_OVERHEAD_BYTES, KeySpace
from backends.leases import DEFAULT_MAX_LEASES, LeaseRecord, LeaseTable
from backends.txn import Delete, DeleteResult, Put, PutResult, Range, Txn, TxnResult, check_txn

__all__ = [
    "DEFAULT_HISTORY_BYTES",
    "DEFAULT_HISTORY_LIMIT",
    "DEFAULT_MAX_KEY_BYTES",
    "DEFAULT_MAX_LEASES",
    "DEFAULT_MAX_LIVE_BYTES",
    "DEFAULT_MAX_VALUE_BYTES",
    "KEY_OVERHEAD_BYTES",
    "KVState",
    "Outcome",
    "StateLimits",
]

T = TypeVar("T")

DEFAULT_MAX_VALUE_BYTES = 1024 * 1024
"""Largest value a write accepts, matching :attr:`backends.api.KVBackend.max_value_bytes`."""

DEFAULT_MAX_KEY_BYTES = 8 * 1024
"""Longest key (UTF-8 bytes) a write accepts; rendezvous keys are well under 200 bytes."""

DEFAULT_MAX_LIVE_BYTES = 64 * 1024 * 1024
"""Bytes of live keys and values (each key also counts :data:`KEY_OVERHEAD_BYTES`) a store holds at
most; a rendezvous of a thousand nodes holds well under a megabyte."""


@dataclass(frozen=True)
class StateLimits:
    """What one :class:`KVState` holds at most: what a peer holding the store's token can make it keep.

    Attributes:
        max_value_bytes: writes of larger values raise :class:`ValueTooLargeError`.
        max_key_bytes: writes of longer keys (in UTF-8) raise :class:`ValueTooLargeError`.
        max_live_bytes: writes that would make the live keys and values (plus
            :data:`KEY_OVERHEAD_BYTES` per key) exceed it raise :class:`LimitExceededError`.
        max_leases: a grant beyond this many live leases raises :class:`LimitExceededError`.
        history_limit: events kept for replay; the oldest revisions are compacted beyond it.
        history_bytes: bytes of keys and values kept for replay; the oldest revisions (but
            never the newest) are compacted beyond it.

    Raises (from the constructor):
        ValueError: a limit is not positive.
    """

    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    max_key_bytes: int = DEFAULT_MAX_KEY_BYTES
    max_live_bytes: int = DEFAULT_MAX_LIVE_BYTES
    max_leases: int = DEFAULT_MAX_LEASES
    history_limit: int = DEFAULT_HISTORY_LIMIT
    history_bytes: int = DEFAULT_HISTORY_BYTES

    def __post_init__(self) -> None:
        for name, value in (("value size limit", self.max_value_bytes), ("history limit", self.history_limit),
                            ("history size limit", self.history_bytes), ("key size limit", self.max_key_bytes),
                            ("live size limit", self.max_live_bytes), ("lease limit", self.max_leases)):
            if value < 1:
                raise ValueError(f"The {name} ({value}) must be positive.")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What a mutating call returned, and the watch events it produced, in revision order."""

    result: T
    events: tuple[WatchEvent, ...] = ()


class KVState:
    """Keys, revisions, leases and a bounded event history, with etcd v3 semantics.

    Args:
        clock: monotonic clock in seconds (injectable for tests).
        limits: what this state holds at most (:class:`StateLimits`).
        store_id: identifies this state; a host reports it so clients can tell a restarted
            store with fresh state from a reconnect to the same one. Random by default.
        rng: source of lease ids (injectable for tests).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        limits: StateLimits = StateLimits(),
        store_id: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._keys = KeySpace(limits.max_key_bytes, limits.max_value_bytes, limits.max_live_bytes)
        self.store_id = store_id or uuid.uuid4().hex
        self.clock = clock
        self._revision = 1
        self._leases = LeaseTable(clock, limits.max_leases, rng or random.Random())
        self._history = EventHistory(limits.history_limit, limits.history_bytes)

    # -- state --------------------------------------------------------------------------------
    @property
    def revision(self) -> int:
        """The store revision: that of the last write transaction (1 for an empty store)."""
        return self._revision

    @property
    def compact_revision(self) -> int:
        """The oldest revision whose events are still kept; watches may start there or later."""
        return self._history.compact_revision

    # -- reads --------------------------------------------------------------------------------
    def get(self, key: str) -> ReadResult:
        """Read one key at the current revision."""
        return ReadResult(self._revision, self._keys.get(key))

    def get_prefix(self, prefix: str) -> RangeResult:
        """Read every key starting with ``prefix``, in key (code point = UTF-8 byte) order."""
        return RangeResult(self._revision, self._keys.kvs_under(prefix))

    # -- writes -------------------------------------------------------------------------------
    def put(self, key: str, value: bytes, lease: int = NO_LEASE) -> Outcome[WriteResult]:
        """Write ``key`` unconditionally, binding it to ``lease`` (0: unbind).

        Raises:
            ValueTooLargeError: ``value`` exceeds :attr:`max_value_bytes`.
            LeaseNotFoundError: ``lease`` is not live.
        """
        self._keys.check_value(key, value)
        self._check_lease(lease)
        self._keys.check_live_bytes({key: len(value)})
        event = self._store(key, value, lease, self._revision + 1)
        return Outcome(WriteResult(True, event.revision, event.kv), self._commit([event]))

    def txn(self, txn: Txn) -> Outcome[TxnResult]:
        """Run a transaction atomically (see :mod:`backends.txn`): compares on the state before it,
        one branch's operations in order, every write at one new revision.

        Raises:
            ValueTooLargeError, TypeError, ValueError: see :func:`~backends.txn.check_txn`
                (checked on the whole request before anything runs).
            LeaseNotFoundError: a put on the branch path names a lease that is not live
                (checked before anything runs, so nothing is written).
            LimitExceededError: the puts on the branch path would pass :attr:`max_live_bytes`
                (judged without the path's deletes, so a transaction near the bound that
                deletes as much as it writes may be refused).
        """
        check_txn(txn, self.max_value_bytes)
        for op in _puts(txn):
            self._keys.check_value(op.key, op.value)
        path = self._path(txn)
        self._check_path_leases(txn, path)
        events: list[WatchEvent] = []
        result = self._run(txn, iter(path), self._revision + 1, events)
        if events:
            self._commit(events)
        else:
            result = dataclasses.replace(result, revision=self._revision)
        return Outcome(_at_revision(result, self._revision), tuple(events))

    def _path(self, txn: Txn) -> list[bool]:
        """Which branch each transaction takes, outer first, depth first, judged before any write."""
        succeeded = all(compare.holds(self._keys.get(compare.key)) for compare in txn.compares)
        path = [succeeded]
        for op in txn.on_success if succeeded else txn.on_failure:
            if isinstance(op, Txn):
                path.extend(self._path(op))
        return path

    def _check_path_leases(self, txn: Txn, path: list[bool]) -> None:
        """Check the leases of the puts on the branch path, then the live bytes they would add."""
        steps = iter(path)
        sizes: dict[str, int] = {}

        def walk(current: Txn) -> None:
            for op in current.on_success if next(steps) else current.on_failure:
                if isinstance(op, Put):
                    self._check_lease(op.lease)
                    sizes[op.key] = len(op.value)
                elif isinstance(op, Txn):
                    walk(op)

        walk(txn)
        self._keys.check_live_bytes(sizes)

    def _run(self, txn: Txn, steps, revision: int, events: list[WatchEvent]) -> TxnResult:
        succeeded = next(steps)
        responses: list = []
        for op in txn.on_success if succeeded else txn.on_failure:
            if isinstance(op, Put):
                events.append(self._store(op.key, op.value, op.lease, revision))
                responses.append(PutResult(events[-1].kv))
            elif isinstance(op, Delete):
                keys = list(self._keys.keys_under(op.key)) if op.prefix else [op.key] if op.key in self._keys else []
                events.extend(self._remove(key, revision) for key in keys)
                responses.append(DeleteResult(len(keys)))
            elif isinstance(op, Range):
                responses.append(self._range(op, revision))
            else:
                responses.append(self._run(op, steps, revision, events))
        return TxnResult(succeeded, revision, tuple(responses))

    def _range(self, op: Range, revision: int) -> RangeResult:
        if op.prefix:
            if op.count_only:
                return RangeResult(revision, (), self.count_prefix(op.key))
            return RangeResult(revision, self._keys.kvs_under(op.key))
        kv = self._keys.get(op.key)
        kvs = () if kv is None else (kv,)
        return RangeResult(revision, () if op.count_only else kvs, len(kvs))

    def delete(self, key: str) -> Outcome[WriteResult]:
        """Delete ``key``; not applied (and no new revision) when it does not exist."""
        if key not in self._keys:
            return Outcome(WriteResult(False, self._revision, None))
        event = self._remove(key, self._revision + 1)
        return Outcome(WriteResult(True, event.revision, None), self._commit([event]))

    def delete_prefix(self, prefix: str) -> Outcome[int]:
        """Delete every key under ``prefix`` in one revision; the result is how many."""
        keys = list(self._keys.keys_under(prefix))
        return Outcome(len(keys), self._delete_keys(keys))

    # -- leases (kept by a bounded LeaseTable) ----------------------------------------------------
    def grant(self, ttl: float) -> Lease:
        """Create a lease expiring ``ttl`` seconds from now; ids are unique, random and non-zero.

        Raises:
            ValueError: ``ttl`` is not a positive finite number.
            LimitExceededError: :attr:`max_leases` leases are live already.
        """
        record = self._leases.grant(ttl)
        return Lease(record.id, record.ttl)

    def keepalive(self, lease_id: int) -> float:
        """Renew the lease to its full TTL from now and return the TTL.

        Raises:
            LeaseNotFoundError: the lease is unknown, revoked, or past its deadline.
        """
        if lease_id == NO_LEASE:
            raise LeaseNotFoundError("Lease 0 means no lease; there is nothing to keep alive.")
        return self._leases.renew(lease_id)

    def renew_all_leases(self) -> None:
        """Give every live lease its full TTL from now (what a new etcd leader does on election)."""
        self._leases.renew_all()

    def revoke(self, lease_id: int) -> Outcome[bool]:
        """Drop the lease and delete its keys in one revision.

        The result is False when the lease was unknown or already past its deadline (its keys,
        if the expiry had not been swept yet, are deleted all the same).
        """
        record = self._leases.pop(lease_id)
        if record is None:
            return Outcome(False)
        return Outcome(record.deadline > self.clock(), self._delete_keys(sorted(record.keys)))

    def expire_due(self) -> tuple[WatchEvent, ...]:
        """Revoke every lease whose deadline has passed; returns the DELETE events (one revision per lease)."""
        now = self.clock()
        events: list[WatchEvent] = []
        while (lease_id := self._leases.pop_due(now)) is not None:
            events.extend(self.revoke(lease_id).events)
        return tuple(events)

    def next_expiry(self) -> float | None:
        """Clock time at which the next lease expires, or None when there are no leases."""
        return self._leases.next_expiry()

    # -- history ------------------------------------------------------------------------------
    def events_since(self, prefix: str, start_revision: int) -> list[WatchEvent]:
        """Events under ``prefix`` at ``start_revision`` or later, in revision order.

        Raises:
            ValueError: ``start_revision`` is below 1.
            CompactedError: events before ``start_revision`` that it needs are gone.
        """
        return self._history.since(prefix, start_revision)

    def compact(self, revision: int) -> None:
        """Discard the events before ``revision``; compacting to an older revision is a no-op.

        Raises:
            ValueError: ``revision`` is beyond the current revision.
        """
        if revision > self._revision:
            raise ValueError(f"Cannot compact to revision {revision}: the store is at revision {self._revision}.")
        self._history.compact(revision)

    # -- bounds -------------------------------------------------------------------------------
    @property
    def max_value_bytes(self) -> int:
        """Largest value a write accepts."""
        return self._keys.max_value_bytes

    @property
    def max_key_bytes(self) -> int:
        """Longest key (UTF-8 bytes) a write accepts."""
        return self._keys.max_key_bytes

    @property
    def max_live_bytes(self) -> int:
        """Live bytes (see :attr:`live_bytes`) this state holds at most."""
        return self._keys.max_live_bytes

    @property
    def max_leases(self) -> int:
        """Live leases this state holds at most."""
        return self._leases.max_leases

    @property
    def live_bytes(self) -> int:
        """Bytes of live keys and values, plus :data:`KEY_OVERHEAD_BYTES` per key."""
        return self._keys.live_bytes

    def count_prefix(self, prefix: str) -> int:
        """How many keys start with ``prefix``."""
        return self._keys.count_prefix(prefix)

    # -- internals ----------------------------------------------------------------------------
    def _check_lease(self, lease_id: int) -> LeaseRecord | None:
        return None if lease_id == NO_LEASE else self._leases.live(lease_id)

    def _store(self, key: str, value: bytes, lease: int, revision: int) -> WatchEvent:
        old = self._keys.get(key)
        if old is None:
            kv = KeyValue(key, bytes(value), revision, revision, 1, lease)
        else:
            self._unbind(old)
            kv = KeyValue(key, bytes(value), old.create_revision, revision, old.version + 1, lease)
        if lease != NO_LEASE:
            self._leases.get(lease).keys.add(key)  # type: ignore[union-attr]  # checked live before the write
        self._keys.put(kv)
        return WatchEvent(EventType.PUT, kv)

    def _remove(self, key: str, revision: int) -> WatchEvent:
        old = self._keys.pop(key)
        self._unbind(old)
        return WatchEvent(EventType.DELETE, KeyValue(key, b"", 0, revision, 0, NO_LEASE))

    def _unbind(self, kv: KeyValue) -> None:
        record = self._leases.get(kv.lease) if kv.lease != NO_LEASE else None
        if record is not None:
            record.keys.discard(kv.key)

    def _delete_keys(self, keys: list[str]) -> tuple[WatchEvent, ...]:
        present = [key for key in keys if key in self._keys]
        if not present:
            return ()
        revision = self._revision + 1
        return self._commit([self._remove(key, revision) for key in present])

    def _commit(self, events: list[WatchEvent]) -> tuple[WatchEvent, ...]:
        self._revision = events[0].revision
        self._history.append(events)
        return tuple(events)


def _puts(txn: Txn) -> Iterable[Put]:
    """Every put of ``txn``, nested ones included."""
    for op in txn.on_success + txn.on_failure:
        if isinstance(op, Put):
            yield op
        elif isinstance(op, Txn):
            yield from _puts(op)


def _at_revision(result: TxnResult, revision: int) -> TxnResult:
    """``result`` with the store revision after the transaction in it and every nested result."""
    responses = tuple(
        _at_revision(item, revision) if isinstance(item, TxnResult)
        else dataclasses.replace(item, revision=revision) if isinstance(item, RangeResult) else item
        for item in result.responses
    )
    return TxnResult(result.succeeded, revision, responses)
