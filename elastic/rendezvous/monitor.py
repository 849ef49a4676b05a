"""Watches a closed round for the changes that should restart its members.

Two watches feed the monitor: one on the run's ``rounds/`` keys from the revision at which the
round's member list was read (members leaving, nodes waiting for the next round, members
marked done), and the handler's own watch on ``state/``, which is already live past the round
record (the rendezvous closed for good, a newer round). Each event is classified with
:func:`elastic.rendezvous.decisions.classify`; the first change sets
:attr:`MembershipMonitor.changed`. The ``rounds/`` watch does not replay the round record,
which is O(members) bytes, to every member.

No thread of its own: the watches call the monitor back (:meth:`~backends.api.Watch.set_listener`)
on the backend's delivering thread, and classifying is pure and quick. Only a lost watch starts
a thread that resumes it from its last revision.

Static stability (DESIGN §3.10): a watch lost because the store is unreachable is resumed, with
backoff, for as long as it takes; it never restarts the workers. Only the server's word (a
key deleted, a newer round, the rendezvous closed) or history the store compacted away does.
Corrupt state seen on a watch is reported once, as one line naming the key and the fix, and
kept in :attr:`MembershipMonitor.problem`; the workers keep training (a later rendezvous that
needs the state fails with the same error).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Sequence

from backends.api import KVBackend, Watch, WatchEvent
from backends.errors import BackendClosedError, BackendError, CompactedError
from backends.retry import RetryPolicy
from elastic.rendezvous.errors import RendezvousStateError
from elastic.rendezvous.decisions import (
    MembershipChange,
    MonitorState,
    RoundView,
    classify,
    rejoining_count,
    spare_count,
    waiting_counts,
)

log = logging.getLogger(__name__)

_RESUME_POLICY = RetryPolicy(max_attempts=2**31, initial_backoff=0.1, max_backoff=2.0)
"""Resuming a lost watch: until it works or the monitor stops (each attempt is bounded by the
backend's request timeout; a stopped monitor's backend is closed, which ends the loop)."""


class MembershipMonitor:
    """Background classification of one closed round's changes.

    Args:
        backend: the store; the monitor opens (and cancels) its ``rounds/`` watch on it.
        view: the closed round as this member sees it.
        start_revision: the revision after the round's member list was read.
        state_watch: the handler's ``state/`` watch; the monitor reads it until :meth:`stop`
            and leaves it open (the handler owns it).
        state_backlog: ``state/`` events already taken from ``state_watch`` but not handled.
        on_state_watch: called with the new ``state/`` watch when the monitor replaced a lost
            one, so the handler (its owner) keeps it.
        on_change: called (on the delivering thread) after each :meth:`signal`.

    Attributes:
        changed: set once a change that should restart the members was seen.
        change: that change (the first one), or None.
        reason: a sentence describing it, for logs and events.
        problem: corrupt state seen on a watch, or None (see the module docstring).
    """

    def __init__(
        self,
        backend: KVBackend,
        view: RoundView,
        start_revision: int,
        state_watch: Watch,
        state_backlog: Sequence[WatchEvent] = (),
        on_state_watch: Callable[[Watch], None] = lambda watch: None,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._backend = backend
        self._view = view
        self._state = MonitorState()
        self._stopped = threading.Event()
        self._lock = threading.RLock()  # one classifier at a time; listeners may fire on several threads
        self._state_watch = state_watch
        self.on_state_watch = on_state_watch
        self._on_change = on_change
        self._rounds_watch: Watch | None = None
        self._resumer: threading.Thread | None = None
        self.changed = threading.Event()
        self.change: MembershipChange | None = None
        self.reason = ""
        self.problem: str | None = None
        """Corrupt state seen on a watch (the first such error), or None."""
        self._classify(state_backlog)
        state_watch.set_listener(self._on_state_events)
        self._open_rounds_watch(start_revision)

    @property
    def num_nodes_waiting(self) -> int:
        """Waiting nodes that justify a restart (see :func:`decisions.waiting_counts`)."""
        return waiting_counts(self._view, self._state.waiting)

    @property
    def num_rejoining(self) -> int:
        """Members of this round waiting for the next one (see :func:`decisions.rejoining_count`)."""
        return rejoining_count(self._view, self._state.waiting)

    @property
    def num_spares(self) -> int:
        """Waiting nodes beyond a full round: spares (see :func:`decisions.spare_count`)."""
        return spare_count(self._view, self._state.waiting)

    def signal(self, change: MembershipChange, reason: str) -> None:
        """Record ``change`` (the first one wins) and set :attr:`changed`."""
        with self._lock:
            if self.change is None:
                self.change, self.reason = change, reason
                log.info("Rendezvous %s round %d: %s", self._view.keys.run_id, self._view.record.round, reason)
        self.changed.set()
        self._on_change()

    def stop(self) -> None:
        """Stop classifying; cancels the ``rounds/`` watch and hands ``state/`` back. Idempotent."""
        self._stopped.set()
        self._state_watch.set_listener(None)
        with self._lock:  # wait out a listener that is running right now
            watch, self._rounds_watch = self._rounds_watch, None
        if watch is not None:
            watch.set_listener(None)
            watch.cancel()
        resumer = self._resumer
        if resumer is not None and resumer is not threading.current_thread():
            resumer.join(timeout=5)

    # -- the watches' listeners ------------------------------------------------------------------
    def _on_state_events(self) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            try:
                while events := self._state_watch.get(timeout=0):
                    self._classify(events)
            except BackendClosedError:
                return
            except CompactedError as error:
                self.signal(MembershipChange.MEMBER_LOST, f"rendezvous state history was compacted ({error}); "
                                                          "restarting to be safe")
            except BackendError as error:
                log.warning("Rendezvous %s: the state watch was lost (%s); the workers keep running while it "
                            "resumes from revision %d", self._view.keys.run_id, error,
                            self._state_watch.last_revision + 1)
                self._resume_state(self._state_watch.last_revision + 1)

    def _on_rounds_events(self, watch: Watch) -> None:
        with self._lock:
            if self._stopped.is_set() or watch is not self._rounds_watch:
                return
            try:
                while events := watch.get(timeout=0):
                    self._classify(events)
            except BackendClosedError:
                return
            except CompactedError as error:
                self.signal(MembershipChange.MEMBER_LOST, f"membership history was compacted ({error}); "
                                                          "restarting to be safe")
            except BackendError as error:
                log.warning("Rendezvous %s: membership watch lost (%s); the workers keep running while it resumes "
                            "from revision %d", self._view.keys.run_id, error, watch.last_revision + 1)
                self._rounds_watch = None
                self._resume(watch.last_revision + 1)

    def _classify(self, events: Sequence[WatchEvent]) -> None:
        for event in events:
            try:
                change, self._state = classify(self._view, event, self._state)
            except RendezvousStateError as error:
                self._report_problem(error)
                continue
            if change is not None:
                self.signal(change, _describe(change, event.kv.key))

    def _report_problem(self, error: RendezvousStateError) -> None:
        if self.problem is None:
            self.problem = str(error)
            log.error("Rendezvous %s round %d: %s (the workers keep running; the next rendezvous needs it fixed)",
                      self._view.keys.run_id, self._view.record.round, error)

    # -- opening and resuming the rounds/ watch ---------------------------------------------------
    def _open_rounds_watch(self, revision: int) -> None:
        try:
            watch = self._backend.watch_prefix(self._view.keys.rounds_prefix, revision)
        except BackendClosedError:
            return
        except BackendError as error:
            log.warning("Rendezvous %s: cannot watch the membership yet (%s); retrying", self._view.keys.run_id, error)
            self._resume(revision)
            return
        self._adopt(watch)

    def _adopt(self, watch: Watch) -> None:
        with self._lock:
            if self._stopped.is_set():
                watch.cancel()
                return
            self._rounds_watch = watch
        watch.set_listener(lambda: self._on_rounds_events(watch))

    def _resume(self, revision: int) -> None:
        """Re-open the ``rounds/`` watch from ``revision`` on a thread, retrying until it works or we stop."""
        self._start_resumer(lambda: self._reopen(self._view.keys.rounds_prefix, revision, self._adopt))

    def _resume_state(self, revision: int) -> None:
        """Re-open the ``state/`` watch from ``revision``, as :meth:`_resume` does for ``rounds/``."""
        self._state_watch.set_listener(None)
        self._start_resumer(lambda: self._reopen(self._view.keys.state_prefix, revision, self._adopt_state))

    def _start_resumer(self, target) -> None:
        self._resumer = threading.Thread(
            target=target, name=f"rdzv-monitor-resume-{self._view.keys.run_id}-r{self._view.record.round}", daemon=True
        )
        self._resumer.start()

    def _reopen(self, prefix: str, revision: int, adopt) -> None:
        def attempt() -> Watch:
            if self._stopped.is_set():
                raise BackendClosedError("the monitor stopped")
            return self._backend.watch_prefix(prefix, revision)

        try:
            watch = _RESUME_POLICY.run(attempt)  # retries while the store is unreachable or slow
        except BackendClosedError:
            return  # the monitor or its backend stopped
        except CompactedError as error:
            self.signal(MembershipChange.MEMBER_LOST, f"membership history was compacted ({error}); "
                                                      "restarting to be safe")
            return
        except BackendError as error:  # the server refused (auth, protocol): not an outage
            self.signal(MembershipChange.MEMBER_LOST, f"cannot watch {prefix} ({error}); restarting to be safe")
            return
        adopt(watch)

    def _adopt_state(self, watch: Watch) -> None:
        with self._lock:
            if self._stopped.is_set():
                watch.cancel()
                return
            old, self._state_watch = self._state_watch, watch
        old.cancel()
        self.on_state_watch(watch)
        watch.set_listener(self._on_state_events)


def _describe(change: MembershipChange, key: str) -> str:
    return {
        MembershipChange.MEMBER_LOST: f"member lost ({key} vanished)",
        MembershipChange.NODES_WAITING: f"a node is waiting to join ({key})",
        MembershipChange.ROUND_SUPERSEDED: "a newer round was closed",
        MembershipChange.CLOSED: "the rendezvous was closed",
        MembershipChange.STORE_UNREACHABLE: "the store does not answer",
    }[change]
