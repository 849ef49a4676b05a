"""The closer's side of a round (protocol step 3 in :mod:`elastic.rendezvous.handler`).

The node that holds a round's closer claim watches every join of the round and closes it when
:func:`~elastic.rendezvous.decisions.decide_close` says so, with one compare-and-swap
(:func:`~elastic.rendezvous.transactions.close_txn`). The join that fills a round closes it
too (:meth:`Closer.try_close`), without watching. Deciding is the pure functions of
:mod:`elastic.rendezvous.decisions`; this module reads, waits and writes.
"""

from __future__ import annotations

import logging
from typing import Protocol

from backends.api import EventType, WatchEvent
from elastic.rendezvous.context import RendezvousContext
from elastic.rendezvous import records
from elastic.rendezvous.attempt import ClosedRound, StateView
from elastic.rendezvous.decisions import (
    CloseAction,
    CloseDecision,
    Joiner,
    agreed_restart_count,
    assign_ranks,
    decide_close,
    everyone_back,
    failure_culprit,
    holds_for_members,
    last_call_deadline,
    rejoin_deadline,
    round_is_full,
)
from elastic.rendezvous.errors import RendezvousError, RendezvousTimeoutError
from elastic.rendezvous.job import decode_finished
from elastic.rendezvous.reads import closed_round_from, finished_error, joiner_of, read_alive, read_joiners
from elastic.rendezvous.records import RoundRecord
from elastic.rendezvous.transactions import close_txn, read_close

__all__ = ["Closer", "JoinKeyLost", "Waiter"]

log = logging.getLogger(__name__)


class JoinKeyLost(Exception):
    """This node's join key vanished while it waited for the round (its lease expired): join again."""


class Waiter(Protocol):
    """What the closer needs from the join it closes for (:class:`~elastic.rendezvous.joining.JoinLoop`)."""

    def note_wait(self, forming: int, joined: int | dict[str, Joiner] | None, deadline: float,
                  alive: set[str] | None = None, closes_at: float | None = None) -> None:
        """Report the joiners seen, the previous round's members still alive and (the closer)
        when it will close the round (progress)."""

    def next_line_due(self) -> float:
        """The clock time by which a progress line may be due."""

    def timeout(self, forming: int) -> RendezvousTimeoutError:
        """The error for a join timeout in round ``forming``."""

    def check_still_joined(self) -> None:
        """Raise JoinKeyLost when this node's lease is gone, RendezvousClosedError when it shuts down."""


