"""A backend wrapper that counts the writes its caller sends, for tests and benchmarks.

Why a wrapper: what a protocol costs the store is measured from outside, so protocol code
carries no counters. Wrapping is cheap (one method call), and several wrappers may share one
inner backend (one per simulated node); closing a wrapper leaves the inner backend open.
"""

from __future__ import annotations

import collections
import threading

from backends.api import NO_LEASE, KVBackend, Lease, RangeResult, ReadResult, Watch, WriteResult
from backends.txn import Txn, TxnResult

__all__ = ["CountingBackend"]


class CountingBackend(KVBackend):
    """Delegates every call to ``inner`` and counts the writes.

    A write is a request the store must agree on (in etcd: one that goes through Raft): a put,
    a delete, a transaction that may write (whichever branch runs), a lease grant or revoke.
    Reads, keepalives and watches are not writes.

    Attributes:
        writes: the writes sent so far.
        counts: writes by operation name (``put``, ``delete``, ``txn``, ``grant``, ...).
    """

    def __init__(self, inner: KVBackend, *, owns_inner: bool = False) -> None:
        self.inner = inner
        self._owns_inner = owns_inner
        self.max_value_bytes = inner.max_value_bytes
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    @property
    def writes(self) -> int:
        return sum(self.counts.values())

    def _count(self, operation: str) -> None:
        with self._lock:
            self.counts[operation] += 1

    def get(self, key: str) -> ReadResult:
        return self.inner.get(key)

    def get_prefix(self, prefix: str) -> RangeResult:
        return self.inner.get_prefix(prefix)

    def put(self, key: str, value: bytes, *, lease: int = NO_LEASE) -> int:
        self._count("put")
        return self.inner.put(key, value, lease=lease)

    def txn(self, txn: Txn) -> TxnResult:
        if txn.writes:
            self._count("txn")
        return self.inner.txn(txn)

    def delete(self, key: str) -> WriteResult:
        self._count("delete")
        return self.inner.delete(key)

    def delete_prefix(self, prefix: str) -> int:
        self._count("delete_prefix")
        return self.inner.delete_prefix(prefix)

    def grant(self, ttl: float) -> Lease:
        self._count("grant")
        return self.inner.grant(ttl)

    def keepalive(self, lease_id: int) -> float:
        return self.inner.keepalive(lease_id)

    def revoke(self, lease_id: int) -> bool:
        self._count("revoke")
        return self.inner.revoke(lease_id)

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        return self.inner.watch_prefix(prefix, start_revision)

    def compact(self, revision: int) -> None:
        self.inner.compact(revision)

    def close(self) -> None:
        """Close ``inner`` if this wrapper owns it (``owns_inner``); else leave it open (it may be shared)."""
        if self._owns_inner:
            self.inner.close()
