"""Watches a closed round for the changes that should restart its members.

One background thread per handler watches the run's keys from the revision at which the
round's member list was read, classifies each event with
:func:`elastic.rendezvous.decisions.classify`, keeps the count of waiting nodes, and sets
:attr:`MembershipMonitor.changed` on the first change. No polling: the thread blocks in the
watch; a lost watch is resumed from its last revision.
"""

from __future__ import annotations

import logging
import threading

from backends.api import KVBackend
from backends.errors import BackendClosedError, BackendError, CompactedError
from backends.retry import RetryPolicy
from elastic.rendezvous.decisions import MembershipChange, MonitorState, RoundView, classify, waiting_counts

log = logging.getLogger(__name__)

_RESUME_POLICY = RetryPolicy(max_attempts=20, initial_backoff=0.1, max_backoff=1.0, total_timeout=30.0)


class MembershipMonitor:
    """Background watch of one closed round.

    Attributes:
        changed: set once a change that should restart the members was seen.
        change: that change (the first one), or None.
        reason: a sentence describing it, for logs and events.
    """

    def __init__(self, backend: KVBackend, view: RoundView, start_revision: int) -> None:
        self._backend = backend
        self._view = view
        self._start_revision = start_revision
        self._state = MonitorState()
        self._stopped = threading.Event()
        self._watch = None
        self._lock = threading.Lock()
        self.changed = threading.Event()
        self.change: MembershipChange | None = None
        self.reason = ""
        self._thread = threading.Thread(
            target=self._run, name=f"rdzv-monitor-{view.keys.run_id}-r{view.record.round}", daemon=True
        )
        self._thread.start()

    @property
    def num_nodes_waiting(self) -> int:
        """Waiting nodes that justify a restart (see :func:`decisions.waiting_counts`)."""
        return waiting_counts(self._view, self._state.waiting)

    def signal(self, change: MembershipChange, reason: str) -> None:
        """Record ``change`` (the first one wins) and set :attr:`changed`."""
        with self._lock:
            if self.change is None:
                self.change, self.reason = change, reason
                log.info("Rendezvous %s round %d: %s", self._view.keys.run_id, self._view.record.round, reason)
        self.changed.set()

    def stop(self) -> None:
        """Stop watching; idempotent."""
        self._stopped.set()
        with self._lock:
            watch = self._watch
        if watch is not None:
            watch.cancel()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        revision = self._start_revision
        root = self._view.keys.root
        while not self._stopped.is_set():
            try:
                watch = _RESUME_POLICY.run(lambda: self._backend.watch_prefix(root, revision))
            except BackendClosedError:
                return
            except BackendError as error:
                self.signal(MembershipChange.MEMBER_LOST, f"cannot watch the membership ({error}); restarting to be safe")
                return
            with self._lock:
                self._watch = watch
            if self._stopped.is_set():
                watch.cancel()
                return
            try:
                self._consume(watch)
                return
            except BackendClosedError:
                return
            except CompactedError as error:
                self.signal(MembershipChange.MEMBER_LOST, f"membership history was compacted ({error}); restarting to be safe")
                return
            except BackendError as error:
                revision = watch.last_revision + 1
                log.warning("Rendezvous %s: membership watch lost (%s); resuming from revision %d",
                            self._view.keys.run_id, error, revision)

    def _consume(self, watch) -> None:
        while not self._stopped.is_set():
            for event in watch.get(timeout=None):
                change, self._state = classify(self._view, event, self._state)
                if change is not None:
                    self.signal(change, _describe(change, event.kv.key))


def _describe(change: MembershipChange, key: str) -> str:
    return {
        MembershipChange.MEMBER_LOST: f"member lost ({key} vanished)",
        MembershipChange.NODES_WAITING: f"a node is waiting to join ({key})",
        MembershipChange.ROUND_SUPERSEDED: "a newer round was closed",
        MembershipChange.CLOSED: "the rendezvous was closed",
    }[change]
