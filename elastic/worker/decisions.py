"""Pure decisions of live recovery: no I/O, no clocks, no threads, no torch.

Each is tested with a case table in ``tests/worker/test_live_decisions.py`` (the fence's in
``tests/worker/test_fence.py``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

__all__ = [
    "Close",
    "CloseAction",
    "CloseView",
    "FenceVerdict",
    "FenceView",
    "HealPlan",
    "LossAction",
    "Mark",
    "RoundAction",
    "Standing",
    "decide_after_loss",
    "decide_close",
    "decide_round",
    "fence_verdict",
    "holds_newest",
    "interrupt_due",
    "suspect_completion",
    "plan_heal",
    "plan_shard_heals",
    "whole_replicas",
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


def suspect_completion(started: float, now: float, last_ok: float, froze_at: float | None, stall: float) -> bool:
    """Whether a collective that completed at ``now`` may be one its peers had abandoned.

    Peers abandon a collective only once it has been in flight for ``stall`` (the interrupt
    grace) with a newer round pending; gloo cannot cancel it, so it still completes when this
    rank's bytes arrive. That takes a stall on this side too: the collective was in flight for
    ``stall`` or more (the link was cut), or this process was frozen (``froze_at``: when the
    round watcher last saw itself wake late) since the last collective that completed
    unsuspected (``last_ok``). A collective that completes without either is committed without
    asking anything; a rank that only computed slowly while its agent lost the store is not
    caught (see docs/live-recovery.md).
    """
    return now - started >= stall or (froze_at is not None and froze_at >= last_ok)


class FenceVerdict(enum.Enum):
    """What a suspect completion becomes."""

    COMMIT = "commit"
    """Its peers cannot have gone on without this rank: the result is used."""
    WAIT = "wait"
    """Not known yet: wait for the agent's word."""
    ABANDON = "abandon"
    """The group is, or may be, gone on without this rank: the result is dropped, the step
    is not committed, and the rank forms the next round."""


@dataclass(frozen=True)
class FenceView:
    """What a worker knows when it judges a suspect completion (times: ``time.monotonic()``).

    Attributes:
        suspected_at: when the collective completed.
        held_until: before when the store cannot have dropped this node (the agent's last
            lease renewal); None when the agent never said (it publishes no renewals).
        newer_round: a newer round is pending.
        agent_gone: the round pipe is at EOF.
        now: the time of the look.
        deadline: when to stop waiting (the collective timeout after ``suspected_at``).
    """

    suspected_at: float
    held_until: float | None
    newer_round: bool
    agent_gone: bool
    now: float
    deadline: float


def fence_verdict(view: FenceView) -> FenceVerdict:
    """Whether a suspect completion is committed, dropped, or waits.

    Peers go on without this rank only in a round that leaves it out, and a round leaves out a
    node whose lease did not expire only when an operator revoked the lease or deleted the keys;
    so a lease known held past the completion means nobody abandoned it (but for those). A newer round pending, or no agent left, means the
    group may be gone. Past the deadline the completion is dropped as a failed collective.
    """
    if view.newer_round or view.agent_gone:
        return FenceVerdict.ABANDON
    if view.held_until is None or view.held_until > view.suspected_at:
        return FenceVerdict.COMMIT
    if view.now >= view.deadline:
        return FenceVerdict.ABANDON
    return FenceVerdict.WAIT


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


def plan_shard_heals(marks: Sequence[Mark], shards: Sequence[int], init_sync: bool) -> dict[int, HealPlan]:
    """HSDP's heal: one :func:`plan_heal` per shard index among the ranks holding it
    (``shards[r]`` is rank ``r``'s), in the group's ranks; each shard index's receivers get its
    state from a rank with the same index, every shard index at once.

    Raises:
        ValueError: ``marks`` and ``shards`` differ in length, or as :func:`plan_heal`.
    """
    if len(marks) != len(shards):
        raise ValueError(f"{len(marks)} marks for {len(shards)} shard indices.")
    plans = {}
    for index in sorted(set(shards)):
        ranks = [rank for rank, shard in enumerate(shards) if shard == index]
        plan = plan_heal([marks[rank] for rank in ranks], init_sync)
        plans[index] = HealPlan(plan.mark, None if plan.source is None else ranks[plan.source],
                                tuple(ranks[receiver] for receiver in plan.receivers))
    return plans


