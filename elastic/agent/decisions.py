"""The agent's pure decision: given the worker group and the membership, what next.

Tested with a case table in ``tests/agent/test_agent_decisions.py``; no processes, no clocks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from elastic.agent.processes.group_state import GroupState, GroupStatus, WorkersView
from elastic.rendezvous.api import MembershipChange, MembershipStatus


class AgentAction(enum.Enum):
    """What the agent does after one look at its workers.

    KEEP_RUNNING → (nothing). RESTART_AFTER_FAILURE counts against ``--max-restarts``;
    RESTART_FOR_MEMBERSHIP does not. FINISH: workers succeeded (exit barrier, then exit 0).
    GIVE_UP: restarts exhausted (close the rendezvous, print the root cause, exit 1).
    STOP_CLOSED: the rendezvous was closed by another node (stop workers, exit 1 if they had
    not finished).
    AWAIT_MEMBERSHIP: workers failed, no restart is left (or this failure would exclude the
    node), but a peer may just have died (its TCP connections reset at once, its lease expires
    only after the TTL): wait up to the grace period for the membership signal first. Also:
    only members rejoined while this node's workers run: wait up to the rejoin grace for
    their own outcome first (:data:`REJOIN_GRACE_S`).
    EXCLUDE: this node's own workers failed ``max_node_failures`` times in a row: leave the
    rendezvous for the exclusion cooldown so the others go on without it.
    STOP_BLIND: the store has not answered for ``store_outage_timeout``: stop the workers rather
    than train on blind, and exit 1 (a restart could not rejoin without the store).
    RESTART_FOR_OUTAGE: workers failed while the store did not answer (or within the grace period
    after): restart without reporting the failure, so it is not charged (the rejoin waits for
    the store).
    STOP_FINISHED: the job finished on another node (its workers all succeeded) and this node's
    workers failed or stopped after that, or run in a round that formed without the finisher:
    stop them and exit 0 without training again.
    RESTART_UNANSWERED (``--live-recovery``): a live worker did not form the round published to
    it within ``--live-recovery-timeout``: restart the whole group, not counted.
    REJOIN_BROKEN (``--live-recovery``): a live worker's group broke (its collective failed at
    once: a peer's worker or whole node died) and nothing else happened yet: join the next
    round now, keeping the workers, not counted. A dead node's lease expires only after the
    TTL; the round without it then closes after the last call instead.
    """

    KEEP_RUNNING = "keep_running"
    RESTART_AFTER_FAILURE = "restart_after_failure"
    RESTART_FOR_MEMBERSHIP = "restart_for_membership"
    FINISH = "finish"
    GIVE_UP = "give_up"
    STOP_CLOSED = "stop_closed"
    AWAIT_MEMBERSHIP = "await_membership"
    EXCLUDE = "exclude"
    STOP_BLIND = "stop_blind"
    RESTART_FOR_OUTAGE = "restart_for_outage"
    STOP_FINISHED = "stop_finished"
    RESTART_UNANSWERED = "restart_unanswered"
    REJOIN_BROKEN = "rejoin_broken"


@dataclass(frozen=True)
class AgentView:
    """One look at the node: its workers, the membership signal, the restart budget."""

    workers: WorkersView
    membership: MembershipChange | None
    restarts_used: int
    max_restarts: int
    grace_over: bool = True
    exclude: bool = False
    """Whether a failure of this node's workers now would exclude it (see :func:`should_exclude`)."""
    store_outage: bool = False
    """Whether the store is not answering, or stopped answering within the grace period."""
    rejoin_pending: bool = False
    """Only members of this round wait (their workers failed, they rejoined) and the rejoin grace
    (:data:`REJOIN_GRACE_S`) runs: this node's workers get it to show their own outcome first
    (see :func:`rejoin_waits`)."""


@dataclass(frozen=True)
class Verdict:
    """What one watch of the workers decided, with what it saw."""

    action: AgentAction
    workers: WorkersView
    membership: MembershipStatus

    @property
    def state(self) -> GroupState:
        return self.workers.state


