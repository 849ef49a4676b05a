"""The failure and rejoin graces of one watch, on a fake clock: which grace runs, until when, and
whether the rest of a failed group stops at once."""

from __future__ import annotations

from elastic.agent.decisions import REJOIN_GRACE_S
from elastic.agent.graces import Graces
from elastic.agent.processes.group_state import GroupState, GroupStatus, WorkersView
from elastic.rendezvous.api import MembershipChange, MembershipStatus

QUIET = MembershipStatus()
REJOINED = MembershipStatus(MembershipChange.NODES_WAITING, waiting=1, rejoining=1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def look(status: GroupStatus, follows_rounds: bool = False) -> WorkersView:
    return WorkersView(GroupState(status), follows_rounds=follows_rounds, silent=not follows_rounds)


def test_a_failure_first_seen_stops_the_rest_of_a_group_that_ends_with_its_round_once():
    clock = Clock()
    graces = Graces(clock, failure_grace=11.0)
    first = graces.look(look(GroupStatus.FAILED), QUIET)
    assert (first.stop_now, first.over, first.deadline) == (True, False, 111.0)
    clock.now = 105.0
    again = graces.look(look(GroupStatus.FAILED), QUIET)
    assert (again.stop_now, again.over, again.deadline) == (False, False, 111.0)  # stopped once, same deadline
    clock.now = 111.0
    assert graces.look(look(GroupStatus.FAILED), QUIET).over


def test_workers_that_follow_rounds_are_not_stopped_while_the_failure_waits():
    graces = Graces(Clock(), failure_grace=11.0)
    grace = graces.look(look(GroupStatus.FAILED, follows_rounds=True), QUIET)
    assert (grace.stop_now, grace.over) == (False, False)


def test_a_lone_node_has_no_failure_grace_and_a_membership_change_starts_none():
    assert Graces(Clock(), failure_grace=0.0).look(look(GroupStatus.FAILED), QUIET).over
    lost = MembershipStatus(MembershipChange.MEMBER_LOST)
    grace = Graces(Clock(), failure_grace=11.0).look(look(GroupStatus.FAILED), lost)
    assert (grace.stop_now, grace.over, grace.deadline) == (False, True, None)


def test_the_rejoin_grace_runs_once_for_running_workers_that_end_with_their_round():
    clock = Clock()
    graces = Graces(clock, failure_grace=11.0)
    grace = graces.look(look(GroupStatus.RUNNING), REJOINED)
    assert (grace.rejoin_pending, grace.deadline) == (True, 100.0 + REJOIN_GRACE_S)
    clock.now += REJOIN_GRACE_S
    assert not graces.look(look(GroupStatus.RUNNING), REJOINED).rejoin_pending  # over: not started again
    assert not Graces(clock, 11.0).look(look(GroupStatus.RUNNING, follows_rounds=True), REJOINED).rejoin_pending
