"""The public rendezvous handler: joins rounds over any :class:`~backends.api.KVBackend`.

Protocol (DESIGN §3), per round ``r`` of one run:

1. A node holds one :class:`~backends.session.Session` (a lease) for its whole life.
2. It joins with one transaction (:func:`~elastic.rendezvous.transactions.join_txn`): put its
   own lease-bound key ``rounds/<r>/nodes/<node>``, claim ``state/closer/<r>`` if nobody holds
   it (else read the holder), count the round's joiners, and drop its key of an earlier round.
   The node watches ``state/`` from now first and reads after (a watch from a past revision
   waits for etcd's 100 ms catch-up loop); the watch lives as long as the handler. The first
   join is guarded: if the round record is the one the node expects (none, or the round it was
   last in), join the next round; either way read ``state/``. A wrong guess writes nothing and
   the node joins the round the read shows.
3. The node that created the claim is the *closer*. The join whose count reaches ``max_nodes``
   closes the round at once; below the maximum the closer, which alone watches every join,
   closes it at ``min_nodes`` once the last-call window has passed (and at the maximum only if
   the filling joiner did not within a lease TTL). A close is one transaction
   (:func:`~elastic.rendezvous.transactions.close_txn`): write ``state/round`` if it is still the
   record read, recording the members read at one revision, and drop the claim. Everyone else
   watches only ``state/``, where they see the round close, or the closer's claim vanish with
   its lease (then they claim it).
4. A node not in the closed round moves to round ``r + 1`` and is *waiting*; members see it
   through their :class:`~elastic.rendezvous.monitor.MembershipMonitor` and restart.
5. A member whose lease vanishes deletes its key; every member's monitor sees the DELETE.

The decisions are the pure functions of :mod:`elastic.rendezvous.decisions`; this module only
reads, waits on watches with deadlines, and writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from backends.api import (
    ABSENT,
    EventType,
    KeyValue,
    KVBackend,
    RangeResult,
    Watch,
    WatchEvent,
)
from backends.errors import BackendError, LeaseNotFoundError
from backends.retry import RETRYABLE_ERRORS, RetryPolicy
from backends.session import OUTAGE_LOG_INTERVAL, Session
from elastic.rendezvous import records
from elastic.rendezvous.decisions import (
    BarrierOutcome,
    CloseAction,
    Joiner,
    RoundView,
    CloseDecision,
    agreed_restart_count,
    assign_ranks,
    failure_culprit,
    barrier_outcome,
    decide_close,
    everyone_back,
    holds_for_members,
    is_spare,
    join_fills_round,
    round_is_full,
    last_call_deadline,
)
from elastic.rendezvous.api import MembershipChange, MembershipStatus, Rendezvous, RendezvousInfo
from elastic.rendezvous.errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from elastic.rendezvous.attempt import ClosedRound, JoinAttempt
from elastic.rendezvous.monitor import MembershipMonitor
from elastic.rendezvous.ports import PortReservation, reserve_port
from elastic.rendezvous.progress import ProgressReporter, WaitSnapshot
from elastic.rendezvous.records import DEFAULT_ROLE, JoinRecord, Member, NodeLayout, RendezvousKeys, RoundRecord
from elastic.rendezvous.settings import RendezvousSettings
from elastic.rendezvous.transactions import JoinOutcome, close_txn, join_txn, read_close, read_join

log = logging.getLogger(__name__)

JOIN_RETRY = RetryPolicy(max_attempts=2**31, initial_backoff=0.2, max_backoff=2.0)
"""Backoff between tries of a join the store interrupted; the join timeout bounds them."""


@dataclass(frozen=True)
class _StateView:
    """``state/`` as read at one revision."""

    revision: int
    round: RoundRecord | None
    round_kv: KeyValue | None
    closed_reason: str | None = None
    """Why the rendezvous was closed for good; None while it is open."""

    @property
    def closed(self) -> bool:
        return self.closed_reason is not None


def default_node_id() -> str:
    """A node id unique per handler: host, pid and a random suffix (no '/')."""
    host = socket.gethostname().replace("/", "_") or "node"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class RendezvousHandler(Rendezvous):
    """Joins rounds of one run and watches the closed round for membership changes.

    Args:
        settings: the run's settings.
        backend: an open key-value backend; the handler does not close it unless ``owns_backend``.
        release: called once on :meth:`shutdown` (e.g. closes the backend and an embedded store).
        node_addr: the address other nodes use to reach this one (rank 0's becomes MASTER_ADDR).
        local_world_size, role: this node's workers (``--nproc-per-node``, ``--role``), published
            with every join so the round record can place every worker of every node.
        clock: monotonic clock (injectable); port_reserver: listens on this node's master port
            for a join (see :mod:`elastic.rendezvous.ports`); retry: the backoff between tries of
            a join the store interrupted (the join timeout bounds them).

    Every public method raises only :class:`~elastic.rendezvous.errors.RendezvousError` subclasses.
    """

    def __init__(
        self,
        settings: RendezvousSettings,
        backend: KVBackend,
        node_addr: str,
        *,
        node_id: str | None = None,
        owns_backend: bool = False,
        release: Callable[[], None] | None = None,
        local_world_size: int = 1,
        role: str = DEFAULT_ROLE,
        clock: Callable[[], float] = time.monotonic,
        port_reserver: Callable[[str], PortReservation] = reserve_port,
        retry: RetryPolicy = JOIN_RETRY,
    ) -> None:
        if local_world_size < 1:
            raise ValueError(f"The local world size ({local_world_size}) must be at least 1.")
        if not role:
            raise ValueError("The role must not be empty.")
        self.settings = settings
        self._node_id = node_id or default_node_id()
        self.node_addr = node_addr
        self.keys = RendezvousKeys(settings.namespace, settings.run_id)
        self._backend = backend
        self._owns_backend = owns_backend
        self._release = release
        self._clock = clock
        self._port_reserver = port_reserver
        self._retry = retry
        self.local_world_size = local_world_size
        self.role = role
        self._reservation: PortReservation | None = None  # the master port our current join publishes
        self._failed_round: int | None = None  # set by report_failure(), sent with the next join
        self._failed_at = 0.0
        self._spare_of: int | None = None  # the full round this node last logged it is a spare of
        self._session: Session | None = None
        self._monitor: MembershipMonitor | None = None
        self._attempt: JoinAttempt | None = None  # the join of the round this node is in or joining
        self._last_round: RoundRecord | None = None
        self._last_round_revision = 0  # the mod revision of the round record of _last_round
        self._lock = threading.RLock()
        self._shutting_down = threading.Event()
        self._active_watches: set = set()
        self._state_watch: Watch | None = None  # on state/, kept across rounds (see _open_state_watch)
        self._reporter = ProgressReporter(log.info, clock=clock)  # a new one per next_rendezvous
        self._progress: WaitSnapshot | None = None
        self._progress_callbacks: list[Callable[[WaitSnapshot | None], None]] = []
        self._change_callbacks: list[Callable[[], None]] = []

    # -- public API -----------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.settings.run_id

    @property
    def node_id(self) -> str:
        return self._node_id

    def get_run_id(self) -> str:
        return self.settings.run_id

    @property
    def supports_exclusion(self) -> bool:
        return True

    def membership(self) -> MembershipStatus:
        """The current round's membership as last seen. No I/O."""
        monitor, session = self._monitor, self._session
        outage = session.outage if session is not None else 0.0
        if monitor is None:
            return MembershipStatus(store_outage=outage)
        return MembershipStatus(monitor.change, monitor.reason, monitor.num_nodes_waiting, monitor.num_rejoining,
                          monitor.num_spares, outage)

    def on_change(self, callback: Callable[[], None]) -> None:
        self._change_callbacks.append(callback)

    def progress(self) -> WaitSnapshot | None:
        return self._progress

    def on_progress(self, callback: Callable[[WaitSnapshot | None], None]) -> None:
        self._progress_callbacks.append(callback)

    def _changed(self) -> None:
        for callback in self._change_callbacks:
            callback()

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and block until it closes with this node in it.

        A store that fails or cannot be reached meanwhile does not end the join: each step is
        safe to repeat (the join transaction re-puts the same key; a close that may have applied
        shows in the state read that follows), so the join starts over from a fresh read, with
        backoff, until the join timeout.

        Raises:
            RendezvousClosedError: the rendezvous was closed for good.
            RendezvousTimeoutError: no round included this node within the join timeout.
            RendezvousConnectionError: the backend failed for the whole join timeout, or refused
                (auth) in a way a retry cannot fix.
            RendezvousStateError: the state in the store is corrupt.
        """
        with self._lock:
            self._stop_monitor()
            deadline = self._clock() + self.settings.join_timeout
            self._reporter = ProgressReporter(log.info, clock=self._clock)
            try:
                info = self._join_with_retries(deadline)
            except BackendError as error:
                if self._shutting_down.is_set():
                    raise RendezvousClosedError(f"Node {self.node_id} was shut down while joining.") from error
                raise RendezvousConnectionError(
                    f"Rendezvous {self.settings.run_id}: the backend failed during the join: {error}"
                ) from error
            except RendezvousTimeoutError:
                self._leave_quietly()
                raise
            finally:
                self._set_progress(None)
            log.info("Rendezvous %s: node %s is rank %d of %d in round %d (master %s:%d)",
                     info.run_id, self.node_id, info.group_rank, info.group_world_size, info.round,
                     info.master_addr, info.master_port)
            return info

    def report_failure(self, at: float = 0.0) -> None:
        """Say that this node's own workers failed in the current round (first exit at wall time
        ``at``); the next join carries it, and the closer counts it into the agreed restart count
        and names the culprit. No I/O."""
        if self._last_round is not None:
            self._failed_round = self._last_round.round
            self._failed_at = at

    def exclude(self, cooldown: float, reason: str) -> None:
        """Leave the current round and mark this node excluded for ``cooldown`` seconds.

        The mark is a key bound to a lease of that TTL, so it vanishes by itself; the other
        members see this node's join key go and re-form without it. The next
        :meth:`next_rendezvous` joins again.

        Raises:
            RendezvousConnectionError: the backend could not be reached.
        """
        with self._lock:
            self._stop_monitor()
            self._leave_quietly()

            def mark() -> None:
                lease = self._backend.grant(cooldown)
                self._backend.put(self.keys.excluded(self.node_id), records.encode_exclusion(reason, cooldown),
                                  lease=lease.id)
            self._backend_call(mark, retry=True)
            log.warning("Rendezvous %s: node %s is excluded for %gs: %s", self.settings.run_id, self.node_id,
                        cooldown, reason)

    def is_closed(self) -> bool:
        """Whether the rendezvous was closed for good. Raises RendezvousConnectionError."""
        return self._backend_call(lambda: self._read_state().closed, retry=True)

    def job_running(self) -> bool:
        """Whether a round of this run has closed and the rendezvous is still open: a node that
        joins now interrupts running workers. One read; False when the store does not answer
        or its state is corrupt (the join that follows reports either)."""
        try:
            state = self._read_state()
        except (BackendError, RendezvousStateError):
            return False
        return state.round is not None and not state.closed

    def set_closed(self, reason: str = RendezvousClosedError.JOB_FINISHED) -> None:
        """Close the rendezvous for every node (job finished or failed for good). Idempotent."""
        record = records.encode_closed(records.ClosedRecord(reason))
        self._backend_call(lambda: self._backend.put_if(self.keys.closed, record, ABSENT), retry=True)

    def num_nodes_waiting(self) -> int:
        """Nodes waiting for the next round that justify a restart; 0 before the first round. No I/O."""
        monitor = self._monitor
        return monitor.num_nodes_waiting if monitor is not None else 0

    def num_members_rejoining(self) -> int:
        """Members of the current round that already joined the next one (they restarted). No I/O."""
        monitor = self._monitor
        return monitor.num_rejoining if monitor is not None else 0

    def store_outage(self) -> float:
        """Seconds the store has not answered this node's keepalives (0.0 while it answers). No I/O."""
        session = self._session
        return session.outage if session is not None else 0.0

    def num_spares(self) -> int:
        """Nodes waiting as spares beyond this node's full round; 0 when there is room. No I/O."""
        monitor = self._monitor
        return monitor.num_spares if monitor is not None else 0

    @property
    def membership_changed(self) -> threading.Event:
        """Set when the current round's membership changed (member lost, node waiting, closed)."""
        monitor = self._monitor
        return monitor.changed if monitor is not None else threading.Event()

    def membership_change(self) -> tuple[MembershipChange | None, str]:
        """The first change seen in the current round, and a sentence about it."""
        monitor = self._monitor
        return (monitor.change, monitor.reason) if monitor is not None else (None, "")

    def finish(self, timeout: float) -> bool:
        """The exit barrier: mark this member done and wait until every member is, or ``timeout``.

        Members that are done may leave without their peers seeing them as *lost*, so a node
        whose workers finished first does not restart the others' last steps. A member whose
        join key vanishes before it is done (its lease lapsed; it restarts into the next round)
        ends the wait at once: it will never finish this round.
        Returns True when every member of the round finished in time.

        Raises:
            RendezvousConnectionError: the backend could not be reached.
        """
        record = self._last_round
        if record is None or self._session is None:
            return True
        round_number = record.round
        members = frozenset(member.node_id for member in record.members)
        deadline = self._clock() + timeout

        def wait_for_all() -> tuple[BarrierOutcome, frozenset[str]]:
            # Watch from now, then mark and read (see _join_until_included). Any done event
            # counts, a DELETE too: a member that saw everyone done leaves and revokes its lease,
            # and its done key may be gone before our read (the watch reports it, in the same
            # batch as its join key's DELETE).
            with self._watch(self.keys.round_prefix(round_number)) as watch:
                self._backend.put(self.keys.done(round_number, self.node_id), b"{}", lease=self._session.lease_id)
                present: set[str] = set()
                done: set[str] = set()
                read = self._backend.get_prefix(self.keys.round_prefix(round_number))
                for kv in read.kvs:
                    self._note_barrier_key(kv.key, True, round_number, present, done)
                while (outcome := barrier_outcome(members, frozenset(present), frozenset(done))) is BarrierOutcome.WAIT:
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        return BarrierOutcome.WAIT, members - done
                    for event in watch.get(timeout=remaining):
                        if event.revision > read.revision or self.keys.parse_done_key(event.kv.key) is not None:
                            self._note_barrier_key(event.kv.key, event.type is EventType.PUT, round_number, present, done)
            return outcome, members - done

        outcome, unfinished = self._backend_call(wait_for_all)
        if outcome is BarrierOutcome.WAIT:
            log.warning("Rendezvous %s: exit barrier timed out after %.0fs; leaving anyway", self.settings.run_id, timeout)
        elif outcome is BarrierOutcome.MEMBER_LOST:
            log.warning("Rendezvous %s: a member of round %d left before finishing (%s); leaving the exit barrier",
                        self.settings.run_id, round_number, ", ".join(sorted(unfinished)))
        return outcome is BarrierOutcome.ALL_DONE

    def _note_barrier_key(self, key: str, put: bool, round_number: int, present: set[str], done: set[str]) -> None:
        marked = self.keys.parse_done_key(key)
        if marked is not None and marked[0] == round_number:
            done.add(marked[1])  # a PUT or a DELETE: either way it was done
            return
        joined = self.keys.parse_node_key(key)
        if joined is not None and joined[0] == round_number:
            (present.add if put else present.discard)(joined[1])

    def shutdown(self) -> bool:
        """Leave the rendezvous without closing it for the others (their monitors see us go).

        A join in progress in another thread is interrupted (it raises RendezvousClosedError).
        """
        self._shutting_down.set()
        for watch in list(self._active_watches):
            watch.cancel()
        with self._lock:
            self._stop_monitor()
            self._leave_quietly()
            if self._state_watch is not None:
                self._state_watch.cancel()
                self._state_watch = None
            if self._session is not None:
                self._session.close(revoke=True)
                self._session = None
            self._drop_reservation()
            if self._owns_backend:
                self._backend.close()
            if self._release is not None:
                self._release()
                self._release = None
            return True

    # -- joining --------------------------------------------------------------------------------
    def _join_with_retries(self, deadline: float) -> RendezvousInfo:
        """:meth:`_join_until_included`, started over after each transient store failure until ``deadline``."""
        failures, logged = 0, -math.inf
        while True:
            try:
                return self._join_until_included(deadline, resumed=failures > 0)
            except RETRYABLE_ERRORS as error:
                failures += 1
                pause = self._retry.backoff(failures)
                now = self._clock()
                if self._shutting_down.is_set() or now + pause >= deadline:
                    raise
                if now - logged >= OUTAGE_LOG_INTERVAL:
                    logged = now
                    log.warning("Rendezvous %s: node %s: the store failed during the join (%s); starting over until "
                                "it answers (%.0fs of the join timeout left)", self.settings.run_id, self.node_id,
                                error, deadline - now)
                if self._shutting_down.wait(pause):
                    raise

    def _join_until_included(self, deadline: float, resumed: bool = False) -> RendezvousInfo:
        """Join until a round includes this node. ``resumed``: an earlier try failed midway, so
        read the state first: a close it sent may have applied (then this node is in)."""
        # Watch first, then read: the watch (from now) is live at once, and the read is taken at
        # its start revision or later, so nothing falls between them (see KVBackend.watch_prefix).
        # The first join is optimistic: the round we expect to form next, guarded by the round
        # record we expect, in the same step as the state read (one round trip instead of two).
        state_watch = self._open_state_watch()
        if resumed:
            state, attempt = self._read_state(), None
            closed = self._closed_with_us(state)
            if closed is not None:
                return self._included(closed, closed.record.rank_of(self.node_id))  # type: ignore[arg-type]
        else:
            state, attempt = self._join_expected_round()
        while True:
            if state.closed:
                raise RendezvousClosedError(
                    f"The rendezvous {self.settings.run_id} is closed; no new round will form", state.closed_reason
                )
            forming = state.round.round + 1 if state.round else 0
            if attempt is None:
                attempt = self._join(forming)
            # A spare has no join timeout: it waits for a member to be lost (or the job to end).
            wait_deadline = math.inf if self._is_spare(state) else deadline
            self._note_wait(forming, attempt.count, wait_deadline)
            try:
                closed = None
                if join_fills_round(attempt.count, self.settings.max_nodes):
                    closed = self._try_close(forming, state)  # our join filled the round: close it now
                if closed is None:
                    closed = self._wait_for_round(attempt, state, state_watch, wait_deadline)
            except _JoinKeyLost as lost:
                log.warning("Rendezvous %s: node %s lost its join key for round %d (%s); joining again",
                            self.settings.run_id, self.node_id, forming, lost)
                state, attempt = self._read_state(), None
                continue
            rank = closed.record.rank_of(self.node_id)
            if rank is not None:
                return self._included(closed, rank)
            log.info("Rendezvous %s: round %d closed without node %s; waiting for round %d",
                     self.settings.run_id, closed.record.round, self.node_id, closed.record.round + 1)
            state, attempt = self._read_state(), None

    def _is_spare(self, state: _StateView) -> bool:
        """Whether this node waits as a spare now; says so once per full round."""
        if not is_spare(state.round, self.node_id, self.settings.max_nodes):
            return False
        if self._spare_of != state.round.round:  # type: ignore[union-attr]
            self._spare_of = state.round.round  # type: ignore[union-attr]
            log.info("Rendezvous %s: node %s waits as a spare: round %d is full (%d of at most %d nodes) and every "
                     "member is alive; it joins the first round with room (when a member is lost)",
                     self.settings.run_id, self.node_id, state.round.round, state.round.group_world_size,  # type: ignore[union-attr]
                     self.settings.max_nodes)
        return True

    def _closed_with_us(self, state: _StateView) -> ClosedRound | None:
        """The round in ``state`` if it is the one this node's pending join was for and it includes us."""
        attempt, record = self._attempt, state.round
        if attempt is None or record is None or state.round_kv is None or record.round != attempt.forming:
            return None
        if self._last_round is not None and record.round <= self._last_round.round:
            return None
        if record.rank_of(self.node_id) is None or self._session is None or not self._session.alive:
            return None
        return ClosedRound(record, state.round_kv.mod_revision)

    def _join_expected_round(self) -> tuple[_StateView, JoinAttempt | None]:
        """Join the round expected to form next if the round record is the one we expect, and read ``state/``.

        The expectation is the round this node was last in (its mod revision), or no round at
        all for a node that never joined. Returns the state and the new attempt; None when the
        expectation was wrong, in which case nothing was written.
        """
        if self._last_round is None:
            forming, expected = 0, 0
        else:
            forming, expected = self._last_round.round + 1, self._last_round_revision
        outcome = self._send_join(forming, expected)
        return self._state_from(outcome.state), self._attempt if outcome.joined else None  # type: ignore[arg-type]

    def _join(self, forming: int) -> JoinAttempt:
        """Join round ``forming`` and claim its closer if unclaimed (see :func:`join_txn`)."""
        self._send_join(forming, None)
        return self._attempt  # type: ignore[return-value]

    def _send_join(self, forming: int, expected_round: int | None) -> JoinOutcome:
        """Send the join transaction of round ``forming`` on a live lease; a join that applied
        becomes :attr:`_attempt` (the previous attempt's key is deleted in the same step)."""
        self._drop_reservation()
        try:
            self._reservation = self._port_reserver(self.node_addr)
        except OSError as error:
            raise RendezvousError(f"Rendezvous {self.settings.run_id}: node {self.node_id} cannot listen on a "
                                  f"master port on {self.node_addr}: {error}") from error
        value = b""

        def send() -> JoinOutcome:
            nonlocal value
            lease = self._ensure_session().lease_id  # may drop a failure report: see _ensure_session
            value = records.encode_join(JoinRecord(self.node_id, self.node_addr, self._reservation.port,
                                                   self.local_world_size, self.role, self._failed_round,
                                                   self._failed_at))
            previous = self._attempt.key if self._attempt is not None else None
            txn = join_txn(self.keys, forming, self.node_id, value, lease, previous, expected_round)
            return read_join(self._backend.txn(txn), self.keys.closer(forming), expected_round is not None)

        try:
            outcome = send()
        except LeaseNotFoundError:
            # The lease expired before the keepalive thread noticed (the process was frozen for
            # longer than the TTL): its keys are gone with it, so join again on a new lease.
            log.warning("Rendezvous %s: node %s lost its lease unnoticed; joining round %d on a new one",
                        self.settings.run_id, self.node_id, forming)
            self._session.close(revoke=False)  # type: ignore[union-attr]
            self._session = None
            self._failed_round = None  # the membership ended with the lease (see _ensure_session)
            outcome = send()
        if outcome.joined:
            self._attempt = JoinAttempt(forming, self.keys.node(forming, self.node_id), value, outcome.count,
                                        outcome.closer)  # type: ignore[arg-type]
        return outcome

    def _is_mine(self, claim: KeyValue) -> bool:
        session = self._session
        return session is not None and claim.lease == session.lease_id and _joiner(claim).node_id == self.node_id

    def _wait_for_round(self, attempt: JoinAttempt, state: _StateView, state_watch, deadline: float) -> ClosedRound:
        """Block until round ``attempt.forming`` (or a later one) is closed; close it ourselves if we hold the claim.

        ``state_watch`` watches ``state/`` from at or before ``state.revision`` + 1.
        """
        forming, claim_key = attempt.forming, self.keys.closer(attempt.forming)
        while True:
            if self._is_mine(attempt.closer):
                attempt.holds_claim = True
                closed = self._close_round(forming, state, deadline)
                if closed.record.round == forming and attempt.closer.create_revision < closed.revision:
                    attempt.holds_claim = False  # every close of a round deletes its claim in the same step
                self._release_claim()  # so this only deletes a claim on a round closed past us
                return closed
            closed = self._await_close_or_closer_loss(state_watch, attempt, state.revision, deadline)
            if closed is not None:
                return closed
            # The closer's claim vanished (its lease lapsed, or it left): claim it ourselves.
            result = self._backend.put_if(claim_key, attempt.value, ABSENT, lease=self._ensure_session().lease_id)
            if result.current is None:
                continue  # the winner is already gone too: try again
            attempt.closer = result.current
            log.info("Rendezvous %s: the closer of round %d left; node %s now closes it",
                     self.settings.run_id, forming, _joiner(attempt.closer).node_id)

    def _await_close_or_closer_loss(self, state_watch, attempt: JoinAttempt, read_revision: int,
                                    deadline: float) -> ClosedRound | None:
        """Wait on ``state/`` for the close (returns it) or the loss of the closer's claim (None).

        Events at or below ``read_revision`` are skipped: the state read already reflected them.
        Events after the close in the same batch go to ``attempt.backlog``, for the monitor.
        """
        forming, claim_key = attempt.forming, self.keys.closer(attempt.forming)
        held_since = attempt.closer.create_revision
        while True:
            now = self._clock()
            if now >= deadline:
                raise self._timeout(forming)
            if self._reporter.due():  # only the closer watches the joins: read them when a line is due
                self._note_wait(forming, self._read_joiners(forming)[0], deadline)
            wake = min(deadline, self._reporter.next_due())
            batch = state_watch.get(timeout=max(min(wake - now, self.settings.lease_ttl), 0.0))
            for index, event in enumerate(batch):
                if event.revision <= read_revision:
                    continue
                closed = self._closed_round_from(event, forming)
                if closed is not None:
                    attempt.backlog = batch[index + 1:]
                    return closed
                if event.kv.key != claim_key or event.revision <= held_since:
                    continue  # not the claim, or a change from before the current holder claimed
                if event.type is EventType.DELETE:
                    return None
                held_since = event.kv.create_revision  # a new holder (seen before our claim attempt)
            self._check_still_joined()

    def _closed_round_from(self, event, forming: int) -> ClosedRound | None:
        if event.type is not EventType.PUT:
            return None
        if event.kv.key == self.keys.closed:
            raise RendezvousClosedError(
                f"The rendezvous {self.settings.run_id} was closed while joining",
                records.decode_closed(event.kv.key, event.kv.value).reason,
            )
        if event.kv.key == self.keys.round:
            record = records.decode_round(event.kv.key, event.kv.value)
            if record.round >= forming:
                return ClosedRound(record, event.revision)
        return None

    def _close_round(self, forming: int, state: _StateView, deadline: float) -> ClosedRound:
        """The closer's loop: watch joins, decide, and close with one compare-and-swap."""
        with self._watch(self.keys.root) as watch:  # from now, then read: see _join_until_included
            joined, seen_revision = self._read_joiners(forming)
            alive = self._read_alive(state.round)
            already = self._backend.get(self.keys.round).kv  # the join that filled it may have closed it
            if already is not None and (record := records.decode_round(already.key, already.value)).round >= forming:
                return ClosedRound(record, already.mod_revision)
            last_call: float | None = None
            full_since: float | None = None
            while True:
                now = self._clock()
                if holds_for_members(state.round, joined, alive, self.settings.max_nodes):
                    last_call = full_since = None
                    decision = CloseDecision(CloseAction.WAIT, reason="every member of the full round is alive")
                else:
                    last_call = last_call_deadline(last_call, len(joined), self.settings.min_nodes, now,
                                                   self.settings.last_call_timeout)
                    if len(joined) < self.settings.max_nodes:
                        full_since = None
                    elif full_since is None:
                        full_since = now
                    decision = decide_close(len(joined), self.settings.min_nodes, self.settings.max_nodes, last_call,
                                            now, full_since, self.settings.lease_ttl,
                                            everyone_back(state.round, joined, alive))
                if decision.action is CloseAction.CLOSE:
                    closed = self._try_close(forming, state)
                    if closed is not None:
                        return closed
                    joined, seen_revision = self._read_joiners(forming)
                    alive = self._read_alive(state.round)
                    continue
                if now >= deadline:
                    raise self._timeout(forming)
                self._note_wait(forming, joined, deadline)
                wait_until = min(deadline, decision.wait_until or deadline, now + self.settings.lease_ttl,
                                 self._reporter.next_due())
                for event in watch.get(timeout=max(wait_until - now, 0.0)):
                    if event.revision <= seen_revision:
                        continue  # reflected in the read
                    closed = self._closed_round_from(event, forming)
                    if closed is not None:
                        return closed
                    self._apply_join_event(joined, forming, event)
                    self._apply_alive_event(alive, state.round, event)
                self._check_still_joined()
                if self.node_id not in joined:
                    raise _JoinKeyLost("our key vanished (the lease expired)")

    def _read_alive(self, previous: RoundRecord | None) -> set[str]:
        """The previous round's nodes whose join keys of that round still exist (alive and not
        rejoined yet): for the spare rule (:func:`holds_for_members`) and the early close
        (:func:`everyone_back`)."""
        if previous is None:
            return set()
        read = self._backend.get_prefix(self.keys.nodes_prefix(previous.round))
        return {kv.key[len(self.keys.nodes_prefix(previous.round)):] for kv in read.kvs}

    def _apply_alive_event(self, alive: set[str], previous: RoundRecord | None, event) -> None:
        parsed = self.keys.parse_node_key(event.kv.key)
        if previous is None or parsed is None or parsed[0] != previous.round:
            return
        (alive.add if event.type is EventType.PUT else alive.discard)(parsed[1])

    def _apply_join_event(self, joined: dict[str, Joiner], forming: int, event) -> None:
        parsed = self.keys.parse_node_key(event.kv.key)
        if parsed is None or parsed[0] != forming:
            return
        if event.type is EventType.DELETE:
            joined.pop(parsed[1], None)
        else:
            joined[parsed[1]] = _joiner(event.kv)

    def _try_close(self, forming: int, state: _StateView) -> ClosedRound | None:
        """Close ``forming`` with the members read now; None if too few remain (keep waiting)."""
        read = self._backend.get_prefix(self.keys.nodes_prefix(forming))
        joiners = [_joiner(kv) for kv in read.kvs]
        members, spares = assign_ranks(state.round, joiners, self.settings.max_nodes)
        if len(members) < self.settings.min_nodes:
            return None
        if round_is_full(state.round, self.settings.max_nodes) and holds_for_members(  # the read only then
                state.round, (j.node_id for j in joiners), self._read_alive(state.round), self.settings.max_nodes):
            return None  # a spare must not take a live member's place; the closer waits for a change
        member_ids = {member.node_id for member in members}
        included = [j for j in joiners if j.node_id in member_ids]
        restarts = agreed_restart_count(state.round, included)
        record = RoundRecord(forming, members, read.revision, restarts, failure_culprit(state.round, included))
        expected = state.round_kv.mod_revision if state.round_kv is not None else 0
        result = read_close(self._backend.txn(close_txn(self.keys, forming, records.encode_round(record), expected)))
        if result.applied:
            if self._attempt is not None and self._attempt.forming == forming:
                self._attempt.holds_claim = False  # the close dropped it
            log.info("Rendezvous %s: node %s closed round %d with %d member%s (%d spares)", self.settings.run_id,
                     self.node_id, forming, len(members), "" if len(members) == 1 else "s", len(spares))
            return ClosedRound(record, result.revision)
        if result.current is None:
            raise RendezvousError(f"The round record {self.keys.round} vanished while closing round {forming}.")
        current = records.decode_round(self.keys.round, result.current.value)
        if current.round >= forming:
            return ClosedRound(current, result.current.mod_revision)
        raise RendezvousError(
            f"The round record {self.keys.round} changed to round {current.round} while closing round {forming}."
        )

    def _included(self, closed: ClosedRound, rank: int) -> RendezvousInfo:
        record = closed.record
        self._last_round = record
        self._last_round_revision = closed.revision
        view = RoundView(self.keys, record, self.node_id, self.settings.max_nodes, closed.revision)
        backlog: list[WatchEvent] = []
        if self._attempt is not None:
            backlog, self._attempt.backlog = self._attempt.backlog, []
        self._monitor = MembershipMonitor(self._backend, view, record.members_revision + 1, self._state_watch,  # type: ignore[arg-type]
                                          backlog, on_state_watch=self._adopt_state_watch,
                                          on_change=self._changed)
        session = self._session
        if session is not None and session.lost.is_set():  # lost before the monitor existed
            self._monitor.signal(MembershipChange.MEMBER_LOST, f"this node's lease was lost: {session.lost_reason}")
        self._failed_round = None
        reservation, self._reservation = self._reservation, None
        listener = reservation.take() if reservation is not None and rank == 0 else None
        if reservation is not None:
            reservation.close()
        master = record.members[0]
        return RendezvousInfo(self.settings.run_id, record.round, rank, record.group_world_size,
                              master.addr, master.master_port, record.members, restart_count=record.restart_count,
                              layout=record.layout_of(self.node_id), culprit=record.culprit, master_listener=listener)

    # -- helpers --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _watch(self, prefix: str, start_revision: int | None = None):
        """A watch (from now by default) that :meth:`shutdown` can cancel from another thread."""
        watch = self._backend.watch_prefix(prefix, start_revision)
        self._active_watches.add(watch)
        try:
            if self._shutting_down.is_set():
                watch.cancel()
            yield watch
        finally:
            self._active_watches.discard(watch)
            watch.cancel()

    def _open_state_watch(self) -> Watch:
        """The handler's watch on ``state/``, from now, kept across rounds.

        The join waits on it, and the membership monitor reads it while the round runs, so a
        member watches ``state/`` once for its lifetime instead of once per round. Events
        still queued predate the read that follows (the join's read reflects them) and are
        dropped; a watch that failed is replaced.
        """
        watch = self._state_watch
        if watch is not None:
            try:
                while watch.get(timeout=0):
                    pass
                return watch
            except BackendError:
                self._active_watches.discard(watch)
                watch.cancel()
                self._state_watch = None
        watch = self._backend.watch_prefix(self.keys.state_prefix)
        self._state_watch = watch
        self._active_watches.add(watch)
        if self._shutting_down.is_set():
            watch.cancel()
        return watch

    def _log_retry(self, attempt: int, error: BaseException) -> None:
        if attempt == 1 or attempt % 10 == 0:
            log.warning("Rendezvous %s: node %s: the store failed (%s); retrying (attempt %d)",
                        self.settings.run_id, self.node_id, error, attempt + 1)

    def _signal(self, change: MembershipChange, reason: str) -> None:
        """Tell the monitor of the round this node is in (if any) about a change seen by the session."""
        monitor = self._monitor
        if monitor is not None:
            monitor.signal(change, reason)

    def _adopt_state_watch(self, watch: Watch) -> None:
        """The monitor replaced the lost ``state/`` watch: keep the new one (it stays ours across rounds)."""
        old, self._state_watch = self._state_watch, watch
        self._active_watches.discard(old)
        self._active_watches.add(watch)
        if self._shutting_down.is_set():
            watch.cancel()

    def _check_still_joined(self) -> None:
        """Raise _JoinKeyLost when our session (so our join key) is gone, or we are shutting down."""
        if self._shutting_down.is_set():
            raise RendezvousClosedError(f"Node {self.node_id} was shut down while joining.")
        if self._session is None or not self._session.alive:
            raise _JoinKeyLost("our lease was lost")

    def _read_state(self) -> _StateView:
        return self._state_from(self._backend.get_prefix(self.keys.state_prefix))

    def _state_from(self, read: RangeResult) -> _StateView:
        """The state view of a read of ``state/``. Raises RendezvousStateError for corrupt records."""
        round_kv = next((kv for kv in read.kvs if kv.key == self.keys.round), None)
        closed_kv = next((kv for kv in read.kvs if kv.key == self.keys.closed), None)
        reason = records.decode_closed(closed_kv.key, closed_kv.value).reason if closed_kv is not None else None
        round_record = records.decode_round(round_kv.key, round_kv.value) if round_kv is not None else None
        return _StateView(read.revision, round_record, round_kv, reason)

    def _read_joiners(self, forming: int) -> tuple[dict[str, Joiner], int]:
        """The joiners of round ``forming`` and the revision they were read at."""
        read = self._backend.get_prefix(self.keys.nodes_prefix(forming))
        return {joiner.node_id: joiner for joiner in (_joiner(kv) for kv in read.kvs)}, read.revision

    def _ensure_session(self) -> Session:
        """The live session, or a new one. Replacing one the server expired also drops a pending
        failure report: this node's membership ended with its lease, and its workers' failure
        that follows is that loss's consequence (its peers moved on), not a failure to charge."""
        if self._session is None or not self._session.alive:
            if self._session is not None:
                if self._session.lost.is_set() and self._failed_round is not None:
                    log.info("Rendezvous %s: node %s lost its lease; its workers' failure in round %d is not "
                             "reported as its own", self.settings.run_id, self.node_id, self._failed_round)
                    self._failed_round = None
                self._session.close(revoke=False)
            session = Session(self._backend, self.settings.lease_ttl, name=f"{self.settings.run_id}/{self.node_id}",
                                            outage_limit=self.settings.store_outage_timeout)
            session.on_lost(lambda reason: self._signal(MembershipChange.MEMBER_LOST,
                                                        f"this node's lease was lost: {reason}"))
            session.on_outage_limit(lambda age: self._signal(
                MembershipChange.STORE_UNREACHABLE,
                f"the store has not answered for {age:.0f}s (store_outage_timeout="
                f"{self.settings.store_outage_timeout:g}s); stopping the workers rather than train blind"))
            self._session = session
            self._attempt = None  # its keys went with the old lease
        return self._session

    def _drop_reservation(self) -> None:
        reservation, self._reservation = self._reservation, None
        if reservation is not None:
            reservation.close()

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor.stop()
            self._monitor = None

    def _release_claim(self) -> None:
        """Delete our closer claim if we still hold it: another node closed the round, or we
        leave (our own close drops it with the round record). Best effort: it goes with our lease."""
        attempt = self._attempt
        if attempt is None or not attempt.holds_claim:
            return
        attempt.holds_claim = False
        claim = self.keys.closer(attempt.forming)
        try:
            self._backend.delete(claim)
        except BackendError as error:
            log.warning("Rendezvous %s: could not delete %s: %s (it goes with our lease)", self.settings.run_id, claim, error)

    def _leave_quietly(self) -> None:
        self._drop_reservation()
        self._release_claim()
        attempt, self._attempt = self._attempt, None
        if attempt is None:
            return
        try:
            self._backend.delete(attempt.key)
        except BackendError as error:
            log.warning("Rendezvous %s: could not delete %s on leave: %s", self.settings.run_id, attempt.key, error)

    def _note_wait(self, forming: int, joined: int | dict[str, Joiner] | None, deadline: float) -> None:
        """Hand what this node knows of round ``forming`` (a count, or the joiners) to the progress reporter."""
        count = joined if joined is None or isinstance(joined, int) else len(joined)
        expected = None
        if self._last_round is not None and isinstance(joined, dict):
            expected = tuple(m.node_id for m in self._last_round.members if m.node_id not in joined)
        snapshot = WaitSnapshot(self.settings.run_id, self.node_id, forming, count, self.settings.min_nodes,
                                self.settings.max_nodes, expected, deadline - self._clock())
        self._set_progress(snapshot)
        self._reporter.update(snapshot)

    def _set_progress(self, snapshot: WaitSnapshot | None) -> None:
        self._progress = snapshot
        for callback in self._progress_callbacks:
            callback(snapshot)

    def _timeout(self, forming: int) -> RendezvousTimeoutError:
        last = self._reporter.last
        seen = f" (last seen: {last.counts_text()} joined)" if last is not None and last.round == forming else ""
        return RendezvousTimeoutError(
            f"Rendezvous {self.settings.run_id}: round {forming} did not include node {self.node_id} within the "
            f"join timeout ({self.settings.join_timeout:g}s); need at least {self.settings.min_nodes} nodes{seen}. "
            f"Start more nodes or raise --rdzv-conf join_timeout."
        )

    def _backend_call(self, call, retry: bool = False):
        """Run ``call``; with ``retry``, again after transient store failures for up to the join
        timeout (the call must be safe to repeat). Raises RendezvousConnectionError."""
        try:
            if retry:
                policy = dataclasses.replace(self._retry, total_timeout=self.settings.join_timeout)
                return policy.run(call, on_retry=self._log_retry)
            return call()
        except BackendError as error:
            raise RendezvousConnectionError(f"Rendezvous {self.settings.run_id}: backend failed: {error}") from error


class _JoinKeyLost(Exception):
    """Our join key vanished while waiting for the round (our lease expired); join again."""


def _joiner(kv: KeyValue) -> Joiner:
    record = records.decode_join(kv.key, kv.value)
    return Joiner(record.node_id, record.addr, record.master_port, kv.create_revision, record.local_world_size,
                  record.role, record.failed_round, record.failed_at)
