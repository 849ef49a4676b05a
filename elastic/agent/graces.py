"""The two waits of one watch of the workers: a failure's grace and the rejoin grace.

A failure with no membership change first waits up to the lease TTL + 1 s (a peer's death breaks
the collectives at once, its lease expires only later), unless this node is alone; the rest of
a group whose workers end with their round is stopped when the failure is first seen, while
workers that follow rounds wait for the next round with their peers. The rejoin grace
(:data:`~elastic.agent.decisions.REJOIN_GRACE_S`, :func:`~elastic.agent.decisions.rejoin_waits`)
gives running workers the chance to end on their own when only members rejoined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from elastic.agent.decisions import REJOIN_GRACE_S, rejoin_waits
from elastic.agent.processes.group_state import GroupStatus, WorkersView
from elastic.rendezvous.api import MembershipStatus

__all__ = ["Grace", "Graces"]


@dataclass(frozen=True)
class Grace:
    """What the graces say at one look.

    Attributes:
        rejoin_pending: the rejoin grace runs.
        over: no failure's grace runs any more (True when none began).
        stop_now: a failure was first seen in a group whose workers end with their round: stop
            the rest of it now.
        deadline: when the grace that runs ends (the rejoin's while pending, else the failure's);
            None: none began.
    """

    rejoin_pending: bool
    over: bool
    stop_now: bool
    deadline: float | None


class Graces:
    """The graces of one watch (one round's group).

    Args:
        clock: monotonic seconds.
        failure_grace: seconds a failure waits for the membership signal (0: none).
    """

    def __init__(self, clock: Callable[[], float], failure_grace: float) -> None:
        self._clock = clock
        self._failure_grace = failure_grace
        self._failure_deadline: float | None = None
        self._rejoin_deadline: float | None = None

    def look(self, workers: WorkersView, membership: MembershipStatus) -> Grace:
        """Start the grace that ``workers`` and ``membership`` call for (once), and say where both stand."""
        rejoin_pending = False
        if rejoin_waits(workers, membership):
            self._rejoin_deadline = self._rejoin_deadline or self._clock() + REJOIN_GRACE_S
            rejoin_pending = self._clock() < self._rejoin_deadline
        over, stop_now = True, False
        if workers.status is GroupStatus.FAILED and membership.change is None:
            if self._failure_deadline is None:
                self._failure_deadline = self._clock() + self._failure_grace
                stop_now = not workers.follows_rounds
            over = self._clock() >= self._failure_deadline
        return Grace(rejoin_pending, over, stop_now, self._rejoin_deadline if rejoin_pending else self._failure_deadline)
