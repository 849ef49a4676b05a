"""The key-value contract: the only thing the rendezvous engine sees of a backend.

The contract is etcd-shaped and deliberately small:

* reads (:meth:`KVBackend.get`, :meth:`KVBackend.get_prefix`) return values with their
  create and mod revisions, their lease, and the store revision the read was taken at;
* writes are transactions (:meth:`KVBackend.txn`, etcd's, typed in :mod:`backends.txn`) and
  their recipes :meth:`KVBackend.put_if` and :meth:`KVBackend.delete_if`; results say whether
  they applied, so callers never infer success by re-reading or comparing bytes;
* liveness is a lease (:meth:`KVBackend.grant`, ``keepalive``, ``revoke``): keys written with
  a lease vanish when it expires, judged by the server's clock alone;
* progress is a watch (:meth:`KVBackend.watch_prefix`): ordered PUT/DELETE events, resumable
  from a revision, failing with :class:`~backends.errors.CompactedError` when history is gone.
  A watch resumes itself across a lost connection or a restarted server, from its last
  revision, for as long as the server does not answer: an outage is never the end of a watch
  (one layer resumes watches: the backend's; its consumers never re-open one for an outage).

Every method raises only errors of :mod:`backends.errors`.
"""

from __future__ import annotations

import abc
import queue
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from backends.errors import BackendClosedError, BackendError
from backends.types import (
    ABSENT,
    NO_LEASE,
    Absent,
    EventType,
    KeyValue,
    Lease,
    RangeResult,
    ReadResult,
    WatchEvent,
    WriteResult,
)

if TYPE_CHECKING:
    from backends.txn import Txn, TxnResult

__all__ = [
    "ABSENT",
    "NO_LEASE",
    "Absent",
    "EventType",
    "KVBackend",
    "KeyValue",
    "Lease",
    "RangeResult",
    "ReadResult",
    "Watch",
    "WatchEvent",
    "WriteResult",
    "QueueWatch",
]


class Watch(abc.ABC):
    """A live watch on a prefix; events arrive in revision order.

    Use as a context manager, or call :meth:`cancel` when done.
    """

    @abc.abstractmethod
    def get(self, timeout: float | None = None) -> list[WatchEvent]:
        """Wait up to ``timeout`` seconds (None: forever) for events.

        Returns:
            The events that arrived, in revision order; an empty list when the timeout passed.

        An outage raises nothing: the backend resumes the watch from its last revision once
        the server answers, however long that takes, and delivers what it missed.

        Raises:
            CompactedError: the history from the requested (or resume) revision is gone.
            BackendClosedError: the watch (or its backend) was cancelled/closed.
            BackendError: the server refused the watch (e.g. BackendAuthError, ProtocolError).
        """

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop the watch; idempotent. A blocked :meth:`get` raises BackendClosedError."""

    @property
    @abc.abstractmethod
    def last_revision(self) -> int:
        """Revision of the last event returned by :meth:`get` (0 if none yet)."""

    @abc.abstractmethod
    def set_listener(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener()`` whenever events or an error become available to :meth:`get` (None: stop).

        Why: a consumer that only classifies events (the membership monitor) needs no thread
        of its own blocked in :meth:`get`. The listener runs on the backend's delivering
        thread, so it must be quick and must not call the backend; it reads with
        ``get(timeout=0)``. If something is already queued it is called at once.
        """

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cancel()

    def events(self, deadline: float, clock: Callable[[], float] = time.monotonic) -> Iterator[WatchEvent]:
        """Yield events one by one until the monotonic ``deadline`` passes.

        Raises what :meth:`get` raises.
        """
        while True:
            remaining = deadline - clock()
            if remaining <= 0:
                return
            yield from self.get(timeout=remaining)


