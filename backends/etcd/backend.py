"""The etcd v3 backend: the :class:`~backends.api.KVBackend` contract over etcd's gRPC API.

Transactions map one to one onto etcd's ``Txn`` (see :mod:`backends.etcd.txnconvert`), so a
conditional write and its result come from one round trip and one revision. Reads report the header revision they were
served at. Leases map to etcd leases (whole seconds), renewed on one persistent stream per endpoint (see
:mod:`backends.etcd.keepalive`). Every watch of a client shares one Watch stream and resumes
across restarts (see :mod:`backends.etcd.watch`). Errors are translated at this boundary (see
:mod:`backends.etcd.translate`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from etcd3 import etcdrpc

from backends.api import (
    NO_LEASE,
    KVBackend,
    Lease,
    RangeResult,
    ReadResult,
    Watch,
    WriteResult,
)
from backends.errors import BackendError, CompactedError, LeaseNotFoundError, ValueTooLargeError
from backends.etcd.config import EtcdConfig
from backends.etcd.connection import EtcdConnection
from backends.etcd.convert import encode_key, first_key_value, key_value, prefix_range_end
from backends.etcd.keepalive import KeepAliveStreams
from backends.etcd.txnconvert import txn_request, txn_result
from backends.etcd.watch import WatchHub
from backends.txn import Txn, TxnResult, check_txn

log = logging.getLogger(__name__)

CLOSE_JOIN_TIMEOUT_S = 2.0
"""How long :meth:`EtcdBackend.close` waits, in all, for its reader threads to end."""


class EtcdBackend(KVBackend):
    """A client of one etcd v3 cluster; thread-safe. Opening it does no I/O.

    Args:
        config: an :class:`EtcdConfig`, or an endpoint string such as ``"127.0.0.1:2379"``.

    Raises (from the constructor):
        EndpointError: the configuration or an endpoint is malformed, or a TLS file is unreadable.

    Every method raises only :class:`~backends.errors.BackendError` subclasses (see
    :class:`~backends.api.KVBackend`); after :meth:`close`, BackendClosedError.
    """

    def __init__(self, config: EtcdConfig | str) -> None:
        self.config = config if isinstance(config, EtcdConfig) else EtcdConfig(endpoints=config)
        self.max_value_bytes = self.config.max_value_bytes
        self._connection = EtcdConnection(self.config)
        self._watch_hub = WatchHub(self._connection)
        self._keepalives = KeepAliveStreams()
        self._close_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"EtcdBackend({self.config.endpoint_list})"

    # -- reads -------------------------------------------------------------------------------
    def get(self, key: str) -> ReadResult:
        request = etcdrpc.RangeRequest(key=encode_key(key))
        response = self._call(f"get {key!r}", lambda c, o: o.unary(c.kv.Range, request), writes=False)
        return ReadResult(revision=response.header.revision, kv=first_key_value(response.kvs))

    def get_prefix(self, prefix: str) -> RangeResult:
        raw = encode_key(prefix)
        request = etcdrpc.RangeRequest(key=raw, range_end=prefix_range_end(raw))
        response = self._call(f"get prefix {prefix!r}", lambda c, o: o.unary(c.kv.Range, request), writes=False)
        return RangeResult(revision=response.header.revision, kvs=tuple(key_value(kv) for kv in response.kvs))

    def round_trip(self, budget: float, key: str) -> float:
        """Seconds one tiny read of ``key`` takes on a connected channel: the round trip to etcd.

        Connects first if need be (that read gets ``budget`` seconds in all); then times a
        second read. For fitting timeouts to a slow link (:mod:`elastic.rendezvous.latency`).
        ``key`` must be one the user may read: with etcd auth, a least-privilege role may read
        only its job's prefix.

        Raises:
            BackendError: etcd could not be reached or refused (e.g. the credentials);
                BackendPermissionError when the user's role may not read ``key``.
        """
        request = etcdrpc.RangeRequest(key=encode_key(key), count_only=True)
        what = f"get {key!r}"  # what its errors say: a read, like any other (e.g. resolving a wrong host name)
        self._connection.call(what, lambda c, o: o.unary(c.kv.Range, request), budget=budget)
        started = time.monotonic()
        self._connection.call(what, lambda c, o: o.unary(c.kv.Range, request), budget=budget)
        return time.monotonic() - started

    # -- writes ------------------------------------------------------------------------------
    def put(self, key: str, value: bytes, *, lease: int = NO_LEASE) -> int:
        """Write ``key``; resent after an unknown outcome (the result is the same value).

        Raises:
            ValueTooLargeError: ``value`` exceeds :attr:`max_value_bytes` (or etcd's request limit).
            LeaseNotFoundError: ``lease`` does not exist.
        """
        request = etcdrpc.PutRequest(key=encode_key(key), value=self._checked(key, value), lease=lease)
        response = self._call(f"put {key!r}", lambda c, o: o.unary(c.kv.Put, request))
        return response.header.revision

    def txn(self, txn: Txn) -> TxnResult:
        """One etcd ``Txn`` call, mapped one to one (see :mod:`backends.etcd.txnconvert`).

        A transaction that cannot write is resent after an unknown outcome; one that may write
        is not: a lost answer raises BackendTimeoutError or BackendConnectionError, and the
        caller re-reads.

        Raises:
            ValueTooLargeError, TypeError, ValueError: refused before sending (:func:`check_txn`).
            LeaseNotFoundError: a put on the branch that ran names a lease that does not exist.
        """
        check_txn(txn, self.max_value_bytes)
        request = txn_request(txn)
        response = self._call(f"txn of {len(txn.compares)} comparisons",
                              lambda c, o: o.unary(c.kv.Txn, request), resend_safe=not txn.writes,
                              writes=txn.writes)
        return txn_result(txn, response, response.header.revision)

    def delete(self, key: str) -> WriteResult:
        request = etcdrpc.DeleteRangeRequest(key=encode_key(key))
        response = self._call(f"delete {key!r}", lambda c, o: o.unary(c.kv.DeleteRange, request), resend_safe=False)
        return WriteResult(response.deleted > 0, response.header.revision, None)

    def delete_prefix(self, prefix: str) -> int:
        raw = encode_key(prefix)
        request = etcdrpc.DeleteRangeRequest(key=raw, range_end=prefix_range_end(raw))
        response = self._call(f"delete prefix {prefix!r}", lambda c, o: o.unary(c.kv.DeleteRange, request))
        return response.deleted

    # -- leases ------------------------------------------------------------------------------
    def grant(self, ttl: float) -> Lease:
        """Grant a lease of ``ceil(ttl)`` seconds; the result holds the TTL etcd granted (>= its minimum).

        Raises:
            ValueError: ``ttl`` is not positive.
        """
        if not ttl > 0:
            raise ValueError(f"The lease TTL ({ttl}) must be positive.")
        request = etcdrpc.LeaseGrantRequest(TTL=math.ceil(ttl))
        response = self._call("grant lease", lambda c, o: o.unary(c.lease.LeaseGrant, request), resend_safe=False)
        if response.error:
            raise BackendError(f"etcd refused to grant a {ttl}s lease: {response.error}.")
        return Lease(id=response.ID, ttl=float(response.TTL))

    def keepalive(self, lease_id: int) -> float:
        """Renew the lease once; etcd answers an unknown or expired lease with TTL <= 0.

        Raises:
            LeaseNotFoundError: the lease expired or was revoked.
        """
        response = self._call(
            f"keepalive lease {lease_id:x}", lambda c, o: self._keepalives.renew(c, o, lease_id), writes=False
        )
        if response is None or response.TTL <= 0:
            raise LeaseNotFoundError(f"etcd lease {lease_id:x} expired or was revoked; open a new session.")
        return float(response.TTL)

    def revoke(self, lease_id: int) -> bool:
        request = etcdrpc.LeaseRevokeRequest(ID=lease_id)
        try:
            self._call(
                f"revoke lease {lease_id:x}", lambda c, o: o.unary(c.lease.LeaseRevoke, request), resend_safe=False
            )
        except LeaseNotFoundError:
            return False
        return True

    # -- watches and history -----------------------------------------------------------------
    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        """Watch ``prefix`` from ``start_revision`` (None: from now).

        A watch from now returns once etcd registered it (see :meth:`WatchHub.watch`): a change
        made after this call returns is always reported, and the watch's ``last_revision`` says
        from where.

        Raises:
            ValueError: ``start_revision`` is not positive.
            CompactedError: from the watch's ``get``, when that history is gone.
        """
        if start_revision is not None and start_revision < 1:
            raise ValueError(f"The watch start revision ({start_revision}) must be at least 1.")
        self._connection.check_open(f"watch {prefix!r}")
        return self._watch_hub.watch(prefix, start_revision, confirm_timeout=self.config.request_timeout)

    def compact(self, revision: int) -> None:
        """Compact history before ``revision``; compacting an already-compacted revision is a no-op."""
        request = etcdrpc.CompactionRequest(revision=revision, physical=False)
        try:
            self._call(f"compact to revision {revision}", lambda c, o: o.unary(c.kv.Compact, request))
        except CompactedError:
            log.debug("etcd history before revision %d was already compacted", revision)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Cancel every watch, end the keepalive streams and close the channels; idempotent.

        Then waits (at most :data:`CLOSE_JOIN_TIMEOUT_S`) for the reader threads to leave gRPC:
        they are daemon threads, and one still inside gRPC when the interpreter exits can hang
        that exit (CPython stops such threads where they stand, locks held).
        """
        with self._close_lock:
            if self._connection.closed:
                return
            self._connection.close()
        self._watch_hub.close()
        self._keepalives.close()
        deadline = time.monotonic() + CLOSE_JOIN_TIMEOUT_S
        if not (self._watch_hub.join(CLOSE_JOIN_TIMEOUT_S) and self._keepalives.join(deadline)):
            log.debug("etcd client closed with a reader thread still in gRPC after %gs", CLOSE_JOIN_TIMEOUT_S)

    # -- helpers -----------------------------------------------------------------------------
    def _call(self, operation: str, invoke: Any, *, resend_safe: bool = True, writes: bool = True) -> Any:
        return self._connection.call(operation, invoke, resend_safe=resend_safe, writes=writes)

    def _checked(self, key: str, value: bytes) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"The value for {key!r} must be bytes, not {type(value).__name__}.")
        if len(value) > self.max_value_bytes:
            raise ValueTooLargeError(
                f"The value for {key!r} has {len(value)} bytes; the etcd backend accepts at most "
                f"{self.max_value_bytes}. Store large data elsewhere and keep a reference in etcd."
            )
        return bytes(value)
