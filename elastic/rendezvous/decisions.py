"""Pure decision functions of forming a round: no I/O, no clocks, no threads.

The handler gathers an immutable view (who joined, at which revision, what the last round
was, what time it is) and asks these functions what to do; then it performs the side effect.
Who closes and when, the ranks, the spares and the restart count are here; what an event
under a closed round means is :mod:`elastic.rendezvous.round_events`, what a re-read after a
compacted watch found is :mod:`elastic.rendezvous.reconcile`. Each is tested with case tables
in ``tests/rendezvous/test_decisions.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Sequence

from elastic.rendezvous.records import DEFAULT_ROLE, Member, RoundRecord


@dataclass(frozen=True)
class Joiner:
    """A node that has written its join key for the forming round."""

    node_id: str
    addr: str
    master_port: int
    join_revision: int
    local_world_size: int = 1
    role: str = DEFAULT_ROLE
    failed_round: int | None = None
    """The round in which this node's own workers failed, if that is why it joins again."""
    failed_at: float = 0.0
    """Wall time of that failure's first worker exit."""

    def as_member(self) -> Member:
        return Member(self.node_id, self.addr, self.master_port, self.local_world_size, self.role)


# -- who closes the round --------------------------------------------------------------------
# The first node to join a round claims ``state/closer/<r>`` in the same transaction as its join
# key (:func:`elastic.rendezvous.transactions.join_txn`), so every joiner learns who closes from its own join write, with no
# extra read and no contended retry. Only the closer watches every join, so a round costs O(N)
# watch events, not O(N^2). The claim is bound to the closer's lease: if the closer dies, the
# others see the claim's DELETE on the ``state/`` watch they wait on, and claim it again with
# one create-if-absent; the one that wins closes.


# -- when to close ---------------------------------------------------------------------------
class CloseAction(enum.Enum):
    """What the closer does next."""

    CLOSE = "close"
    WAIT = "wait"


@dataclass(frozen=True)
class CloseDecision:
    """The closer's next step; ``wait_until`` is the monotonic time to re-decide (None: on the next join)."""

    action: CloseAction
    wait_until: float | None = None
    reason: str = ""


def last_call_deadline(
    previous: float | None, joined: int, min_nodes: int, now: float, last_call_timeout: float
) -> float | None:
    """When the last-call window ends: it opens when ``min_nodes`` have joined and resets below it."""
    if joined < min_nodes:
        return None
    return previous if previous is not None else now + last_call_timeout


def rejoin_deadline(
    previous_deadline: float | None, previous: RoundRecord | None, joined: Iterable[str], now: float,
    rejoin_timeout: float | None,
) -> float | None:
    """When the rejoin window ends (``--rdzv-conf rejoin_timeout``; None: no window).

    It opens when the first member of the previous round has joined the forming one: members
    rejoin within a monitor interval of a change, so one not back by then is most likely dead
    (its lease has not run out yet). A newcomer's join alone does not open it.
    """
    if previous_deadline is not None:
        return previous_deadline
    if rejoin_timeout is None or previous is None:
        return None
    members = {member.node_id for member in previous.members}
    return now + rejoin_timeout if members & set(joined) else None


def decide_close(
    joined: int, min_nodes: int, max_nodes: int, deadline: float | None, now: float,
    full_since: float | None = None, fill_grace: float = 0.0, everyone_back: bool = False,
) -> CloseDecision:
    """Close at ``max_nodes``, or at ``min_nodes`` once the last-call window has passed or
    ``everyone_back`` (:func:`everyone_back`: a re-formed round has all it can have).

    At ``max_nodes`` the closer leaves the close to the join that filled the round (see
    :func:`join_fills_round`) for ``fill_grace`` seconds after it saw the round full
    (``full_since``; None: close at once). Why: both would read every join and race their
    compare-and-swaps; the grace only matters when that joiner failed before closing.
    """
    if joined >= max_nodes:
        if full_since is not None and now < full_since + fill_grace:
            return CloseDecision(CloseAction.WAIT, wait_until=full_since + fill_grace,
                                 reason="the join that filled the round closes it")
        return CloseDecision(CloseAction.CLOSE, reason=f"{joined} nodes joined, the maximum")
    if joined >= min_nodes and everyone_back:
        return CloseDecision(CloseAction.CLOSE, reason=f"{joined} nodes joined: every live member of the last round is back")
    if joined >= min_nodes and deadline is not None:
        if now >= deadline:
            return CloseDecision(CloseAction.CLOSE, reason=f"{joined} nodes joined and the last call passed")
        return CloseDecision(CloseAction.WAIT, wait_until=deadline, reason="last call for more nodes")
    return CloseDecision(CloseAction.WAIT, reason=f"{joined} of at least {min_nodes} nodes joined")


def join_fills_round(count: int | None, max_nodes: int) -> bool:
    """Whether the join that left ``count`` joiners in the round (None: not counted) filled it.

    That joiner closes the round itself, at once, instead of waiting for the closer to see its
    join through a watch: a hop less on every full round, and no dependence on how soon the
    closer's watch delivers (etcd serves a watch registered just behind a write from a catch-up
    loop that runs every 100 ms). The closer may close too; the compare-and-swap picks one.
    Only the join that reached ``max_nodes`` exactly does it; later ones are spares.
    """
    return count is not None and count == max_nodes


