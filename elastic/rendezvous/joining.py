"""The join loop: join rounds until one includes this node (protocol steps 2-4 in
:mod:`elastic.rendezvous.handler`).

One :meth:`JoinLoop.join` joins with one transaction (the first one optimistic and guarded:
the round expected next, in the same step as the read of ``state/``; the writes are
:class:`~elastic.rendezvous.join_writer.JoinWriter`'s), waits on the
``state/`` watch for the round to close (closing it itself when it holds the closer claim,
through :class:`~elastic.rendezvous.closing.Closer`; the wait is
:class:`~elastic.rendezvous.round_wait.RoundWait`), and joins the next round when one closed
without it. A spare (a full round, every member alive) waits without a join timeout. A store
that fails midway, or a ``state/`` watch whose history was compacted, starts the join over from
a fresh read, with backoff, until the join timeout: every step is safe to repeat.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

from backends.errors import CompactedError, StoreFullError
from backends.retry import RETRYABLE_ERRORS, RetryPolicy
from backends.session import OUTAGE_LOG_INTERVAL
from elastic.console import CONSOLE
from elastic.rendezvous.context import RendezvousContext
from elastic.rendezvous.attempt import ClosedRound, FailureReport, Included, JoinAttempt, StateView
from elastic.rendezvous.closing import Closer, JoinKeyLost
from elastic.rendezvous.decisions import Joiner, is_spare, join_fills_round
from elastic.rendezvous.departures import Departure, LostNodes
from elastic.rendezvous.errors import RendezvousClosedError, RendezvousError, RendezvousTimeoutError
from elastic.rendezvous.gate import JoinGate
from elastic.rendezvous.join_writer import JoinWriter
from elastic.rendezvous.progress import ProgressReporter, WaitSnapshot
from elastic.rendezvous.reads import read_state
from elastic.rendezvous.round_wait import RoundWait
from elastic.rendezvous.store_full import check_writable

__all__ = ["JOIN_RETRY", "JoinLoop", "START_OVER"]

log = logging.getLogger(__name__)


JOIN_RETRY = RetryPolicy(max_attempts=2**31, initial_backoff=0.2, max_backoff=2.0)
"""Backoff between tries of a join the store interrupted; the join timeout bounds them."""

START_OVER = (*RETRYABLE_ERRORS, CompactedError)
"""Errors after which a join starts over from a fresh read."""


class JoinLoop:
    """Joins rounds for one node (see the module docstring). Not thread-safe: the handler
    calls it under its lock.

    Attributes:
        last: the round this node was last included in (None before its first).
        progress: what this node knows of the round it waits for (None when not waiting).
    """

    def __init__(self, ctx: RendezvousContext, retry: RetryPolicy) -> None:
        self._ctx = ctx
        self._retry = retry
        self._gate = JoinGate(ctx)
        self._writer = JoinWriter(ctx, self._gate)
        self._closer = Closer(ctx)
        self._round_wait = RoundWait(ctx, self._closer, self._writer)
        self._reporter = ProgressReporter(_progress_line, clock=ctx.clock)
        self._lost = LostNodes(ctx.backend, ctx.keys)
        self._progress_callbacks: list[Callable[[WaitSnapshot | None], None]] = []
        self._spare_of: int | None = None  # the full round this node last logged it is a spare of
        self.last: ClosedRound | None = None
        self.progress: WaitSnapshot | None = None

    # -- public ---------------------------------------------------------------------------
    def join(self) -> Included:
        """Join until a round includes this node; leaves (drops its key) on a join timeout.

        Raises:
            RendezvousClosedError, RendezvousTimeoutError, RendezvousStateError, RendezvousError.
            BackendError: the store failed for the whole join timeout, or refused.
        """
        deadline = self._ctx.clock() + self._ctx.settings.join_timeout
        self._reporter = ProgressReporter(_progress_line, clock=self._ctx.clock)
        self._lost.reset()
        try:
            return self._join_with_retries(deadline)
        except RendezvousTimeoutError:
            self.leave(Departure.TIMED_OUT)
            raise
        finally:
            self._set_progress(None)

    def report_failure(self, at: float) -> None:
        """This node's workers failed in the round it was last included in (first exit at ``at``)."""
        if self.last is not None:
            self._writer.failure = FailureReport(self.last.record.round, at)

    def on_progress(self, callback: Callable[[WaitSnapshot | None], None]) -> None:
        self._progress_callbacks.append(callback)

    def leave(self, why: Departure | None, detail: str = "") -> None:
        """Drop this node's join key, its claim and its port (see :meth:`JoinWriter.leave`)."""
        self._writer.leave(why, detail)

    # -- the Waiter protocol of closing.Closer -------------------------------------------------
    def note_wait(self, forming: int, joined: int | dict[str, Joiner] | None, deadline: float,
                  alive: set[str] | None = None, closes_at: float | None = None) -> None:
        """Hand what this node knows of round ``forming`` (a count, or the joiners) to the reporter;
        ``alive``: the previous round's members whose key of it exists (None: not known);
        ``closes_at``: when this node, the closer, closes the round (None: not known here)."""
        count = joined if joined is None or isinstance(joined, int) else len(joined)
        expected, lost = None, ()
        if self.last is not None and isinstance(joined, dict):
            expected, lost = self._lost.split(self.last.record, forming, joined, alive)
        now = self._ctx.clock()
        settings = self._ctx.settings
        snapshot = WaitSnapshot(settings.run_id, self._ctx.node_id, forming, count, settings.min_nodes,
                                settings.max_nodes, expected, deadline - now, lost,
                                None if closes_at is None else closes_at - now, settings.last_call_timeout)
        self._set_progress(snapshot)
        self._reporter.update(snapshot)

    def next_line_due(self) -> float:
        return self._reporter.next_due()

    def line_due(self) -> bool:
        """Whether a progress line could be due now (so fresh counts are worth a read)."""
        return self._reporter.due()

    def timeout(self, forming: int) -> RendezvousTimeoutError:
        last, settings = self._reporter.last, self._ctx.settings
        seen = f" (last seen: {last.counts_text()} joined)" if last is not None and last.round == forming else ""
        return RendezvousTimeoutError(
            f"Rendezvous {settings.run_id}: round {forming} did not include node {self._ctx.node_id} within the "
            f"join timeout ({settings.join_timeout:g}s); need at least {settings.min_nodes} nodes{seen}. "
            f"Start more nodes or raise --rdzv-conf join_timeout."
        )

    def check_still_joined(self) -> None:
        if self._ctx.membership.interrupted.is_set():
            raise RendezvousClosedError(f"Node {self._ctx.node_id} was shut down while joining.")
        if not self._ctx.membership.alive:
            raise JoinKeyLost("our lease was lost")

    # -- joining --------------------------------------------------------------------------
    def _join_with_retries(self, deadline: float) -> Included:
        """:meth:`_join_until_included`, started over after each transient store failure (or a
        compacted ``state/`` watch) until ``deadline``."""
        failures, logged = 0, -math.inf
        interrupted = self._ctx.membership.interrupted
        while True:
            try:
                included = self._join_checking_space(deadline, resumed=failures > 0)
            except START_OVER as error:
                failures += 1
                if isinstance(error, StoreFullError):  # an outage for writes: see elastic.rendezvous.store_full
                    deadline = self._ctx.membership.refusals.refused(error, deadline)
                pause = self._retry.backoff(failures)
                now = self._ctx.clock()
                if interrupted.is_set() or now + pause >= deadline:
                    raise
                if not isinstance(error, StoreFullError) and now - logged >= OUTAGE_LOG_INTERVAL:
                    logged = now
                    log.warning("Rendezvous %s: node %s: the store failed during the join (%s); starting over until "
                                "it answers (%.0fs of the join timeout left)", self._ctx.settings.run_id,
                                self._ctx.node_id, error, deadline - now)
                if interrupted.wait(pause):
                    raise
            else:
                self._ctx.membership.refusals.cleared()
                return included

    def _join_checking_space(self, deadline: float, resumed: bool) -> Included:
        """:meth:`_join_until_included`; a join timeout while the store refuses writes is an outage
        for writes (StoreFullError), not missing peers (see :mod:`elastic.rendezvous.store_full`)."""
        try:
            return self._join_until_included(deadline, resumed)
        except RendezvousTimeoutError as timeout:
            try:
                check_writable(self._ctx.backend, self._ctx.keys.state_prefix + "space-probe")
            except StoreFullError as full:
                raise full from timeout
            raise

    def _join_until_included(self, deadline: float, resumed: bool) -> Included:
        """Join until a round includes this node. ``resumed``: an earlier try failed midway, so
        read the state first: a close it sent may have applied (then this node is in)."""
        # Watch first, then read: the watch (from now) is live at once, and the read is taken at
        # its start revision or later, so nothing falls between them (see KVBackend.watch_prefix).
        self._ctx.membership.state.open()
        attempt: JoinAttempt | None
        if resumed:
            state, attempt = read_state(self._ctx.backend, self._ctx.keys), None
            closed = self._closed_with_us(state)
            if closed is not None:
                return self._included(closed)
        else:
            if self._gate.job_created is None:  # once: later joins compare the record checked
                self._gate.check_job(None)
            state, attempt = self._writer.join_expected(self.last)
        while True:
            self._gate.check_open(state, self._writer.joined_any)
            forming = state.forming
            if attempt is None:
                attempt, refused = self._writer.join(forming)
                if refused is not None:
                    state = refused  # closed, finished or another job meanwhile: decide from that read
                    continue
            # A spare has no join timeout: it waits for a member to be lost (or the job to end).
            wait_deadline = math.inf if self._is_spare(state) else deadline
            self.note_wait(forming, attempt.count, wait_deadline)
            try:
                closed = None
                if join_fills_round(attempt.count, self._ctx.settings.max_nodes):
                    closed = self._closer.try_close(forming, state)  # our join filled the round: close it now
                if closed is None:
                    closed = self._round_wait.wait(self, attempt, state, wait_deadline)
            except JoinKeyLost as lost:
                log.warning("Rendezvous %s: node %s lost its join key for round %d (%s); joining again",
                            self._ctx.settings.run_id, self._ctx.node_id, forming, lost)
                state, attempt = read_state(self._ctx.backend, self._ctx.keys), None
                continue
            if self._writer.attempt is not None:
                self._writer.attempt = self._writer.attempt.after_close(closed)
            if closed.record.rank_of(self._ctx.node_id) is not None:
                return self._included(closed)
            log.info("Rendezvous %s: round %d closed without node %s; waiting for round %d", self._ctx.settings.run_id,
                     closed.record.round, self._ctx.node_id, closed.record.round + 1, extra=CONSOLE)
            state, attempt = read_state(self._ctx.backend, self._ctx.keys), None

    def _included(self, closed: ClosedRound) -> Included:
        rank = closed.record.rank_of(self._ctx.node_id)
        if rank is None:
            raise RendezvousError(f"Rendezvous {self._ctx.settings.run_id}: round {closed.record.round} does not "
                                  f"include node {self._ctx.node_id}.")
        self.last, self._writer.failure = closed, None  # the failure report went with the join
        return Included(closed, rank)

    def _is_spare(self, state: StateView) -> bool:
        """Whether this node waits as a spare now; says so once per full round."""
        record = state.round
        if record is None or not is_spare(record, self._ctx.node_id, self._ctx.settings.max_nodes):
            return False
        if self._spare_of != record.round:
            self._spare_of = record.round
            log.info("Rendezvous %s: node %s waits as a spare: round %d is full (%d of at most %d nodes) and every "
                     "member is alive; it joins the first round with room (when a member is lost)",
                     self._ctx.settings.run_id, self._ctx.node_id, record.round, record.group_world_size,
                     self._ctx.settings.max_nodes, extra=CONSOLE)
        return True

    def _closed_with_us(self, state: StateView) -> ClosedRound | None:
        """The round in ``state`` if it is the one this node's pending join was for and it includes us."""
        attempt, closed = self._writer.attempt, state.last
        if attempt is None or closed is None or closed.record.round != attempt.forming:
            return None
        if self.last is not None and closed.record.round <= self.last.record.round:
            return None
        if closed.record.rank_of(self._ctx.node_id) is None or not self._ctx.membership.alive:
            return None
        return closed

    # -- helpers ----------------------------------------------------------------------------
    def _set_progress(self, snapshot: WaitSnapshot | None) -> None:
        self.progress = snapshot
        for callback in self._progress_callbacks:
            callback(snapshot)


def _progress_line(line: str) -> None:
    """A waiting node's progress is for the default console (a wait that says nothing looks hung)."""
    log.info("%s", line, extra=CONSOLE)
