"""The exit barrier: members whose workers finished wait for each other before they leave.

A member marks itself done (``rounds/<r>/done/<node>``, bound to its lease) and waits until
every member of the round is done, or one is gone without being done, or a timeout. Members
that are done may leave without their peers seeing them as *lost*
(:func:`~elastic.rendezvous.round_events.classify`), so a node whose workers finished first does
not restart the others' last steps. The outcome is the pure
:func:`~elastic.rendezvous.round_events.barrier_outcome`.
"""

from __future__ import annotations

import logging

from backends.api import EventType
from elastic.rendezvous.context import RendezvousContext
from elastic.rendezvous.round_events import BarrierOutcome, barrier_outcome
from elastic.rendezvous.records import RoundRecord

__all__ = ["ExitBarrier"]

log = logging.getLogger(__name__)


class ExitBarrier:
    """The exit barrier of one node (see the module docstring)."""

    def __init__(self, ctx: RendezvousContext) -> None:
        self._ctx = ctx

    def finish(self, record: RoundRecord, lease_id: int, timeout: float) -> bool:
        """Mark this node done in ``record``'s round and wait until every member is, or ``timeout``.

        A member whose join key vanishes before it is done (its lease lapsed; it restarts into
        the next round) ends the wait at once: it will never finish this round. Returns True
        when every member finished in time.

        Raises:
            BackendError: the store failed (BackendClosedError: the node is shutting down).
        """
        round_number, keys = record.round, self._ctx.keys
        members = frozenset(member.node_id for member in record.members)
        deadline = self._ctx.clock() + timeout
        present: set[str] = set()
        done: set[str] = set()
        # Watch from now, then mark and read (see the join). Any done event counts, a DELETE too:
        # a member that saw everyone done leaves and revokes its lease, and its done key may be
        # gone before our read (the watch reports it, in the same batch as its join key's DELETE).
        with self._ctx.membership.watch(keys.round_prefix(round_number)) as watch:
            self._ctx.backend.put(keys.done(round_number, self._ctx.node_id), b"{}", lease=lease_id)
            read = self._ctx.backend.get_prefix(keys.round_prefix(round_number))
            for kv in read.kvs:
                self._note(kv.key, True, round_number, present, done)
            while (outcome := barrier_outcome(members, frozenset(present), frozenset(done))) is BarrierOutcome.WAIT:
                remaining = deadline - self._ctx.clock()
                if remaining <= 0:
                    break
                for event in watch.get(timeout=remaining):
                    if event.revision > read.revision or keys.parse_done_key(event.kv.key) is not None:
                        self._note(event.kv.key, event.type is EventType.PUT, round_number, present, done)
        if outcome is BarrierOutcome.WAIT:
            log.warning("Rendezvous %s: node %s: the exit barrier timed out after %.0fs; leaving anyway",
                        keys.run_id, self._ctx.node_id, timeout)
        elif outcome is BarrierOutcome.MEMBER_LOST:
            log.warning("Rendezvous %s: node %s: a member of round %d left before finishing (%s); leaving the exit "
                        "barrier", keys.run_id, self._ctx.node_id, round_number, ", ".join(sorted(members - done)))
        return outcome is BarrierOutcome.ALL_DONE

    def _note(self, key: str, put: bool, round_number: int, present: set[str], done: set[str]) -> None:
        marked = self._ctx.keys.parse_done_key(key)
        if marked is not None and marked[0] == round_number:
            done.add(marked[1])  # a PUT or a DELETE: either way it was done
            return
        joined = self._ctx.keys.parse_node_key(key)
        if joined is not None and joined[0] == round_number:
            (present.add if put else present.discard)(joined[1])
