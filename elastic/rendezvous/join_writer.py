"""This node's join key and closer claim in the store (protocol step 2 in
:mod:`elastic.rendezvous.handler`): the one place that writes and drops them.

:class:`JoinWriter` sends the join transaction (:func:`~elastic.rendezvous.transactions.join_txn`)
on a live lease, keeps the join that applied (:class:`~elastic.rendezvous.attempt.JoinAttempt`)
and the failure report the next join carries, and drops the key, the claim and the master port
when the node leaves. Which round to join, and when, is
:class:`~elastic.rendezvous.joining.JoinLoop`'s to decide.
"""

from __future__ import annotations

import logging

from backends.api import KeyValue
from backends.errors import BackendError, LeaseNotFoundError
from elastic.rendezvous import records
from elastic.rendezvous.attempt import Claim, ClosedRound, FailureReport, JoinAttempt, StateView
from elastic.rendezvous.context import RendezvousContext
from elastic.rendezvous.departures import Departure, DepartureRecord, say_departure
from elastic.rendezvous.errors import RendezvousError
from elastic.rendezvous.gate import JoinGate
from elastic.rendezvous.reads import joiner_of, state_from
from elastic.rendezvous.records import JoinRecord
from elastic.rendezvous.transactions import JoinOutcome, join_txn, read_join

__all__ = ["JoinWriter"]

log = logging.getLogger(__name__)


class JoinWriter:
    """Writes and drops one node's join key and closer claim (see the module docstring). Not
    thread-safe: the join loop calls it under the handler's lock.

    Attributes:
        attempt: the join of the round this node is in or joining (None: no key written).
        failure: this node's failure report, sent with its next join (None: none).
        joined_any: whether a join of this node ever applied (its key was written in some round).
    """

    def __init__(self, ctx: RendezvousContext, gate: JoinGate) -> None:
        self._ctx = ctx
        self._gate = gate
        self.attempt: JoinAttempt | None = None
        self.failure: FailureReport | None = None
        self.joined_any = False

    def join_expected(self, last: ClosedRound | None) -> tuple[StateView, JoinAttempt | None]:
        """Join the round expected to form next if the round record is the one we expect, and read ``state/``.

        The expectation is the round this node was ``last`` in (its mod revision), or no round
        at all for a node that never joined. Returns the state and the new attempt; None when
        the expectation was wrong, in which case nothing was written.

        Raises:
            RendezvousError: the store returned no ``state/`` read. BackendError: the store failed.
        """
        forming, expected = (0, 0) if last is None else (last.record.round + 1, last.revision)
        outcome, attempt = self._send(forming, expected)
        if outcome.state is None:
            raise RendezvousError(f"Rendezvous {self._ctx.settings.run_id}: the store returned no state/ read for a "
                                  f"guarded join.")
        return state_from(self._ctx.keys, outcome.state), attempt

    def join(self, forming: int) -> tuple[JoinAttempt | None, StateView | None]:
        """Join round ``forming`` and claim its closer if unclaimed (see :func:`join_txn`); when a
        guard refused the join (nothing written), no attempt and the ``state/`` read that says why.

        Raises:
            RendezvousError: the store returned no ``state/`` read. BackendError: the store failed.
        """
        outcome, attempt = self._send(forming, None)
        if attempt is not None:
            return attempt, None
        if outcome.state is None:
            raise RendezvousError(f"Rendezvous {self._ctx.settings.run_id}: the store returned no state/ read for a "
                                  f"refused join.")
        return None, state_from(self._ctx.keys, outcome.state)

    def leave(self, why: Departure | None, detail: str = "") -> None:
        """Drop this node's join key, its claim and its port. Best effort: they go with its lease.

        ``why``: the departure note left first, so the others can say why this node is gone
        (None: none, e.g. the rendezvous is closed and nobody waits for it).
        """
        self._ctx.membership.drop_port()
        self.release_claim()
        attempt, self.attempt = self.attempt, None
        if attempt is not None:
            if why is not None:
                say_departure(self._ctx.backend, self._ctx.keys, self._ctx.node_id,
                              DepartureRecord(attempt.forming, why, detail))
            self._delete(attempt.key, "on leave")

    def release_claim(self) -> None:
        """Delete the closer claim this node still holds (a round closed past it, or it leaves)."""
        attempt = self.attempt
        if attempt is not None and attempt.claim is Claim.HELD:
            self.attempt = attempt.release()
            self._delete(self._ctx.keys.closer(attempt.forming), "(it goes with our lease)")

    def _send(self, forming: int, expected_round: int | None) -> tuple[JoinOutcome, JoinAttempt | None]:
        """Send the join transaction of round ``forming`` on a live lease; a join that applied
        becomes :attr:`attempt` (the previous attempt's key is deleted in the same step)."""
        node = self._ctx.node
        port = self._ctx.membership.reserve_port()
        value = b""

        def send() -> JoinOutcome:
            nonlocal value
            grant = self._ctx.membership.lease()
            if grant.new_session:
                self.attempt = None  # its keys went with the old lease
            if grant.after_loss and self.failure is not None:
                # This node's membership ended with its lease, and its workers' failure that
                # followed is that loss's consequence (its peers moved on), not one to charge.
                log.info("Rendezvous %s: node %s lost its lease; its workers' failure in round %d is not reported "
                         "as its own", self._ctx.settings.run_id, node.node_id, self.failure.round)
                self.failure = None
            failure = self.failure
            value = records.encode_join(JoinRecord(node.node_id, node.addr, port, node.local_world_size, node.role,
                                                   failure.round if failure else None,
                                                   failure.at if failure else 0.0))
            previous = self.attempt.key if self.attempt is not None else None
            job = self._gate.job_created
            txn = join_txn(self._ctx.keys, forming, node.node_id, value, grant.lease_id, previous, expected_round, job)
            return read_join(self._ctx.backend.txn(txn), self._ctx.keys.closer(forming), expected_round is not None)

        try:
            outcome = send()
        except LeaseNotFoundError:
            # The lease expired before the keepalive thread noticed (the process was frozen for
            # longer than the TTL): its keys are gone with it, so join again on a new lease.
            log.warning("Rendezvous %s: node %s lost its lease unnoticed; joining round %d on a new one",
                        self._ctx.settings.run_id, node.node_id, forming)
            self._ctx.membership.forget_session()
            self.failure = None  # the membership ended with the lease (see send)
            outcome = send()
        if not outcome.joined or outcome.closer is None:
            return outcome, None
        self.joined_any = True
        claim = Claim.HELD if self.is_mine(outcome.closer) else Claim.OTHER
        self.attempt = JoinAttempt(forming, self._ctx.keys.node(forming, node.node_id), value, outcome.count,
                                   outcome.closer, claim)
        return outcome, self.attempt

    def is_mine(self, claim: KeyValue) -> bool:
        """Whether the closer claim ``claim`` is this node's, on its current lease."""
        return claim.lease == self._ctx.membership.lease_id and joiner_of(claim).node_id == self._ctx.node_id

    def _delete(self, key: str, why: str) -> None:
        try:
            self._ctx.backend.delete(key)
        except BackendError as error:
            log.warning("Rendezvous %s: node %s could not delete %s %s: %s", self._ctx.settings.run_id,
                        self._ctx.node_id, key, why, error)
