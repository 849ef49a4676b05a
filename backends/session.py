"""A session owns one lease, keeps it alive in the background, and reports when it is lost.

Liveness of a node is its session's lease, judged by the server: keys written with
``session.lease_id`` vanish when the session is lost. Pattern: etcd's
``client/v3/concurrency/session.go``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from backends.errors import BackendClosedError, BackendError, LeaseNotFoundError

if TYPE_CHECKING:
    from backends.api import KVBackend

log = logging.getLogger(__name__)


class Session:
    """One lease kept alive by a daemon thread until closed or lost.

    The lease is renewed every ``keepalive_interval`` seconds (default TTL / 3). The session is
    *lost* when the server says the lease is gone, or when no keepalive has succeeded for a
    full TTL (by then the server has expired it). Loss is reported once: :attr:`lost` is set
    and every callback registered with :meth:`on_lost` runs on the keepalive thread.

    Raises (from the constructor):
        ValueError: ``ttl`` or ``keepalive_interval`` is not positive.
        BackendError: the lease could not be granted.
    """

    def __init__(
        self,
        backend: "KVBackend",
        ttl: float,
        *,
        keepalive_interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "",
    ) -> None:
        if ttl <= 0:
            raise ValueError(f"The session TTL ({ttl}) must be positive.")
        interval = ttl / 3 if keepalive_interval is None else keepalive_interval
        if interval <= 0:
            raise ValueError(f"The keepalive interval ({keepalive_interval}) must be positive.")
        self._backend = backend
        self._clock = clock
        self._interval = interval
        self._name = name
        lease = backend.grant(ttl)
        self.lease_id = lease.id
        self.ttl = lease.ttl
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self._closed = threading.Event()
        self._callbacks: list[Callable[[str], None]] = []
        self._callbacks_lock = threading.Lock()
        self._last_renewal = clock()
        self._thread = threading.Thread(
            target=self._keep_alive, name=f"session-keepalive-{self.lease_id:x}", daemon=True
        )
        self._thread.start()

    @property
    def alive(self) -> bool:
        """True while the lease is believed held (not lost and not closed)."""
        return not self.lost.is_set() and not self._closed.is_set()

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` once when the session is lost (at once if it already is)."""
        with self._callbacks_lock:
            if not self.lost.is_set():
                self._callbacks.append(callback)
                return
        callback(self.lost_reason or "lost")

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the session is lost or ``timeout`` passes; True if lost."""
        return self.lost.wait(timeout)

    def close(self, revoke: bool = True) -> None:
        """Stop the keepalives and (by default) revoke the lease, deleting its keys. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(timeout=self._interval + 5)
        if revoke and not self.lost.is_set():
            try:
                self._backend.revoke(self.lease_id)
            except BackendError as error:
                log.warning("Session %s: could not revoke lease %x on close: %s", self._name, self.lease_id, error)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _keep_alive(self) -> None:
        while not self._closed.wait(self._interval):
            try:
                self._backend.keepalive(self.lease_id)
                self._last_renewal = self._clock()
            except LeaseNotFoundError:
                self._mark_lost("the server says the lease expired or was revoked")
                return
            except BackendClosedError:
                return
            except BackendError as error:
                silent_for = self._clock() - self._last_renewal
                if silent_for >= self.ttl:
                    self._mark_lost(f"no keepalive succeeded for {silent_for:.1f}s (TTL {self.ttl}s): {error}")
                    return
                log.warning(
                    "Session %s: keepalive of lease %x failed (%s); retrying, %.1fs of TTL left",
                    self._name, self.lease_id, error, self.ttl - silent_for,
                )

    def _mark_lost(self, reason: str) -> None:
        log.warning("Session %s: lease %x lost: %s", self._name, self.lease_id, reason)
        with self._callbacks_lock:
            self.lost_reason = reason
            self.lost.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(reason)
            except Exception:  # a callback's bug must not kill the keepalive thread silently
                log.exception("Session %s: lost-callback failed", self._name)
