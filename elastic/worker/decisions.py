"""Pure decisions of live recovery: no I/O, no clocks, no threads, no torch.

Each is tested with a case table in ``tests/worker/test_decisions.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

__all__ = [
    "HealPlan",
    "LossAction",
    "Mark",
    "RoundAction",
    "decide_after_loss",
    "decide_round",
    "interrupt_due",
    "plan_heal",
]


class RoundAction(enum.Enum):
    """What to do with a round read from the pipe."""

    NEWER = "newer"
    """Newer than the round in use and than any pending one: it becomes the pending round."""
    REPEAT = "repeat"
    """The round in use or the one already pending, written again: ignored."""
    RENUMBERED = "renumbered"
    """Older than what this worker already has. The agent writes rounds in order on one pipe,
    so its rendezvous numbered rounds anew (an operator deleted the job's keys): a new round,
    it becomes the pending round as a newer one would."""


def decide_round(current: int, pending: int | None, incoming: int, known: bool) -> RoundAction:
    """Classify round ``incoming`` against the round in use and the pending one (if any);
    ``known``: it is one of those two, written again (same number and same store).

    A round is identified by its number alone: the agent publishes a round only when something
    changed (a member left or joined, a worker was replaced), and a worker cannot tell from a
    line whether the processes behind its peers' ranks are the same ones, so every newer round
    is re-formed, even one whose ranks and world size equal the current round's. A lower number
    is a renumbering (see :attr:`RoundAction.RENUMBERED`), never a stale line, and so is the same
    number with another store.
    """
    if known:
        return RoundAction.REPEAT
    newest = current if pending is None else max(current, pending)
    return RoundAction.NEWER if incoming > newest else RoundAction.RENUMBERED


def interrupt_due(started: float, now: float, grace: float) -> bool:
    """Whether a collective in flight since ``started`` is abandoned, given that a newer round is pending.

    A collective that finishes within ``grace`` of its start is let finish: when a healthy peer
    joins or leaves cleanly the old group's collectives complete (or fail at once), and
    abandoning them would only cost a state transfer. One still running after ``grace`` is hung
    on a frozen peer (the agent published the round a lease TTL after the freeze, so such a
    collective is already older than any sensible grace when the round arrives).
    """
    return now - started >= grace


@dataclass(frozen=True, order=True)
class Mark:
    """Where a rank's state stands: ``step`` steps committed, the last in round ``round``
    (-1: none committed, or none since its process started).

    Ordered by step, then round: of two ranks at the same step, the one that committed it in
    the newer round holds the state the newest group agreed on. The other committed it in a
    group its peers had abandoned (it froze after the step's last collective, and when it
    resumed the abandoned works completed), while they ran the step again without it.
    """

    step: int
    round: int = -1


@dataclass(frozen=True)
class HealPlan:
    """Who sends the state and who receives it after a group formed.

    ``mark`` is where every rank stands afterwards (its step is the step every rank continues
    from); ``source`` is ``None`` when nobody receives.
    """

    mark: Mark
    source: int | None
    receivers: tuple[int, ...]

    @property
    def step(self) -> int:
        return self.mark.step


def plan_heal(marks: Sequence[Mark], init_sync: bool) -> HealPlan:
    """The heal of a group whose rank ``r`` stands at ``marks[r]``.

    The ranks with the highest mark are the sources and the lowest-ranked of them sends; every
    rank below it receives: a restarted or new worker, a survivor whose last collective failed
    after a peer's had completed (so that it did not commit a step the others did), and a rank
    level by step whose last step was committed in an older round (see :class:`Mark`). Ranks
    that are level redo nothing. At step 0 with ``init_sync``, rank 0 sends to all, so that a
    job need not seed its initialisation identically everywhere.

    Raises:
        ValueError: ``marks`` is empty or holds a negative step.
    """
    if not marks:
        raise ValueError("A heal plan needs the step of at least one rank.")
    if min(mark.step for mark in marks) < 0:
        raise ValueError(f"Steps must not be negative: {[mark.step for mark in marks]}.")
    top = max(marks)
    if top.step == 0:
        receivers = tuple(range(1, len(marks))) if init_sync else ()
        return HealPlan(marks[0] if receivers else top, 0 if receivers else None, receivers)
    source = marks.index(top)
    receivers = tuple(rank for rank, mark in enumerate(marks) if mark < top)
    return HealPlan(top, source if receivers else None, receivers)


class LossAction(enum.Enum):
    """What a worker whose group was lost does next."""

    TAKE_PENDING = "take-pending"
    """A newer round is already pending: form it."""
    WAIT = "wait"
    """Wait for the agent to publish a newer round."""
    GIVE_UP_AGENT_GONE = "agent-gone"
    """The pipe is at EOF: no round will come; exit non-zero."""
    GIVE_UP_DEADLINE = "deadline"
    """No round came before the deadline; exit non-zero so the agent restarts the group."""
    GIVE_UP_FAILING = "failing"
    """Too many groups failed in a row without a step: exit non-zero, the agent's restart is counted."""


def decide_after_loss(pending: bool, eof: bool, deadline_passed: bool, failing: bool = False) -> LossAction:
    """The next step of a worker whose group is lost (a pending round wins over EOF: it was
    published before the agent went away, and the peers may form it; ``failing``, too many
    failed groups in a row, wins over everything: another round would break the same way)."""
    if failing:
        return LossAction.GIVE_UP_FAILING
    if pending:
        return LossAction.TAKE_PENDING
    if eof:
        return LossAction.GIVE_UP_AGENT_GONE
    if deadline_passed:
        return LossAction.GIVE_UP_DEADLINE
    return LossAction.WAIT