class Closer:
    """Closes rounds for one node (see the module docstring)."""

    def __init__(self, ctx: RendezvousContext) -> None:
        self._ctx = ctx

    def close_round(self, forming: int, state: StateView, deadline: float, waiter: Waiter) -> ClosedRound:
        """The closer's loop: watch the joins of ``forming``, decide, and close it.

        Returns the round closed (by this node or another, ``forming`` or later).

        Raises:
            RendezvousTimeoutError: ``deadline`` passed.
            JoinKeyLost: this node's join key vanished.
            BackendError: the store failed (the join starts over).
        """
        settings, previous = self._ctx.settings, state.round
        with self._ctx.membership.watch(self._ctx.keys.root) as watch:  # from now, then read: no gap
            joined, seen_revision = read_joiners(self._ctx.backend, self._ctx.keys, forming)
            alive = read_alive(self._ctx.backend, self._ctx.keys, previous)
            already = self._ctx.backend.get(self._ctx.keys.round).kv  # the join that filled it may have closed it
            if already is not None and (record := records.decode_round(already.key, already.value)).round >= forming:
                return ClosedRound(record, already.mod_revision)
            last_call: float | None = None
            rejoin: float | None = None
            full_since: float | None = None
            while True:
                now = self._ctx.clock()
                if holds_for_members(previous, joined, alive, settings.max_nodes):
                    last_call = full_since = window = None
                    decision = CloseDecision(CloseAction.WAIT, reason="every member of the full round is alive")
                else:
                    last_call = last_call_deadline(last_call, len(joined), settings.min_nodes, now,
                                                   settings.last_call_timeout)
                    rejoin = rejoin_deadline(rejoin, previous, joined, now, settings.rejoin_timeout)
                    if len(joined) < settings.max_nodes:
                        full_since = None
                    elif full_since is None:
                        full_since = now
                    ends = [end for end in (last_call, rejoin) if end is not None]
                    window = min(ends) if last_call is not None and ends else None  # opens at min_nodes
                    decision = decide_close(len(joined), settings.min_nodes, settings.max_nodes, window, now,
                                            full_since, settings.lease_ttl, everyone_back(previous, joined, alive))
                if decision.action is CloseAction.CLOSE:
                    closed = self.try_close(forming, state)
                    if closed is not None:
                        return closed
                    joined, seen_revision = read_joiners(self._ctx.backend, self._ctx.keys, forming)
                    alive = read_alive(self._ctx.backend, self._ctx.keys, previous)
                    continue
                if now >= deadline:
                    raise waiter.timeout(forming)
                waiter.note_wait(forming, joined, deadline, alive, closes_at=window)
                wait_until = min(deadline, decision.wait_until or deadline, now + settings.lease_ttl,
                                 waiter.next_line_due())
                for event in watch.get(timeout=max(wait_until - now, 0.0)):
                    if event.revision <= seen_revision:
                        continue  # reflected in the read
                    closed = closed_round_from(self._ctx.keys, settings.run_id, event, forming)
                    if closed is not None:
                        return closed
                    self._apply_join(joined, forming, event)
                    self._apply_alive(alive, previous, event)
                waiter.check_still_joined()
                if self._ctx.node_id not in joined:
                    raise JoinKeyLost("our key vanished (the lease expired)")

    def try_close(self, forming: int, state: StateView) -> ClosedRound | None:
        """Close ``forming`` with the members read now; None if too few remain (keep waiting).

        Returns the round closed: this close, or a close of ``forming`` or later that won.

        Raises:
            JobFinishedError: the job finished (a node's workers all succeeded): no round forms.
            RendezvousError: the round record vanished or went back while closing.
            BackendError: the store failed.
        """
        previous = state.round
        read = self._ctx.backend.get_prefix(self._ctx.keys.nodes_prefix(forming))
        joiners = [joiner_of(kv) for kv in read.kvs]
        members, spares = assign_ranks(previous, joiners, self._ctx.settings.max_nodes)
        if len(members) < self._ctx.settings.min_nodes:
            return None
        if round_is_full(previous, self._ctx.settings.max_nodes) and holds_for_members(  # the read only then
                previous, (j.node_id for j in joiners), read_alive(self._ctx.backend, self._ctx.keys, previous),
                self._ctx.settings.max_nodes):
            return None  # a spare must not take a live member's place; the closer waits for a change
        member_ids = {member.node_id for member in members}
        included = [j for j in joiners if j.node_id in member_ids]
        record = RoundRecord(forming, members, read.revision, agreed_restart_count(previous, included),
                             failure_culprit(previous, included))
        expected = state.last.revision if state.last is not None else 0
        txn = close_txn(self._ctx.keys, forming, records.encode_round(record), expected)
        result = read_close(self._ctx.backend.txn(txn))
        if result.applied:
            log.info("Rendezvous %s: node %s closed round %d with %d member%s (%d spares)", self._ctx.settings.run_id,
                     self._ctx.node_id, forming, len(members), "" if len(members) == 1 else "s", len(spares))
            return ClosedRound(record, result.revision)
        if result.finished is not None:  # a node's workers all succeeded meanwhile: no round forms
            raise finished_error(self._ctx.settings.run_id, self._ctx.node_id,
                                 decode_finished(result.finished.key, result.finished.value))
        if result.current is None:
            raise RendezvousError(f"The round record {self._ctx.keys.round} vanished while closing round {forming}.")
        current = records.decode_round(self._ctx.keys.round, result.current.value)
        if current.round >= forming:
            return ClosedRound(current, result.current.mod_revision)
        raise RendezvousError(
            f"The round record {self._ctx.keys.round} changed to round {current.round} while closing round {forming}."
        )

    def _apply_join(self, joined: dict[str, Joiner], forming: int, event: WatchEvent) -> None:
        parsed = self._ctx.keys.parse_node_key(event.kv.key)
        if parsed is None or parsed[0] != forming:
            return
        if event.type is EventType.DELETE:
            joined.pop(parsed[1], None)
        else:
            joined[parsed[1]] = joiner_of(event.kv)

    def _apply_alive(self, alive: set[str], previous: RoundRecord | None, event: WatchEvent) -> None:
        parsed = self._ctx.keys.parse_node_key(event.kv.key)
        if previous is None or parsed is None or parsed[0] != previous.round:
            return
        (alive.add if event.type is EventType.PUT else alive.discard)(parsed[1])
