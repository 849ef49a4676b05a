"""Waiting for the round a node joined to close (protocol step 4 in :mod:`elastic.rendezvous.handler`).

:class:`RoundWait` closes the round itself while this node holds the closer claim (through
:class:`~elastic.rendezvous.closing.Closer`); otherwise it waits on the ``state/`` watch for the
close, or for the closer's claim to vanish (its lease lapsed, or it left), and then claims it
with one create-if-absent, through the node's :class:`~elastic.rendezvous.join_writer.JoinWriter`
(which keeps the attempt). The join it waits for (:class:`~elastic.rendezvous.joining.JoinLoop`)
is a :class:`Joining`: it reports progress and says when the join timed out.
"""

from __future__ import annotations

import logging
from typing import Protocol

from backends.api import ABSENT, EventType
from elastic.rendezvous.context import RendezvousContext
from elastic.rendezvous.attempt import Claim, ClosedRound, JoinAttempt, StateView
from elastic.rendezvous.closing import Closer, Waiter
from elastic.rendezvous.join_writer import JoinWriter
from elastic.rendezvous.reads import closed_round_from, joiner_of, read_alive, read_joiners

__all__ = ["Joining", "RoundWait"]

log = logging.getLogger(__name__)


class Joining(Waiter, Protocol):
    """What the wait needs from the join it waits for, beyond the closer's :class:`Waiter`."""

    last: ClosedRound | None
    """The round this node was last included in (None before its first)."""

    def line_due(self) -> bool:
        """Whether a progress line could be due now (so fresh counts are worth a read)."""


class RoundWait:
    """Waits for rounds to close for one node (see the module docstring). Not thread-safe: the
    join loop calls it under the handler's lock. ``writer`` keeps the attempt: the wait records
    the claim's changes there."""

    def __init__(self, ctx: RendezvousContext, closer: Closer, writer: JoinWriter) -> None:
        self._ctx = ctx
        self._closer = closer
        self._writer = writer

    def wait(self, join: Joining, attempt: JoinAttempt, state: StateView, deadline: float) -> ClosedRound:
        """Block until round ``attempt.forming`` (or a later one) is closed; close it ourselves
        while we hold the claim. The ``state/`` watch is live from at or before ``state.revision`` + 1.

        Raises:
            RendezvousTimeoutError: ``deadline`` passed (``join.timeout``).
            JoinKeyLost, RendezvousClosedError: from ``join.check_still_joined``.
            BackendError: the store failed.
        """
        forming, claim_key = attempt.forming, self._ctx.keys.closer(attempt.forming)
        while True:
            if attempt.claim is Claim.HELD:
                closed = self._closer.close_round(forming, state, deadline, join)
                self._writer.attempt = attempt.after_close(closed)  # every close of a round deletes its claim
                self._writer.release_claim()  # so this only deletes a claim on a round closed past us
                return closed
            closed = self._await_close_or_closer_loss(join, attempt, state.revision, deadline)
            if closed is not None:
                return closed
            # The closer's claim vanished (its lease lapsed, or it left): claim it ourselves.
            join.check_still_joined()
            lease = self._ctx.membership.lease().lease_id
            result = self._ctx.backend.put_if(claim_key, attempt.value, ABSENT, lease=lease)
            if result.current is None:
                continue  # the winner is already gone too: try again
            self._writer.attempt = attempt = attempt.seen_closer(result.current, self._writer.is_mine(result.current))
            log.info("Rendezvous %s: the closer of round %d left; node %s now closes it",
                     self._ctx.settings.run_id, forming, joiner_of(result.current).node_id)

    def _await_close_or_closer_loss(self, join: Joining, attempt: JoinAttempt, read_revision: int,
                                    deadline: float) -> ClosedRound | None:
        """Wait on ``state/`` for the close (returns it) or the loss of the closer's claim (None).

        Events at or below ``read_revision`` are skipped: the state read already reflected them.
        Events after the close in the same batch are handed back to the watch, for the monitor.
        """
        forming, claim_key, watch = attempt.forming, self._ctx.keys.closer(attempt.forming), self._ctx.membership.state
        held_since = attempt.closer.create_revision
        while True:
            now = self._ctx.clock()
            if now >= deadline:
                raise join.timeout(forming)
            if join.line_due():  # only the closer watches the joins: read them when a line is due
                # The last round's keys first: a member that rejoins in between is then among the joiners.
                alive = read_alive(self._ctx.backend, self._ctx.keys, join.last.record) if join.last else None
                join.note_wait(forming, read_joiners(self._ctx.backend, self._ctx.keys, forming)[0], deadline, alive)
            wake = min(deadline, join.next_line_due())
            batch = watch.get(timeout=max(min(wake - now, self._ctx.settings.lease_ttl), 0.0))
            for index, event in enumerate(batch):
                if event.revision <= read_revision:
                    continue
                closed = closed_round_from(self._ctx.keys, self._ctx.settings.run_id, event, forming)
                if closed is not None:
                    watch.hand_back(batch[index + 1:])
                    return closed
                if event.kv.key != claim_key or event.revision <= held_since:
                    continue  # not the claim, or a change from before the current holder claimed
                if event.type is EventType.DELETE:
                    return None
                held_since = event.kv.create_revision  # a new holder (seen before our claim attempt)
            join.check_still_joined()