class QueueWatch(Watch):
    """A :class:`Watch` fed by a producer thread through a queue.

    Backends push event batches with :meth:`deliver` and a terminal error with :meth:`fail`;
    the consumer reads with :meth:`get`. ``on_cancel`` is called once when cancelled so the
    backend can drop its server-side watch.
    """

    _CLOSED = object()

    def __init__(self, start_revision: int, on_cancel: Callable[[], None] | None = None) -> None:
        self._queue: "queue.SimpleQueue[object]" = queue.SimpleQueue()
        self._on_cancel = on_cancel
        self._cancel_lock = threading.Lock()
        self._cancelled = False
        self._error: BaseException | None = None
        self._last_revision = max(start_revision - 1, 0)
        self._delivered_revision = self._last_revision
        self._listener: Callable[[], None] | None = None

    @property
    def last_revision(self) -> int:
        return self._last_revision

    @property
    def delivered_revision(self) -> int:
        """Revision of the last event handed to :meth:`deliver` (what a resume starts after)."""
        return self._delivered_revision

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def begin_after(self, revision: int) -> None:
        """Producer side, for a watch started "from now": the server reports only revisions above
        ``revision`` (the store revision when it registered the watch), which becomes
        :attr:`last_revision` until events arrive. Call before delivering any event."""
        self._delivered_revision = max(self._delivered_revision, revision)
        self._last_revision = max(self._last_revision, revision)

    def deliver(self, events: Sequence[WatchEvent]) -> None:
        """Producer side: append events; events at or below the last delivered revision are dropped."""
        fresh = [event for event in events if event.revision > self._delivered_revision]
        if fresh and not self._cancelled:
            self._delivered_revision = fresh[-1].revision
            self._queue.put(fresh)
            self._notify()

    def fail(self, error: BackendError) -> None:
        """Producer side: end the watch with ``error``; :meth:`get` raises it after queued events."""
        self._queue.put(error)
        self._notify()

    def set_listener(self, listener: Callable[[], None] | None) -> None:
        self._listener = listener
        if listener is not None and not self._queue.empty():
            listener()

    def _notify(self) -> None:
        listener = self._listener
        if listener is not None:
            listener()

    def get(self, timeout: float | None = None) -> list[WatchEvent]:
        if self._error is not None:
            raise self._error
        deadline = None if timeout is None else time.monotonic() + timeout
        batch: list[WatchEvent] = []
        while True:
            try:
                if batch:
                    item = self._queue.get_nowait()
                else:
                    remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                    item = self._queue.get(timeout=remaining)
            except queue.Empty:
                break
            if isinstance(item, list):
                batch.extend(item)
                continue
            error = BackendClosedError("The watch was cancelled.") if item is self._CLOSED else item
            assert isinstance(error, BaseException)
            self._error = error
            if batch:
                break
            raise error
        if batch:
            self._last_revision = batch[-1].revision
        return batch

    def cancel(self) -> None:
        with self._cancel_lock:
            if self._cancelled:
                return
            self._cancelled = True
        self._queue.put(self._CLOSED)
        if self._on_cancel is not None:
            self._on_cancel()


