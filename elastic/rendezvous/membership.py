"""This node's presence in the store: its session, its ``state/`` watch and its master port.

:class:`Membership` is the sole owner of the three things that outlive one join:

* the :class:`~backends.session.Session` (one lease for the node's life; every key the node
  writes is bound to it, so its keys vanish when the server expires it);
* the :class:`StateWatch`, one watch on ``state/`` kept across rounds: the join waits on it
  (:meth:`StateWatch.get`) and the membership monitor of the round that runs reads it through a
  subscription (:meth:`StateWatch.subscribe`). Neither replaces it: the backend resumes it
  across outages (the contract, :mod:`backends.api`), and when the history it would resume
  from was compacted, :meth:`StateWatch.open` / :meth:`StateWatch.ensure_open` re-open it from
  now and the consumer re-reads;
* the :class:`~elastic.rendezvous.ports.PortReservation` the current join publishes.

Short-lived watches (the closer's, the exit barrier's) are opened through :meth:`Membership.watch`
so that :meth:`Membership.interrupt` can cancel them from another thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

from backends.api import KVBackend, Watch, WatchEvent
from backends.errors import BackendClosedError, BackendError
from backends.retry import RetryPolicy
from backends.session import Session
from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.errors import RendezvousError
from elastic.rendezvous.ports import PortReservation
from elastic.rendezvous.settings import RendezvousSettings
from elastic.rendezvous.store_full import WriteRefusals

__all__ = ["LeaseGrant", "Membership", "StateWatch", "default_node_id"]

log = logging.getLogger(__name__)

T = TypeVar("T")
EventsCallback = Callable[[list[WatchEvent]], None]
ErrorCallback = Callable[[BackendError], None]


def default_node_id() -> str:
    """A node id unique per handler: host, pid and a random suffix (no '/')."""
    host = socket.gethostname().replace("/", "_") or "node"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class StateWatch:
    """One watch on ``state/``, from now, kept across rounds; re-opened only when it broke.

    Pull (the join: :meth:`get`) or push (the monitor: :meth:`subscribe`), never both at once.
    Thread-safe: the push side runs on the backend's delivering thread.
    """

    def __init__(self, backend: KVBackend, prefix: str, interrupted: threading.Event) -> None:
        self._backend = backend
        self._prefix = prefix
        self._interrupted = interrupted
        self._lock = threading.Lock()
        self._draining = threading.Lock()
        self._watch: Watch | None = None
        self._pending: list[WatchEvent] = []  # taken by the join after the close it waited for
        self._subscriber: tuple[EventsCallback, ErrorCallback] | None = None

    def open(self) -> None:
        """Make the watch live (from now if it is new or broke) and drop the events queued on it:
        the read that follows reflects them.

        Raises:
            BackendError: the watch could not be opened (BackendClosedError: interrupted).
        """
        watch = self.ensure_open()
        self._pending = []
        try:
            while watch.get(timeout=0):
                pass
        except BackendError:  # broke meanwhile (compacted, refused): a new one, from now
            self._drop(watch)
            self.ensure_open()

    def ensure_open(self) -> Watch:
        """The live watch; opens one from now if there is none (it broke or was never opened).

        Raises:
            BackendError: the watch could not be opened (BackendClosedError: interrupted).
        """
        with self._lock:
            if self._watch is not None:
                return self._watch
            if self._interrupted.is_set():
                raise BackendClosedError(f"The watch on {self._prefix} was cancelled: the node is shutting down.")
            watch = self._watch = self._backend.watch_prefix(self._prefix)
            subscribed = self._subscriber is not None
        if subscribed:
            watch.set_listener(lambda: self._deliver(watch))
        return watch

    def get(self, timeout: float) -> list[WatchEvent]:
        """Events within ``timeout`` seconds ([] if none). A watch that fails is dropped, so the
        next :meth:`open` opens a new one.

        Raises:
            CompactedError: the backend could not resume it: its history is gone (re-read).
            BackendError: it was refused or cancelled.
        """
        watch = self.ensure_open()
        try:
            return watch.get(timeout=timeout)
        except BackendError:
            self._drop(watch)
            raise

    def hand_back(self, events: list[WatchEvent]) -> None:
        """Keep ``events`` (read, not handled) for the next subscriber."""
        self._pending = list(events)

    def subscribe(self, on_events: EventsCallback, on_error: ErrorCallback) -> None:
        """Push every event (first those handed back) to ``on_events``; a failure of the watch
        goes to ``on_error`` once, and the watch is dropped (:meth:`ensure_open` re-opens it).

        Both run on the backend's delivering thread (or the caller's), one batch at a time:
        quick, never raising.

        Raises:
            BackendError: the watch was not open and could not be opened.
        """
        pending, self._pending = self._pending, []
        with self._lock:
            self._subscriber = on_events, on_error
        if pending:
            with self._draining:
                on_events(pending)
        watch = self.ensure_open()
        watch.set_listener(lambda: self._deliver(watch))

    def unsubscribe(self) -> None:
        """Stop pushing; the watch stays open for the next join."""
        with self._lock:
            self._subscriber = None
            watch = self._watch
        if watch is not None:
            watch.set_listener(None)

    def cancel(self) -> None:
        """Cancel the watch (a blocked :meth:`get` raises BackendClosedError). Idempotent."""
        with self._lock:
            watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()

    def _deliver(self, watch: Watch) -> None:
        with self._draining:  # one drainer at a time keeps the batches in order
            with self._lock:
                subscriber = self._subscriber
                if subscriber is None or watch is not self._watch:
                    return
            on_events, on_error = subscriber
            try:
                while events := watch.get(timeout=0):
                    on_events(events)
            except BackendError as error:
                self._drop(watch)
                on_error(error)

    def _drop(self, watch: Watch) -> None:
        with self._lock:
            if self._watch is watch:
                self._watch = None
        watch.set_listener(None)
        watch.cancel()


@dataclass(frozen=True)
class LeaseGrant:
    """The lease a write is bound to, and whether getting it replaced the node's session.

    Attributes:
        lease_id: the live session's lease.
        new_session: a new session was opened (the keys of the old lease are gone).
        after_loss: the replaced session was lost on the server's word (its lease expired).
    """

    lease_id: int
    new_session: bool = False
    after_loss: bool = False


class Membership:
    """Owns this node's session, ``state/`` watch and master port (see the module docstring).

    Args:
        on_signal: called (on the keepalive thread) with MEMBER_LOST when the server says the
            session's lease is gone, and with STORE_UNREACHABLE once the store has not answered
            for ``settings.store_outage_timeout``.
    """

    def __init__(
        self,
        settings: RendezvousSettings,
        backend: KVBackend,
        state_prefix: str,
        node_id: str,
        node_addr: str,
        port_reserver: Callable[[str], PortReservation],
        on_signal: Callable[[MembershipChange, str], None],
    ) -> None:
        self._settings = settings
        self._backend = backend
        self._node_id = node_id
        self._node_addr = node_addr
        self._port_reserver = port_reserver
        self._on_signal = on_signal
        self._interrupted = threading.Event()
        self._active: set[Watch] = set()
        self._session: Session | None = None
        self._reservation: PortReservation | None = None
        self.state = StateWatch(backend, state_prefix, self._interrupted)
        self.refusals = WriteRefusals(settings.run_id, node_id, settings.store_outage_timeout)
        """Writes the store refuses for lack of space (etcd's NOSPACE alarm); the join consults it."""

    # -- the session ------------------------------------------------------------------------
    @property
    def session(self) -> Session | None:
        """The current session (None before the first join or after it was dropped)."""
        return self._session

    @property
    def lease_id(self) -> int | None:
        session = self._session
        return session.lease_id if session is not None else None

    @property
    def alive(self) -> bool:
        """Whether the node holds a live lease."""
        session = self._session
        return session is not None and session.alive

    @property
    def lost_reason(self) -> str | None:
        """Why the current session was lost (None while it lives)."""
        session = self._session
        return session.lost_reason if session is not None and session.lost.is_set() else None

    @property
    def outage(self) -> float:
        """Seconds the store has not answered this node's keepalives (0.0 while it answers). No I/O."""
        session = self._session
        return session.outage if session is not None else 0.0

    @property
    def held_until(self) -> float | None:
        """Before when the store cannot have expired this node's lease; None without a live one. No I/O."""
        session = self._session
        return session.valid_until if session is not None and session.alive else None

    @property
    def store_full(self) -> bool:
        """Whether the store refused this node's last write for lack of space. No I/O."""
        return self.refusals.full

    def lease(self) -> LeaseGrant:
        """The live session's lease; a new session when there is none or it was lost.

        Raises:
            BackendError: a new lease could not be granted.
        """
        session = self._session
        if session is not None and session.alive:
            return LeaseGrant(session.lease_id)
        after_loss = session is not None and session.lost.is_set()
        if session is not None:
            session.close(revoke=False)
        settings = self._settings
        session = Session(self._backend, settings.lease_ttl, name=f"{settings.run_id}/{self._node_id}",
                          outage_limit=settings.store_outage_timeout)
        session.on_lost(self._lost)
        session.on_outage_limit(self._outage_limit)
        self._session = session
        return LeaseGrant(session.lease_id, new_session=True, after_loss=after_loss)

    def signal_if_lost(self) -> None:
        """Signal MEMBER_LOST again if the session is lost (for a monitor that started after)."""
        session = self._session
        if session is not None and session.lost.is_set():
            self._lost(session.lost_reason or "lost")

    def _lost(self, reason: str) -> None:
        self._on_signal(MembershipChange.MEMBER_LOST, f"this node's lease was lost: {reason}")

    def _outage_limit(self, age: float) -> None:
        self._on_signal(MembershipChange.STORE_UNREACHABLE,
                        f"the store has not answered for {age:.0f}s (store_outage_timeout="
                        f"{self._settings.store_outage_timeout:g}s); stopping the workers rather than train blind")

    def retrying(self, call: Callable[[], T], policy: RetryPolicy, within: float | None = None) -> T:
        """Run ``call`` (safe to repeat) again after transient store failures, with ``policy``'s
        backoff, for up to ``within`` seconds (default: the join timeout); :meth:`interrupt` ends
        it (BackendClosedError).

        Raises:
            BackendError: the last failure.
        """
        def attempt() -> T:
            if self._interrupted.is_set():
                raise BackendClosedError(f"Node {self._node_id} is shutting down.")
            return call()

        limit = self._settings.join_timeout if within is None else within
        bounded = dataclasses.replace(policy, total_timeout=limit, sleep=self._interrupted.wait)
        return bounded.run(attempt, on_retry=self._log_retry)

    def _log_retry(self, attempt: int, error: BaseException) -> None:
        if attempt == 1 or attempt % 10 == 0:
            log.warning("Rendezvous %s: node %s: the store failed (%s); retrying (attempt %d)",
                        self._settings.run_id, self._node_id, error, attempt + 1)

    def forget_session(self) -> None:
        """The server says the lease is gone although no keepalive noticed yet: drop the session
        (the next :meth:`lease` opens a new one)."""
        session, self._session = self._session, None
        if session is not None:
            session.close(revoke=False)

    # -- the master port --------------------------------------------------------------------
    def reserve_port(self) -> int:
        """Listen on a fresh master port for the next join (the previous one is closed).

        Raises:
            RendezvousError: no port could be bound.
        """
        self.drop_port()
        try:
            self._reservation = self._port_reserver(self._node_addr)
        except OSError as error:
            raise RendezvousError(f"Rendezvous {self._settings.run_id}: node {self._node_id} cannot listen on a "
                                  f"master port on {self._node_addr}: {error}") from error
        return self._reservation.port

    def take_listener(self, host: bool) -> socket.socket | None:
        """The listening socket of the port the round published, for its host (group rank 0);
        the reservation is closed either way."""
        reservation, self._reservation = self._reservation, None
        if reservation is None:
            return None
        listener = reservation.take() if host else None
        reservation.close()
        return listener

    def drop_port(self) -> None:
        reservation, self._reservation = self._reservation, None
        if reservation is not None:
            reservation.close()

    # -- watches and shutdown ---------------------------------------------------------------
    @property
    def interrupted(self) -> threading.Event:
        """Set by :meth:`interrupt`: the node is shutting down."""
        return self._interrupted

    @contextlib.contextmanager
    def watch(self, prefix: str, start_revision: int | None = None) -> Iterator[Watch]:
        """A watch (from now by default) that :meth:`interrupt` cancels from another thread.

        Raises:
            BackendError: the watch could not be opened.
        """
        watch = self._backend.watch_prefix(prefix, start_revision)
        self._active.add(watch)
        try:
            if self._interrupted.is_set():
                watch.cancel()
            yield watch
        finally:
            self._active.discard(watch)
            watch.cancel()

    def interrupt(self) -> None:
        """Cancel every watch a join or the exit barrier waits on, from any thread; they raise
        BackendClosedError. Later watches are cancelled as they open."""
        self._interrupted.set()
        for watch in list(self._active):
            watch.cancel()
        self.state.cancel()

    def close(self) -> None:
        """Interrupt, revoke the lease (the node's keys go with it) and close the port. Idempotent."""
        self.interrupt()
        session, self._session = self._session, None
        if session is not None:
            session.close(revoke=True)
        self.drop_port()