# -- ranks -----------------------------------------------------------------------------------
def assign_ranks(
    previous: RoundRecord | None, joiners: Sequence[Joiner], max_nodes: int
) -> tuple[tuple[Member, ...], tuple[Joiner, ...]]:
    """Order the round's members; returns ``(members in rank order, spares)``.

    Ranks are stable: survivors of the previous round keep their relative order, newcomers
    follow in join order. Nodes beyond ``max_nodes`` are spares (newest first to be left out).
    """
    by_id = {joiner.node_id: joiner for joiner in joiners}
    survivors = [by_id[member.node_id] for member in (previous.members if previous else ()) if member.node_id in by_id]
    survivor_ids = {joiner.node_id for joiner in survivors}
    newcomers = sorted(
        (joiner for joiner in joiners if joiner.node_id not in survivor_ids),
        key=lambda joiner: (joiner.join_revision, joiner.node_id),
    )
    ordered = survivors + newcomers
    return tuple(joiner.as_member() for joiner in ordered[:max_nodes]), tuple(ordered[max_nodes:])


# -- spares --------------------------------------------------------------------------------
def round_is_full(previous: RoundRecord | None, max_nodes: int) -> bool:
    """Whether the previous round had ``max_nodes`` members: only then can a node be a spare."""
    return previous is not None and previous.group_world_size >= max_nodes


def holds_for_members(
    previous: RoundRecord | None, joined: Iterable[str], alive: Iterable[str], max_nodes: int
) -> bool:
    """Whether the forming round must not close yet, to keep a full world's live members in it.

    ``joined``: the nodes that joined the forming round; ``alive``: the previous round's members
    whose join keys of that round still exist (their leases live, they have not rejoined). When
    the previous round was full, every one of its members is back or alive and a node outside it
    has joined, that node is a *spare*: closing a round with it before all members are back
    would replace a healthy member, and each such round made the members restart to let the
    spare in, for ever (43 rounds in 25 s, 0 steps, with 3 nodes at ``--nnodes 1:2``). The round
    closes once every member has rejoined (the spares then stay out by rank order) or one is
    lost (a spare takes its place). Without a spare nothing is held: a member that is not back
    by the end of the last call (a lost node whose lease has not run out yet) is left out, and
    rejoins as a newcomer if it was only slow.
    """
    if previous is None or not round_is_full(previous, max_nodes):
        return False
    members = {member.node_id for member in previous.members}
    joined = set(joined)
    back = members & joined
    return bool(joined - members) and back != members and members <= (back | set(alive))


def everyone_back(previous: RoundRecord | None, joined: Iterable[str], alive: Iterable[str]) -> bool:
    """Whether a re-formed round has every member of the previous round that can come back.

    True when at least one member rejoined and each of the others is gone (its key of the
    previous round is gone: its lease expired, it left or was excluded). Such a round closes
    at once instead of waiting the last call: the nodes it would wait for are the ones it
    knows, and they are all here; a newcomer that arrives later grows the world as usual. So
    a worker failure re-forms in the time the members take to rejoin, and a node whose lease
    expired is dropped as soon as the survivors are back. The first round (no previous) always
    has its last call.
    """
    if previous is None:
        return False
    members = {member.node_id for member in previous.members}
    back = members & set(joined)
    return bool(back) and not (members - back) & set(alive)


def is_spare(previous: RoundRecord | None, node_id: str, max_nodes: int) -> bool:
    """Whether ``node_id`` waits as a spare: the last round is full and it is not in it.

    A spare waits without a join timeout: it has nothing to time out on until a member is lost.
    """
    return previous is not None and round_is_full(previous, max_nodes) and previous.rank_of(node_id) is None


# -- the restart count ---------------------------------------------------------------------
def agreed_restart_count(previous: RoundRecord | None, members: Sequence[Joiner]) -> int:
    """The restart count of the attempt that round closing with ``members`` starts.

    Decided once, by the closer, and written into the round record, so every rank of an
    attempt sees the same ``TORCHELASTIC_RESTART_COUNT`` (deciding it per node made nodes
    disagree: the node whose worker died counted a failure, its peer a membership change).
    Restarts caused by worker failures count; membership changes do not. A round counts one
    failure restart when a member reports that its own workers failed in the previous round
    and every member of the previous round is back; if a member is missing, the failures were
    most likely the consequence of its loss (its peers' collectives broke) and nothing counts.
    """
    if previous is None:
        return 0
    failed = any(joiner.failed_round == previous.round for joiner in members)
    present = {joiner.node_id for joiner in members}
    everyone_back = all(member.node_id in present for member in previous.members)
    return previous.restart_count + (1 if failed and everyone_back else 0)


def failure_culprit(previous: RoundRecord | None, members: Sequence[Joiner]) -> str | None:
    """The node charged with the failure restart a round counts: the member whose workers failed
    first (their exit times, reported with the joins; the others' workers usually failed on the
    collectives it broke). None when the round counts no failure (:func:`agreed_restart_count`).
    Feeds ``max_node_failures``: only the culprit's failures in a row count towards its exclusion.
    """
    if previous is None or agreed_restart_count(previous, members) == previous.restart_count:
        return None
    failed = [joiner for joiner in members if joiner.failed_round == previous.round]
    return min(failed, key=lambda joiner: (joiner.failed_at, joiner.node_id)).node_id
