"""Watches a closed round for the changes that should restart its members.

Two watches feed the monitor: one on the run's ``rounds/`` keys from the revision at which the
round's member list was read (members leaving, nodes waiting for the next round, members
marked done), and the handler's own watch on ``state/``, which is already live past the round
record (the rendezvous closed for good, a newer round). Each event is classified with
:func:`elastic.rendezvous.decisions.classify`; the first change sets
:attr:`MembershipMonitor.changed`. The ``rounds/`` watch does not replay the round record,
which is O(members) bytes, to every member.

No thread of its own: the watches call the monitor back (:meth:`~backends.api.Watch.set_listener`)
on the backend's delivering thread, and classifying is pure and quick. Only a lost
``rounds/`` watch starts a short-lived thread to resume it from its last revision.
"""

from __future__ import annotations

import logging
import threading
from typing import Sequence

from backends.api import KVBackend, Watch, WatchEvent
from backends.errors import BackendClosedError, BackendError, CompactedError
from backends.retry import RetryPolicy
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

_RESUME_POLICY = RetryPolicy(max_attempts=20, initial_backoff=0.1, max_backoff=1.0, total_timeout=30.0)


class MembershipMonitor:
    """Background classification of one closed round's changes.

    Args:
        backend: the store; the monitor opens (and cancels) its ``rounds/`` watch on it.
        view: the closed round as this member sees it.
        start_revision: the revision after the round's member list was read.
        state_watch: the handler's ``state/`` watch; the monitor reads it until :meth:`stop`
            and leaves it open (the handler owns it).
        state_backlog: ``state/`` events already taken from ``state_watch`` but not handled.

    Attributes:
        changed: set once a change that should restart the members was seen.
        change: that change (the first one), or None.
        reason: a sentence describing it, for logs and events.
    """

    def __init__(
        self,
        backend: KVBackend,
        view: RoundView,
        start_revision: int,
        state_watch: Watch,
        state_backlog: Sequence[WatchEvent] = (),
    ) -> None:
        self._backend = backend
        self._view = view
        self._state = MonitorState()
        self._stopped = threading.Event()
        self._lock = threading.RLock()  # one classifier at a time; listeners may fire on several threads
        self._state_watch = state_watch
        self._rounds_watch: Watch | None = None
        self._resumer: threading.Thread | None = None
        self.changed = threading.Event()
        self.change: MembershipChange | None = None
        self.reason = ""
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
            except BackendError as error:
                self.signal(MembershipChange.MEMBER_LOST, f"cannot watch the rendezvous state ({error}); "
                                                          "restarting to be safe")

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
                log.warning("Rendezvous %s: membership watch lost (%s); resuming from revision %d",
                            self._view.keys.run_id, error, watch.last_revision + 1)
                self._rounds_watch = None
                self._resume(watch.last_revision + 1)

    def _classify(self, events: Sequence[WatchEvent]) -> None:
        for event in events:
            change, self._state = classify(self._view, event, self._state)
            if change is not None:
                self.signal(change, _describe(change, event.kv.key))

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
        """Re-open the ``rounds/`` watch from ``revision`` on a thread (retrying), or signal a restart."""

        def resume() -> None:
            try:
                watch = _RESUME_POLICY.run(lambda: self._backend.watch_prefix(self._view.keys.rounds_prefix, revision))
            except BackendClosedError:
                return
            except BackendError as error:
                self.signal(MembershipChange.MEMBER_LOST, f"cannot watch the membership ({error}); restarting to be safe")
                return
            self._adopt(watch)

        self._resumer = threading.Thread(
            target=resume, name=f"rdzv-monitor-resume-{self._view.keys.run_id}-r{self._view.record.round}", daemon=True
        )
        self._resumer.start()


def _describe(change: MembershipChange, key: str) -> str:
    return {
        MembershipChange.MEMBER_LOST: f"member lost ({key} vanished)",
        MembershipChange.NODES_WAITING: f"a node is waiting to join ({key})",
        MembershipChange.ROUND_SUPERSEDED: "a newer round was closed",
        MembershipChange.CLOSED: "the rendezvous was closed",
    }[change]
