"""A session owns one lease, keeps it alive in the background, and reports when it is lost.

Liveness of a node is its session's lease, judged by the server: keys written with
``session.lease_id`` vanish when the session is lost. Pattern: etcd's
``client/v3/concurrency/session.go``.

Every session of one backend client is renewed by that client's :class:`KeepAliveScheduler`:
one thread, not one per session (etcd's Go client also renews all of a client's leases from
one loop). A thread costs its creation on the path of the first join and a wake-up per
renewal; a process that hosts many sessions (tests, benchmarks, a store's own clients) keeps one.
"""

from __future__ import annotations

import heapq
import math
import itertools
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable

from backends.errors import BackendClosedError, BackendError, LeaseNotFoundError

if TYPE_CHECKING:
    from backends.api import KVBackend

log = logging.getLogger(__name__)

OUTAGE_LOG_INTERVAL = 5.0
"""Seconds between two warnings about the same store outage."""


class KeepAliveScheduler:
    """Renews the leases of many sessions from one daemon thread, each when it is due.

    The thread starts with the first session and ends when none is left. Renewals run one at
    a time: a renewal that blocks (an unreachable server) delays the others of the same
    client, which talk to the same server and would block too.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, name: str = "session-keepalive") -> None:
        self._clock = clock
        self._name = name
        self._due: list[tuple[float, int, Session]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, session: "Session") -> None:
        """Renew ``session`` every ``session.keepalive_interval`` seconds until it is closed or lost."""
        with self._wake:
            self._schedule(session)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._due[0][2] is session:
                self._wake.notify()  # due before every other session: the thread must wait less

    def wake(self) -> None:
        """Re-check the schedule now (a session was closed)."""
        with self._wake:
            self._wake.notify()

    def _schedule(self, session: "Session", since: float | None = None) -> None:
        """Renew ``session`` one interval after ``since`` (default: now)."""
        start = self._clock() if since is None else since
        heapq.heappush(self._due, (start + session.keepalive_interval, next(self._order), session))

    def _run(self) -> None:
        while True:
            with self._wake:
                while True:
                    while self._due and not self._due[0][2].alive:
                        heapq.heappop(self._due)
                    if not self._due:
                        self._thread = None
                        return
                    wait = self._due[0][0] - self._clock()
                    if wait <= 0:
                        break
                    self._wake.wait(wait)
                _, _, session = heapq.heappop(self._due)
            # The next renewal is due an interval after this one *started*: on a slow link (a
            # round trip near the interval) counting from its end spaced the renewals etcd sees
            # by interval + round trip, and a 3 s lease lapsed at 1 s of latency each way.
            started = self._clock()
            if session.renew():
                with self._wake:
                    self._schedule(session, started)


_schedulers: "weakref.WeakKeyDictionary[KVBackend, KeepAliveScheduler]" = weakref.WeakKeyDictionary()
_schedulers_lock = threading.Lock()


def scheduler_for(backend: "KVBackend") -> KeepAliveScheduler:
    """The keepalive scheduler shared by every session of ``backend`` (created on first use)."""
    with _schedulers_lock:
        scheduler = _schedulers.get(backend)
        if scheduler is None:
            scheduler = _schedulers[backend] = KeepAliveScheduler(name=f"session-keepalive-{type(backend).__name__}")
        return scheduler


class Session:
    """One lease kept alive in the background until closed or lost.

    The lease is renewed every ``keepalive_interval`` seconds (default TTL / 3) by the
    backend's :class:`KeepAliveScheduler` (or ``scheduler``). The session is *lost* only on the
    server's word: a keepalive answered "lease not found" (it expired or was revoked). A server
    that cannot be reached is an *outage*, not a loss (DESIGN §3.10): a leaderless etcd expires
    no lease and a new leader extends them all, so the session keeps retrying, logs the
    outage's age every :data:`OUTAGE_LOG_INTERVAL` seconds and reports it in :attr:`outage`;
    whoever owns the session decides how long to go on blind. Loss is reported once:
    :attr:`lost` is set and every callback registered with :meth:`on_lost` runs on the
    keepalive thread.

    ``outage_limit``: after an outage this long, the callbacks of :meth:`on_outage_limit` run
    once (the owner stops training blind); the session itself stays alive.

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
        scheduler: KeepAliveScheduler | None = None,
        outage_limit: float = math.inf,
    ) -> None:
        if ttl <= 0:
            raise ValueError(f"The session TTL ({ttl}) must be positive.")
        interval = ttl / 3 if keepalive_interval is None else keepalive_interval
        if interval <= 0:
            raise ValueError(f"The keepalive interval ({keepalive_interval}) must be positive.")
        self._backend = backend
        self._clock = clock
        self.keepalive_interval = interval
        self._name = name
        asked = clock()
        lease = backend.grant(ttl)
        self.lease_id = lease.id
        self.ttl = lease.ttl
        self.lost = threading.Event()
        self.lost_reason: str | None = None
        self._closed = threading.Event()
        self._callbacks: list[Callable[[str], None]] = []
        self._callbacks_lock = threading.Lock()
        self._renewing = threading.RLock()  # held while a renewal runs, so close() can wait it out
        self._last_renewal = clock()
        self._valid_until = asked + self.ttl  # the server granted it after ``asked``
        self._failing_since: float | None = None  # last success before the current run of failures
        self.outage_limit = outage_limit
        self._outage_callbacks: list[Callable[[float], None]] = []
        self._outage_reported = False
        self._outage_logged = 0.0  # when the outage was last logged
        self._scheduler = scheduler if scheduler is not None else scheduler_for(backend)
        self._scheduler.add(self)

    @property
    def alive(self) -> bool:
        """True while the lease is believed held (not lost and not closed)."""
        return not self.lost.is_set() and not self._closed.is_set()

    @property
    def valid_until(self) -> float:
        """The clock time before which the server cannot have expired the lease (no I/O).

        A renewal sent at ``t`` and answered with ``ttl`` seconds left proves the lease lives until
        ``t + ttl`` at least: the server renewed it after ``t`` (the grant likewise). Meaningless
        once :attr:`lost` is set.
        """
        return self._valid_until

    @property
    def outage(self) -> float:
        """Seconds since the last successful keepalive while renewals fail; 0.0 when the server answers."""
        since = self._failing_since
        return 0.0 if since is None or not self.alive else max(self._clock() - since, 0.0)

    def on_outage_limit(self, callback: Callable[[float], None]) -> None:
        """Call ``callback(seconds)`` once per outage that reaches :attr:`outage_limit` (on the keepalive thread)."""
        with self._callbacks_lock:
            self._outage_callbacks.append(callback)

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
        self._scheduler.wake()
        with self._renewing:  # a renewal in flight finishes before the revoke
            pass
        if revoke and not self.lost.is_set():
            try:
                self._backend.revoke(self.lease_id)
            except BackendError as error:
                log.warning("Session %s: could not revoke lease %x on close: %s", self._name, self.lease_id, error)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def renew(self) -> bool:
        """Renew the lease once (the scheduler calls this when due); False once the session is over."""
        with self._renewing:
            if not self.alive:
                return False
            sent = self._clock()
            try:
                left = self._backend.keepalive(self.lease_id)
            except LeaseNotFoundError:
                self._mark_lost("the server says the lease expired or was revoked")
                return False
            except BackendClosedError:
                return False
            except BackendError as error:
                self._note_failure(error)
                return True
            now = self._clock()
            if self._failing_since is not None:
                log.warning("Session %s: the store answers again after %.1fs; lease %x is still held",
                            self._name, now - self._failing_since, self.lease_id)
                self._failing_since = None
                self._outage_reported = False
            self._last_renewal = now
            self._valid_until = max(self._valid_until, sent + left)
            return True

    def _note_failure(self, error: BackendError) -> None:
        """A renewal that did not reach the server: an outage, logged now and then, never a loss."""
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = self._last_renewal
            self._outage_logged = -math.inf
        if now - self._outage_logged >= OUTAGE_LOG_INTERVAL:
            self._outage_logged = now
            log.warning("Session %s: the store has not answered a keepalive of lease %x for %.1fs (%s); the lease "
                        "holds until the server says otherwise, retrying", self._name, self.lease_id,
                        now - self._failing_since, error)
        age = now - self._failing_since
        if age >= self.outage_limit and not self._outage_reported:
            self._outage_reported = True
            with self._callbacks_lock:
                callbacks = list(self._outage_callbacks)
            for callback in callbacks:
                try:
                    callback(age)
                except Exception:  # a callback's bug must not kill the keepalive thread silently
                    log.exception("Session %s: outage callback failed", self._name)

    def _mark_lost(self, reason: str) -> None:
        if self._closed.is_set():
            return
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