class KVBackend(abc.ABC):
    """The key-value contract every backend implements natively.

    Keys are ``str`` (stored as UTF-8), values ``bytes``. Implementations are safe to call
    from many threads at once. Every method raises only :class:`~backends.errors.BackendError`
    subclasses; after :meth:`close` they raise :class:`~backends.errors.BackendClosedError`.
    """

    #: Largest value, in bytes, that a write accepts; larger ones raise ValueTooLargeError.
    max_value_bytes: int = 1024 * 1024

    # -- reads -------------------------------------------------------------------------------
    @abc.abstractmethod
    def get(self, key: str) -> ReadResult:
        """Read one key."""

    @abc.abstractmethod
    def get_prefix(self, prefix: str) -> RangeResult:
        """Read every key starting with ``prefix``, in key order, at one revision."""

    # -- writes ------------------------------------------------------------------------------
    @abc.abstractmethod
    def put(self, key: str, value: bytes, *, lease: int = NO_LEASE) -> int:
        """Write ``key`` unconditionally; returns the write's revision.

        Raises:
            ValueTooLargeError: ``value`` exceeds :attr:`max_value_bytes`.
            LeaseNotFoundError: ``lease`` does not exist.
        """

    @abc.abstractmethod
    def txn(self, txn: "Txn") -> "TxnResult":
        """Run ``txn`` atomically: its comparisons, then one branch (see :mod:`backends.txn`).

        Backends map it one-to-one onto their transaction (etcd's ``Txn``; the built-in store
        and the fake run it on :class:`~backends.kvstate.KVState` under their lock). A
        transaction that may write is not resent after an unknown outcome: the caller re-reads.

        Raises:
            ValueTooLargeError, TypeError, ValueError: refused before sending
                (:func:`~backends.txn.check_txn`).
            LeaseNotFoundError: a put on the branch that ran names a lease that does not
                exist; nothing was written.
        """

    def put_if(
        self, key: str, value: bytes, expected: int | Absent, *, lease: int = NO_LEASE
    ) -> WriteResult:
        """Write ``key`` only if its mod revision equals ``expected`` (or it is absent, for ABSENT).

        Raises:
            ValueTooLargeError: ``value`` exceeds :attr:`max_value_bytes`.
            LeaseNotFoundError: the comparison held but ``lease`` does not exist.
        """
        from backends.txn import Compare, Put, Range, Txn

        condition = Compare.absent(key) if isinstance(expected, Absent) else Compare.mod_revision(key, expected)
        read = Range(key)
        result = self.txn(Txn((condition,), (Put(key, value, lease), read), (read,)))
        kvs = result.responses[-1].kvs  # type: ignore[union-attr]
        return WriteResult(result.succeeded, result.revision, kvs[0] if kvs else None)

    @abc.abstractmethod
    def delete(self, key: str) -> WriteResult:
        """Delete ``key``; ``applied`` says whether it existed."""

    def delete_if(self, key: str, expected: int) -> WriteResult:
        """Delete ``key`` only if it exists and its mod revision equals ``expected``."""
        from backends.txn import Compare, Delete, Range, Txn

        read = Range(key)
        result = self.txn(Txn((Compare.exists(key), Compare.mod_revision(key, expected)), (Delete(key),), (read,)))
        if result.succeeded:
            return WriteResult(True, result.revision, None)
        kvs = result.responses[0].kvs  # type: ignore[union-attr]
        return WriteResult(False, result.revision, kvs[0] if kvs else None)

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``; returns how many were deleted."""

    # -- leases ------------------------------------------------------------------------------
    @abc.abstractmethod
    def grant(self, ttl: float) -> Lease:
        """Create a lease that expires ``ttl`` seconds from now unless kept alive.

        Raises:
            ValueError: ``ttl`` is not positive.
        """

    @abc.abstractmethod
    def keepalive(self, lease_id: int) -> float:
        """Renew the lease to its full TTL; returns the TTL granted.

        Raises:
            LeaseNotFoundError: the lease expired or was revoked.
        """

    @abc.abstractmethod
    def revoke(self, lease_id: int) -> bool:
        """Revoke the lease and delete its keys; False if it had already expired or was unknown."""

    # -- watches and history -----------------------------------------------------------------
    @abc.abstractmethod
    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        """Watch every key under ``prefix``.

        Args:
            start_revision: first revision to report; None means changes after now. A past
                revision replays the history from there.

        With ``start_revision=None`` the call returns once the server has registered the
        watch, and the watch's ``last_revision`` is then the store revision at registration:
        every change above it is reported. A read made after this call returns is taken at
        that revision or later, so "watch from now, then read" leaves no gap; a consumer skips
        the events at or below the read's revision, which the read already reflects. Why this
        order and not "read, then watch from the read's revision + 1": on etcd a watch that
        starts in the past is served by a catch-up loop that runs every 100 ms, while a watch
        from now receives each event as it is written.

        Raises:
            CompactedError: (possibly from the watch's ``get``) history before
                ``start_revision`` is gone.
        """

    @abc.abstractmethod
    def compact(self, revision: int) -> None:
        """Discard history before ``revision``; later watches from older revisions fail."""

    # -- lifecycle ---------------------------------------------------------------------------
    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and cancel watches; idempotent."""

    def __enter__(self) -> "KVBackend":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