class LossAction(enum.Enum):
    """What a worker whose group was lost does next."""

    TAKE_PENDING = "take-pending"
    """A newer round is already pending: form it."""
    REGROUP = "regroup"
    """The round's generation moved past the lost group's (a late arrival joins, or a peer moved
    it first): the group was left on purpose or is already being repaired; form the newest
    generation, without telling the agent or counting a failure."""
    REFILL = "refill"
    """Form the round's next generation through its own store (:mod:`elastic.worker.refill`):
    a peer's worker was replaced, or is being; a newer round, if one comes, supersedes it."""
    WAIT = "wait"
    """Wait for the agent to publish a newer round."""
    GIVE_UP_AGENT_GONE = "agent-gone"
    """The pipe is at EOF: no round will come; exit non-zero."""
    GIVE_UP_DEADLINE = "deadline"
    """No round came before the deadline; exit non-zero so the agent restarts the group."""
    GIVE_UP_FAILING = "failing"
    """Too many groups failed in a row without a step: exit non-zero, the agent's restart is counted."""


def decide_after_loss(pending: bool, eof: bool, deadline_passed: bool, failing: bool = False,
                      refill: bool = False, moved: bool = False) -> LossAction:
    """The next step of a worker whose group is lost (a pending round wins over EOF: it was
    published before the agent went away, and the peers may form it; ``failing``, too many
    failed groups in a row, wins over everything: another round would break the same way;
    ``refill``: the lost group's generation was not moved past yet by this worker, and it was
    lost to a failure, not to a newer round; ``moved``: the round's generation had moved past
    the lost group's when the loss was seen, so a peer left it for a newer generation)."""
    if failing:
        return LossAction.GIVE_UP_FAILING
    if pending:
        return LossAction.TAKE_PENDING
    if eof:
        return LossAction.GIVE_UP_AGENT_GONE
    if moved:
        return LossAction.REGROUP
    if refill:
        return LossAction.REFILL
    if deadline_passed:
        return LossAction.GIVE_UP_DEADLINE
    return LossAction.WAIT


@dataclass(frozen=True)
class Standing:
    """What a rank knows about its own training state when it arrives at a generation of round
    ``target_round``.

    Attributes:
        target_round: the round of the generation it arrives at.
        formed_round: the round of the last group it formed (-1: none, since its process started
            or since the rounds were numbered anew).
        left_out: since then, it saw a generation formed without it (it arrived late).
        unclean: its last group was lost after a stall (a collective in flight for the
            interrupt grace, or a freeze): a peer it lost may be cut off rather than dead.
        departed_clean: it left ``formed_round`` for a newer round after ending that round's
            generations in its store, and none had formed without it.
    """

    target_round: int
    formed_round: int
    left_out: bool = False
    unclean: bool = False
    departed_clean: bool = False


def holds_newest(standing: Standing) -> bool:
    """Whether a rank holds the newest training state of the job, as far as the ranks of its
    formation can tell: only such a rank's arrival opens the regroup window
    (:func:`decide_close`), so a formation never goes on without ranks on the word of a rank
    whose state may be stale.

    It must have formed a group, and seen none form without it since. In a later generation of
    the round it formed, a clean loss is enough (its peers cannot have gone on elsewhere: the
    round's generations are one chain, and a peer that left for a newer round ended them
    first). In the next round it must have left the round it formed cleanly (see
    :class:`Standing`); a rank that formed an older round missed at least one round, which may
    have trained without it (a node cut off, then back), and one whose last loss was a stall
    may have been cut off from peers that trained on.
    """
    if standing.formed_round < 0 or standing.left_out:
        return False
    if standing.target_round == standing.formed_round:
        return not standing.unclean
    if standing.target_round == standing.formed_round + 1:
        return standing.departed_clean
    return False


