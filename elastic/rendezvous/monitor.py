"""Watches a closed round for the changes that should restart its members.

Two watches feed the monitor: its own on the run's ``rounds/`` keys from the revision after
the round's member list was read (members leaving, nodes waiting for the next round, members
marked done), and the node's ``state/`` watch, read through a subscription to
:class:`~elastic.rendezvous.membership.StateWatch` (the rendezvous closed for good, a newer
round); the monitor never opens, replaces or keeps that one. Each event is classified with
:func:`elastic.rendezvous.round_events.classify`; the first change is kept in :attr:`status` and
sets :attr:`changed`. The ``rounds/`` watch does not replay the round record, which is
O(members) bytes, to every member.

No thread of its own: the watches call the monitor back on the backend's delivering thread,
and classifying is pure and quick.

Static stability (DESIGN §3.10): the backend resumes both watches across outages (the
contract, :mod:`backends.api`), so an unreachable store never restarts the workers. Only the
server's word does: a key deleted, a newer round, the rendezvous closed. When a watch cannot
resume because the history it needs was compacted, :meth:`MembershipMonitor._reconcile` (the
one place that handles it, on a short-lived thread) re-reads the round, the next round and
``state/`` at one revision, asks :func:`~elastic.rendezvous.reconcile.reconcile` what changed
against the round this node acted on, and watches again from after that read: a reconnect is
never by itself a membership change. Corrupt state seen is reported once, as one line naming
the key and the fix, and kept in :attr:`MembershipMonitor.problem`; the workers keep training.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Callable, Sequence

from backends.api import KVBackend, Watch, WatchEvent
from backends.errors import BackendClosedError, BackendError, CompactedError
from backends.retry import RetryPolicy
from backends.txn import TxnResult
from elastic.rendezvous.api import MembershipChange, MembershipStatus
from elastic.rendezvous.round_events import (
    MonitorState,
    RoundView,
    classify,
    deleted_by_hand,
    rejoining_count,
    spare_count,
    waiting_counts,
)
from elastic.rendezvous.departures import LEASE_EXPIRED
from elastic.rendezvous.reconcile import reconcile
from elastic.rendezvous.errors import RendezvousStateError
from elastic.rendezvous.membership import StateWatch
from elastic.rendezvous.transactions import read_reread, reread_txn

log = logging.getLogger(__name__)

REREAD_POLICY = RetryPolicy(max_attempts=2**31, initial_backoff=0.1, max_backoff=2.0)
"""Re-reading after a compacted watch: until it works or the monitor stops."""


class MembershipMonitor:
    """Background classification of one closed round's changes.

    Build it with :meth:`open`. Attributes:
        changed: set once a change that should restart the members was seen.
        status: the membership as last seen, one immutable value (``store_outage`` is 0.0:
            the session, not the monitor, knows the outage).
        problem: corrupt state seen on a watch, or None (see the module docstring).
    """

    def __init__(self, backend: KVBackend, view: RoundView, state_watch: StateWatch, rounds: Watch,
                 on_change: Callable[[], None] = lambda: None, reread_policy: RetryPolicy = REREAD_POLICY) -> None:
        self._backend = backend
        self._view = view
        self._state_watch = state_watch
        self._on_change = on_change
        self._lock = threading.RLock()  # one classifier at a time; listeners fire on several threads
        self._stopped = threading.Event()
        self._policy = dataclasses.replace(reread_policy, sleep=self._stopped.wait)
        self._state = MonitorState()
        self._rounds: Watch | None = rounds
        self._reconciler: threading.Thread | None = None  # re-reads after a compacted watch
        self._held: list[WatchEvent] | None = None  # events that arrive while it re-reads
        # Events at or below this revision are reflected in a read: the round's own members read,
        # at first (a state/ event delivered late, such as an operator's deletion of the job's
        # keys that this round was formed after, is not a change of it), then each re-read.
        self._read_through = view.record.members_revision
        self.changed = threading.Event()
        self.status = MembershipStatus()
        self.problem: str | None = None
        state_watch.subscribe(self._on_events, lambda error: self._on_failure("state/", error))
        rounds.set_listener(lambda: self._drain(rounds))

    @classmethod
    def open(cls, backend: KVBackend, view: RoundView, state_watch: StateWatch,
             on_change: Callable[[], None] = lambda: None,
             retrying: Callable[[Callable[[], Watch]], Watch] = lambda open_watch: open_watch(),
             reread_policy: RetryPolicy = REREAD_POLICY) -> "MembershipMonitor":
        """Watch ``rounds/`` from the revision after the round's members were read, and start.

        ``retrying`` runs the opening (e.g. again while the store does not answer; default: once).

        Raises:
            BackendError: the watch could not be opened.
        """
        start = view.record.members_revision + 1
        rounds = retrying(lambda: backend.watch_prefix(view.keys.rounds_prefix, start))
        try:
            return cls(backend, view, state_watch, rounds, on_change, reread_policy)
        except BaseException:
            rounds.cancel()
            raise

    @property
    def change(self) -> MembershipChange | None:
        return self.status.change

    @property
    def reason(self) -> str:
        return self.status.reason

    def signal(self, change: MembershipChange, reason: str) -> None:
        """Record ``change`` (the first one wins), set :attr:`changed` and call ``on_change``."""
        with self._lock:
            if self.status.change is None:
                self.status = dataclasses.replace(self.status, change=change, reason=reason)
                log.info("Rendezvous %s round %d: node %s: %s", self._view.keys.run_id, self._view.record.round,
                         self._view.node_id, reason)
        self.changed.set()
        self._on_change()

    def stop(self) -> None:
        """Stop classifying: cancel the ``rounds/`` watch, leave ``state/`` open. Idempotent."""
        self._stopped.set()
        self._state_watch.unsubscribe()
        with self._lock:  # wait out a listener that is running right now
            rounds, self._rounds = self._rounds, None
        if rounds is not None:
            rounds.set_listener(None)
            rounds.cancel()
        reconciler = self._reconciler
        if reconciler is not None and reconciler is not threading.current_thread():
            reconciler.join(timeout=5)

    # -- the watches' listeners ------------------------------------------------------------
    def _drain(self, watch: Watch) -> None:
        with self._lock:
            if self._stopped.is_set() or watch is not self._rounds:
                return
            try:
                while events := watch.get(timeout=0):
                    self._take(events)
            except BackendError as error:
                self._on_failure("rounds/", error)

    def _on_events(self, events: list[WatchEvent]) -> None:
        with self._lock:
            if not self._stopped.is_set():
                self._take(events)

    def _take(self, events: Sequence[WatchEvent]) -> None:
        if self._held is not None:
            self._held.extend(events)  # classified after the re-read, against its revision
        else:
            self._classify([event for event in events if event.revision > self._read_through])

    def _on_failure(self, prefix: str, error: BackendError) -> None:
        """A watch ended: a compacted one is re-read, a refused one restarts to be safe."""
        with self._lock:
            if self._stopped.is_set() or isinstance(error, BackendClosedError):
                return
            if isinstance(error, CompactedError):
                self._start_reconcile(error)
                return
        self.signal(MembershipChange.MEMBER_LOST, f"cannot watch {prefix} ({error}); restarting to be safe")

    def _classify(self, events: Sequence[WatchEvent]) -> None:
        """Classify ``events``; publish the counts, then signal: the agent the signal wakes reads
        them with the change (a rejoin seen with no count yet would look like a newcomer's)."""
        waiting = self._state.waiting
        changes: list[tuple[MembershipChange, str]] = []
        deleted = deleted_by_hand(self._view, events)
        if deleted is not None:  # before the per-key "member lost" it would otherwise read as
            changes.append((MembershipChange.MEMBER_LOST, deleted))
        for event in events:
            try:
                change, self._state = classify(self._view, event, self._state)
            except RendezvousStateError as error:
                self._report_problem(error)
                continue
            if change is not None:
                node = self._view.keys.parse_node_key(event.kv.key)
                member = node is not None and self._view.record.rank_of(node[1]) is not None
                changes.append((change, _describe(change, event.kv.key, self._state, node, member)))
        if self._state.waiting != waiting:
            self._publish_counts()
        for change, reason in changes:
            self.signal(change, reason)

    def _publish_counts(self) -> None:
        view, waiting = self._view, self._state.waiting
        self.status = dataclasses.replace(self.status, waiting=waiting_counts(view, waiting),
                                          rejoining=rejoining_count(view, waiting),
                                          spares=spare_count(view, waiting))

    def _report_problem(self, error: RendezvousStateError) -> None:
        if self.problem is None:
            self.problem = str(error)
            log.error("Rendezvous %s round %d: node %s: %s (the workers keep running; the next rendezvous needs it "
                      "fixed)", self._view.keys.run_id, self._view.record.round, self._view.node_id, error)

    # -- a compacted watch: the one place that handles it ------------------------------------
    def _start_reconcile(self, error: CompactedError) -> None:
        if self._held is not None:
            return  # already re-reading (both watches share a stream and break together)
        self._held = []
        self._reconciler = threading.Thread(
            target=self._reconcile, args=(error,), daemon=True,
            name=f"rdzv-monitor-reread-{self._view.keys.run_id}-r{self._view.record.round}")
        self._reconciler.start()

    def _reconcile(self, error: CompactedError) -> None:
        """Re-read at one revision, classify against what this node acted on, watch on from there."""
        try:
            rounds, result = self._policy.run(self._reread)
        except BackendError as failure:
            with self._lock:
                held, self._held = self._held or [], None
                self._take(held)
            if not self._stopped.is_set() and not isinstance(failure, BackendClosedError):
                self.signal(MembershipChange.MEMBER_LOST, f"cannot re-read the membership after the watch history "
                                                          f"was compacted ({failure}); restarting to be safe")
            return
        keys, number = self._view.keys, self._view.record.round
        with self._lock:
            if self._stopped.is_set():
                rounds.cancel()
                return
            old, self._rounds = self._rounds, rounds
            self._read_through = result.revision
            try:
                snapshot = read_reread(keys, number, result)
            except RendezvousStateError as corrupt:
                self._report_problem(corrupt)  # as on a watch: the workers keep running, watched
            else:
                found = reconcile(self._view, self._state, snapshot)
                log.warning("Rendezvous %s round %d: node %s: the watch history was compacted (%s); re-read at "
                            "revision %d: %s", keys.run_id, number, self._view.node_id, error, snapshot.revision,
                            found.finding)
                self._state = found.state
                self._publish_counts()
                if found.change is not None:
                    self.signal(found.change, f"{found.finding} (seen in a re-read after the watch history was "
                                              f"compacted)")
            held, self._held = self._held or [], None
            self._take(sorted(held, key=lambda event: event.revision))
        if old is not None:
            old.set_listener(None)
            old.cancel()
        rounds.set_listener(lambda: self._drain(rounds))

    def _reread(self) -> tuple[Watch, TxnResult]:
        """Both watches live from now, then one read of the round, the next round and ``state/``."""
        if self._stopped.is_set():
            raise BackendClosedError("The membership monitor stopped.")
        self._state_watch.ensure_open()  # its owner re-opens it if it was the one compacted
        keys, number = self._view.keys, self._view.record.round
        rounds = self._backend.watch_prefix(keys.rounds_prefix)
        try:
            return rounds, self._backend.txn(reread_txn(keys, number))
        except BaseException:
            rounds.cancel()
            raise


def _describe(change: MembershipChange, key: str, state: MonitorState,
              node: tuple[int, str] | None = None, member: bool = False) -> str:
    """The reason for ``change`` seen at ``key`` (``node``: the round and node id of a node key;
    ``member``: that node is a member of this round, so a join of the next round is its rejoin)."""
    finished = state.finished
    if change in (MembershipChange.JOB_FINISHED, MembershipChange.JOB_FINISHED_ELSEWHERE) and finished is not None:
        return f"the job finished on node {finished.node_id} in round {finished.round}"
    return {
        MembershipChange.MEMBER_LOST: (f"member lost: {node[1]} in round {node[0]} "
                                       f"({state.why_departed(node[1]) or LEASE_EXPIRED})")
                                      if node else f"member lost ({key} vanished)",
        MembershipChange.NODES_WAITING: (f"a member rejoins: {node[1]} (round {node[0]})" if node and member
                                         else f"a node is waiting to join: {node[1]} (round {node[0]})" if node
                                         else f"a node is waiting to join ({key})"),
        MembershipChange.ROUND_SUPERSEDED: "a newer round was closed",
        MembershipChange.CLOSED: "the rendezvous was closed",
        MembershipChange.STORE_UNREACHABLE: "the store does not answer",
        MembershipChange.JOB_FINISHED: "the job finished",
        MembershipChange.JOB_FINISHED_ELSEWHERE: "the job finished on another node",
    }[change]
