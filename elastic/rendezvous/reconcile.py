"""Pure decision of a member whose watch history was compacted: what it missed in the gap.

:func:`reconcile` compares a :class:`RoundSnapshot` (the round's keys and ``state/`` read at one
revision) with the round the member acted on and what it had seen. No I/O, no clocks, no
threads; the monitor reads and acts. Tested with case tables in
``tests/rendezvous/test_decisions.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.job import FinishedRecord
from elastic.rendezvous.records import RoundRecord
from elastic.rendezvous.round_events import MonitorState, RoundView, job_end, waiting_counts


# -- what a member missed while its watch history was compacted -------------------------------
@dataclass(frozen=True)
class RoundSnapshot:
    """A closed round's keys and ``state/``, read at one revision (after a compacted watch).

    Attributes:
        revision: the store revision of the read.
        record: the round record in ``state/round`` (None if absent).
        closed: whether ``state/closed`` exists.
        finished: the job's end in ``state/finished`` (None if absent).
        present: nodes whose join keys of the round exist.
        done: nodes whose done keys of the round exist (the exit barrier).
        waiting: nodes whose join keys of the next round exist.
    """

    revision: int
    record: RoundRecord | None
    closed: bool
    present: frozenset[str]
    done: frozenset[str]
    waiting: frozenset[str]
    finished: FinishedRecord | None = None


@dataclass(frozen=True)
class Reconciled:
    """What a re-read after a compacted watch found: the change (None: nothing this member has
    not acted on), a sentence about it, and the monitor's state as of the read."""

    change: MembershipChange | None
    finding: str
    state: MonitorState


def reconcile(view: RoundView, state: MonitorState, snapshot: RoundSnapshot) -> Reconciled:
    """Classify what changed while a member's watch history was compacted away.

    A resumed watch whose history is gone cannot say what happened in the gap, so the member
    re-reads its round, the next round and ``state/`` at one revision and compares them with
    the round it acted on (``view``) and what it had seen (``state``). A reconnect is never by
    itself a membership change: restarting every worker because an etcd that auto-compacts
    restarted would stop jobs that lost nothing. In order: the job finished; the rendezvous
    closed; a newer round record (this round was superseded); no round record (the job's keys
    were deleted); a member whose join key is gone without a done
    mark (lost; named); nodes waiting for the next round that justify a restart
    (:func:`waiting_counts`); else nothing.
    """
    done = state.done | snapshot.done
    finished = snapshot.finished or state.finished
    after = MonitorState(snapshot.waiting, done, finished, state.departed)
    if finished is not None:
        return Reconciled(job_end(view, finished), f"the job finished on node {finished.node_id} in round "
                                                   f"{finished.round}", after)
    if snapshot.closed:
        return Reconciled(MembershipChange.CLOSED, "the rendezvous was closed", after)
    if snapshot.record is not None and snapshot.record.round > view.record.round:
        return Reconciled(MembershipChange.ROUND_SUPERSEDED, f"round {snapshot.record.round} was closed", after)
    if snapshot.record is None:
        return Reconciled(MembershipChange.MEMBER_LOST, f"the job's keys were deleted: the round record "
                          f"{view.keys.round} is gone (etcdctl del --prefix {view.keys.root}?)", after)
    lost = sorted(member.node_id for member in view.record.members
                  if member.node_id != view.node_id and member.node_id not in snapshot.present | done)
    if lost:
        return Reconciled(MembershipChange.MEMBER_LOST,
                          f"member{'s' if len(lost) > 1 else ''} lost: {', '.join(lost)} (join key gone)", after)
    if waiting_counts(view, snapshot.waiting) > 0:
        waiting = sorted(snapshot.waiting - {view.node_id})
        return Reconciled(MembershipChange.NODES_WAITING,
                          f"waiting for round {view.record.round + 1}: {', '.join(waiting)}", after)
    return Reconciled(None, "nothing changed", after)