class CloseAction(enum.Enum):
    """What a rank waiting in a formation's barrier does next."""

    GO = "go"
    """Close the generation with the members named (every rank of the round, or the ranks present)."""
    WAIT = "wait"
    ABANDON = "abandon"
    """A newer round is pending, or the round's generation moved past this one: nobody forms it."""
    TIMEOUT = "timeout"
    """The form timeout passed and the generation cannot close: nobody forms it, the rank gives up."""


@dataclass(frozen=True)
class CloseView:
    """One look at a formation's barrier, from one rank.

    Attributes:
        world_size: the round's ranks are ``0 .. world_size - 1``.
        present: the round ranks that arrived.
        holders: those of ``present`` that hold the newest state (:func:`holds_newest`).
        expected: in a generation a late arrival opened (a regroup), the members of the
            generation it replaces, who come at their next step boundary; ``None`` otherwise.
        window_over: the regroup window has passed since this rank first saw a holder arrive.
        deadline_over: the form timeout has passed.
        newer: a newer round is pending, or the round's generation moved past this one.
        replica_size: HSDP: ranks ``k * replica_size .. (k + 1) * replica_size - 1`` are one
            replica (a node's shard group), which trains whole or not at all; 1 otherwise.
    """

    world_size: int
    present: frozenset[int]
    holders: frozenset[int]
    expected: frozenset[int] | None
    window_over: bool
    deadline_over: bool
    newer: bool
    replica_size: int = 1


@dataclass(frozen=True)
class Close:
    """A barrier decision: its action, and for :attr:`CloseAction.GO` the members (ascending)."""

    action: CloseAction
    members: tuple[int, ...] = ()


def decide_close(view: CloseView) -> Close:
    """Whether a formation closes now, and with whom.

    Every rank of the round there: close with all. A regroup closes once every member of the
    generation it replaces is there (they hold the state; the late arrival that opened it is
    there too), without waiting for anyone else. Otherwise, once a rank holding the newest state
    is there and the window has passed since the first one arrived, close with the ranks
    present: survivors of a failure arrive within milliseconds of each other, so the window
    costs only when someone is really missing, and a replacement still starting (a fresh
    process, a GPU's initialisation) joins later in a generation of its own. With no holder
    there (a job's first formation: everyone is fresh) it waits for every rank, up to the form
    timeout. A newer round or generation abandons it whatever else holds.

    With replicas (HSDP) only whole replicas are members: a replica with a rank missing waits
    for it through the window (a replacement and its partners arrive together), then stays out
    (its ranks form the next generation); a formation with no whole replica holding the newest
    state waits.
    """
    if view.newer:
        return Close(CloseAction.ABANDON)
    if len(view.present) >= view.world_size:
        return Close(CloseAction.GO, tuple(range(view.world_size)))
    whole = whole_replicas(view.present, view.world_size, view.replica_size)
    present = tuple(sorted(whole))
    over = view.window_over or view.deadline_over
    if view.expected is not None:
        if view.expected <= view.present and (whole == view.present or over):
            return Close(CloseAction.GO, present)
    elif view.holders & whole and over:
        return Close(CloseAction.GO, present)
    return Close(CloseAction.TIMEOUT if view.deadline_over else CloseAction.WAIT)


def whole_replicas(present: frozenset[int], world_size: int, replica_size: int) -> frozenset[int]:
    """The ranks of ``present`` whose replica (``rank // replica_size``) is all there."""
    if replica_size <= 1:
        return present
    return frozenset(rank for rank in present
                     if all(peer in present for peer in range(rank - rank % replica_size,
                                                              min(world_size, rank - rank % replica_size + replica_size))))