REJOIN_GRACE_S = 3.0
"""How long running workers get to end on their own when only members rejoined: a peer's
workers fail on the collectives of ours that just finished the job (then ours succeed: the job
is finished, not restarted), or ours fail on the peer's (then ours count as failed too, as the
plugin's grace does for torch's agent)."""


def decide(view: AgentView) -> AgentAction:
    """Local results come first (a finished or failed group), then the membership signal.

    A failure that coincides with a membership change is the change's consequence (a peer's
    death breaks the collectives) and does not count against ``--max-restarts``; nor does one
    that coincides with a store outage, whether or not restarts remain. Once a peer finished the
    job, running workers may finish too, and a failure is the job's end, never a restart.
    """
    group = view.workers.status
    if group is GroupStatus.SUCCEEDED:
        return AgentAction.FINISH
    if view.membership is MembershipChange.STORE_UNREACHABLE:
        return AgentAction.STOP_BLIND
    if view.membership is MembershipChange.JOB_FINISHED_ELSEWHERE:
        return AgentAction.STOP_FINISHED
    if view.membership is MembershipChange.JOB_FINISHED:  # a peer of this round finished the job
        return AgentAction.KEEP_RUNNING if group is GroupStatus.RUNNING else AgentAction.STOP_FINISHED
    if group in (GroupStatus.FAILED, GroupStatus.STOPPED):
        if view.membership is MembershipChange.CLOSED:
            return AgentAction.STOP_CLOSED
        if view.store_outage and group is GroupStatus.FAILED and view.membership is None:
            return AgentAction.RESTART_FOR_OUTAGE
        # Peers rejoining (their workers failed on ours) do not clear us; a lost member would.
        if view.exclude and group is GroupStatus.FAILED and view.membership in (None, MembershipChange.NODES_WAITING):
            return AgentAction.EXCLUDE if view.grace_over else AgentAction.AWAIT_MEMBERSHIP
        if view.membership is not None:
            return AgentAction.RESTART_FOR_MEMBERSHIP
        if view.restarts_used < view.max_restarts:
            return AgentAction.RESTART_AFTER_FAILURE
        return AgentAction.GIVE_UP if view.grace_over else AgentAction.AWAIT_MEMBERSHIP
    if view.membership is MembershipChange.CLOSED:
        return AgentAction.STOP_CLOSED
    if view.membership is MembershipChange.NODES_WAITING and view.rejoin_pending:
        return AgentAction.AWAIT_MEMBERSHIP
    if view.workers.unanswered:
        return AgentAction.RESTART_UNANSWERED
    if view.membership is not None:
        return AgentAction.RESTART_FOR_MEMBERSHIP
    if view.workers.broken:
        return AgentAction.REJOIN_BROKEN
    return AgentAction.KEEP_RUNNING


def rejoin_waits(workers: WorkersView, membership: MembershipStatus) -> bool:
    """Whether the rejoin grace applies: only members rejoined (their workers failed, no newcomer
    waits) while this node's workers run, and these may still end on their own (their peers'
    failure breaks their collectives, or they just finished the job). Not for workers that follow
    rounds: they neither end nor fail with their peers, they wait for the next round."""
    return (membership.change is MembershipChange.NODES_WAITING and workers.status is GroupStatus.RUNNING
            and 0 < membership.waiting <= membership.rejoining and not workers.follows_rounds)


def should_exclude(failures_in_a_row: int, max_node_failures: int, group_world_size: int, min_nodes: int) -> bool:
    """Whether a failure of this node's own workers now excludes it (``--rdzv-conf max_node_failures``).

    ``failures_in_a_row``: the failure restarts this node's workers caused before, in a row.
    Only while at least ``min_nodes`` other members would remain: excluding a node the job
    cannot do without only turns a restart into a stall. 0 turns the policy off.
    """
    return (max_node_failures > 0 and failures_in_a_row + 1 >= max_node_failures
            and group_world_size - 1 >= min_nodes)
