"""A restart the agent owes an account of, and the pure decision that settles it.

The agent restarts its workers at once, but only the next round says how the restart counts:
a worker failure counts against ``--max-restarts`` only if that round still has every member
of the last one (else a peer died and broke our collectives before its lease expired: a
membership change, and those are free, DESIGN §4.4). The restart is one value,
:class:`PendingRestart`, made when the workers stop and consumed by :func:`settle` after the
next rendezvous. Tested with a case table in ``tests/agent/test_restarts.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from elastic.agent.observe.events import RestartCause
from elastic.agent.processes.group_state import GroupState
from elastic.rendezvous.api import RendezvousInfo


class PendingCause(enum.Enum):
    """Why the agent stopped its workers and rejoined.

    FAILURE: this node's workers failed (reported to the rendezvous; counted or not by the next round).
    MEMBERSHIP: a member was lost, nodes wait to join, or the round was superseded (never counted).
    OUTAGE: the workers failed while the store did not answer (not reported, never counted).
    """

    FAILURE = "failure"
    MEMBERSHIP = "membership"
    OUTAGE = "outage"


@dataclass(frozen=True)
class PendingRestart:
    """A restart to settle after the next rendezvous.

    Attributes:
        cause: see :class:`PendingCause`.
        state: the stopped group's last state (its failures make the restart notice).
        members: the node ids of the round the stopped group ran in.
        reason: a sentence about the cause, for events and logs.
    """

    cause: PendingCause
    state: GroupState
    members: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True)
class Settlement:
    """How a round settles the pending restart.

    Attributes:
        restarts_used: failure restarts charged so far (the round record's count when agreed).
        failures_in_a_row: failure restarts this node's own workers caused, in a row (exclusion).
        recorded: the cause to record the restart under (None: no restart to record).
        counted: whether this node's own failure was charged (the agent prints a notice).
        not_counted: why this node's failure was not charged ("" unless it was not).
    """

    restarts_used: int
    failures_in_a_row: int
    recorded: RestartCause | None = None
    counted: bool = False
    not_counted: str = ""


_UNCOUNTED = {
    PendingCause.FAILURE: RestartCause.MEMBERSHIP_CHANGE,  # a peer's loss broke our collectives
    PendingCause.MEMBERSHIP: RestartCause.MEMBERSHIP_CHANGE,
    PendingCause.OUTAGE: RestartCause.STORE_OUTAGE,
}


def settle(pending: PendingRestart | None, info: RendezvousInfo, restarts_used: int,
           failures_in_a_row: int, node_id: str) -> Settlement:
    """Settle ``pending`` (None: nothing to settle) against the round ``info`` just joined.

    With a round record (``info.agreed``) its closer decided for every member: the count is
    the record's, and a restart is a failure restart when the count went up (whoever failed).
    Without one (the static rendezvous) this node counts its own failures, unless a member of
    the previous round is absent from this one.
    """
    if info.agreed:
        return _settle_agreed(pending, info, restarts_used, failures_in_a_row, node_id)
    if pending is None:
        return Settlement(restarts_used, failures_in_a_row)
    if pending.cause is not PendingCause.FAILURE:
        return Settlement(restarts_used, failures_in_a_row, _UNCOUNTED[pending.cause])
    lost = sorted(set(pending.members) - {member.node_id for member in info.members})
    if lost:
        reason = f"worker failure after the loss of {', '.join(lost)} (absent from round {info.round})"
        return Settlement(restarts_used, failures_in_a_row, RestartCause.MEMBERSHIP_CHANGE, not_counted=reason)
    return Settlement(restarts_used + 1, failures_in_a_row, RestartCause.WORKER_FAILURE, counted=True)


def _settle_agreed(pending: PendingRestart | None, info: RendezvousInfo, restarts_used: int,
                   failures_in_a_row: int, node_id: str) -> Settlement:
    # Exclusion counts only the failures this node was charged with, in a row.
    in_a_row = failures_in_a_row + 1 if info.culprit == node_id else 0
    if pending is None:
        return Settlement(info.restart_count, in_a_row)
    own_failure = pending.cause is PendingCause.FAILURE
    if info.restart_count > restarts_used:
        return Settlement(info.restart_count, in_a_row, RestartCause.WORKER_FAILURE, counted=own_failure)
    reason = _not_counted(pending, info) if own_failure else ""
    return Settlement(info.restart_count, in_a_row, _UNCOUNTED[pending.cause], not_counted=reason)


def _not_counted(pending: PendingRestart, info: RendezvousInfo) -> str:
    """Why the round's closer did not count this node's failure, naming the absent members."""
    absent = sorted(set(pending.members) - {member.node_id for member in info.members})
    if not absent:  # everyone is back, yet no failure was reported (this node's lease was lost first)
        return f"worker failure not counted: round {info.round}'s closer counted no failure restart"
    if len(absent) == 1:
        return f"worker failure not counted: {absent[0]}, a member of the previous round, is absent from round {info.round}"
    return (f"worker failure not counted: {', '.join(absent)}, members of the previous round, are absent from "
            f"round {info.round}")
