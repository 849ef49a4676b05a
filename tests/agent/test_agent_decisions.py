"""Case tables for the agent's restart decision, on one look at its workers (a WorkersView)."""

import pytest

from elastic.agent.decisions import AgentAction, AgentView, decide, rejoin_waits, should_exclude
from elastic.agent.processes.group_state import GroupState, GroupStatus, WorkersView
from elastic.rendezvous.api import MembershipChange, MembershipStatus

RUN, OK, FAIL = GroupStatus.RUNNING, GroupStatus.SUCCEEDED, GroupStatus.FAILED
LOST, WAIT, CLOSED = MembershipChange.MEMBER_LOST, MembershipChange.NODES_WAITING, MembershipChange.CLOSED
BLIND = MembershipChange.STORE_UNREACHABLE
A = AgentAction


def workers(status: GroupStatus, **answers) -> WorkersView:
    """A look at workers in ``status`` (``answers``: what live workers said)."""
    return WorkersView(GroupState(status), **answers)


@pytest.mark.parametrize(
    "group, membership, used, maximum, grace_over, expected",
    [
        (RUN, None, 0, 3, True, A.KEEP_RUNNING),
        (RUN, LOST, 0, 0, True, A.RESTART_FOR_MEMBERSHIP),
        (RUN, WAIT, 3, 3, True, A.RESTART_FOR_MEMBERSHIP),  # membership restarts are free
        (RUN, CLOSED, 0, 3, True, A.STOP_CLOSED),
        (OK, None, 0, 0, True, A.FINISH),
        (OK, LOST, 0, 0, True, A.FINISH),  # our work is done: the exit barrier handles the rest
        (FAIL, None, 0, 1, True, A.RESTART_AFTER_FAILURE),
        (FAIL, None, 1, 1, True, A.GIVE_UP),
        (FAIL, None, 1, 1, False, A.AWAIT_MEMBERSHIP),  # a peer may have just died
        (FAIL, LOST, 1, 1, False, A.RESTART_FOR_MEMBERSHIP),  # it did: not our failure
        (FAIL, CLOSED, 0, 3, True, A.STOP_CLOSED),
        (RUN, BLIND, 0, 3, True, A.STOP_BLIND),  # store_outage_timeout passed: no restart could rejoin
        (FAIL, BLIND, 0, 3, False, A.STOP_BLIND),
        (OK, BLIND, 0, 3, True, A.FINISH),  # done anyway
    ],
)
def test_decide(group, membership, used, maximum, grace_over, expected):
    assert decide(AgentView(workers(group), membership, used, maximum, grace_over)) is expected


@pytest.mark.parametrize(
    "group, membership, used, maximum, exclude, expected",
    [
        (FAIL, None, 0, 3, False, A.RESTART_FOR_OUTAGE),  # not charged
        (FAIL, None, 3, 3, False, A.RESTART_FOR_OUTAGE),  # whether or not restarts remain
        (FAIL, None, 0, 3, True, A.RESTART_FOR_OUTAGE),  # nor counted toward exclusion
        (FAIL, LOST, 0, 3, False, A.RESTART_FOR_MEMBERSHIP),  # the server's word comes first
        (FAIL, CLOSED, 0, 3, False, A.STOP_CLOSED),
        (FAIL, BLIND, 0, 3, False, A.STOP_BLIND),
        (RUN, None, 0, 3, False, A.KEEP_RUNNING),  # an outage alone restarts nothing
        (OK, None, 0, 3, False, A.FINISH),
    ],
)
def test_a_failure_during_a_store_outage_is_not_charged(group, membership, used, maximum, exclude, expected):
    view = AgentView(workers(group), membership, used, maximum, grace_over=True, exclude=exclude, store_outage=True)
    assert decide(view) is expected


# -- bad-node exclusion ---------------------------------------------------------------------------
@pytest.mark.parametrize("in_a_row, max_failures, world, min_nodes, exclude, why", [
    (5, 0, 3, 2, False, "off by default"),
    (0, 2, 3, 2, False, "the first failure of two allowed"),
    (1, 2, 3, 2, True, "the second failure in a row"),
    (1, 2, 2, 2, False, "excluding would leave fewer than min_nodes: restart as usual"),
    (3, 2, 4, 2, True, "past the limit (counting is per node, in a row)"),
])
def test_a_node_is_excluded_after_its_own_failures_in_a_row(in_a_row, max_failures, world, min_nodes, exclude, why):
    assert should_exclude(in_a_row, max_failures, world, min_nodes) is exclude, why


@pytest.mark.parametrize("grace_over, action", [(False, AgentAction.AWAIT_MEMBERSHIP), (True, AgentAction.EXCLUDE)])
def test_an_excluding_failure_first_waits_out_the_grace_for_a_dead_peer(grace_over, action):
    view = AgentView(workers(FAIL), None, restarts_used=0, max_restarts=3, grace_over=grace_over, exclude=True)
    assert decide(view) is action
    # A membership change in the same look wins: the failure was the peer's consequence.
    lost = AgentView(workers(FAIL), MembershipChange.MEMBER_LOST, 0, 3, grace_over, exclude=True)
    assert decide(lost) is AgentAction.RESTART_FOR_MEMBERSHIP


def test_peers_rejoining_do_not_save_a_node_from_exclusion_but_a_lost_member_does():
    waiting = AgentView(workers(FAIL), MembershipChange.NODES_WAITING, 0, 3, grace_over=True, exclude=True)
    assert decide(waiting) is AgentAction.EXCLUDE
    stopped = AgentView(workers(GroupStatus.STOPPED), MembershipChange.NODES_WAITING, 0, 3, grace_over=True,
                        exclude=True)
    assert decide(stopped) is AgentAction.RESTART_FOR_MEMBERSHIP  # stopped by us for a scale-up: no failure


# -- the job's end (issue 26 item 6) ----------------------------------------------------------------
DONE, ELSEWHERE = MembershipChange.JOB_FINISHED, MembershipChange.JOB_FINISHED_ELSEWHERE
STOPPED = GroupStatus.STOPPED


@pytest.mark.parametrize("group, membership, used, maximum, exclude, outage, expected", [
    (RUN, DONE, 0, 3, False, False, A.KEEP_RUNNING),  # a peer finished: ours may finish too
    (OK, DONE, 0, 3, False, False, A.FINISH),
    (FAIL, DONE, 0, 3, False, False, A.STOP_FINISHED),  # not a restart: the job is done
    (FAIL, DONE, 3, 3, False, False, A.STOP_FINISHED),  # not a give-up either
    (FAIL, DONE, 0, 3, True, False, A.STOP_FINISHED),  # nor an exclusion
    (FAIL, DONE, 0, 3, False, True, A.STOP_FINISHED),  # nor an outage restart
    (STOPPED, DONE, 0, 3, False, False, A.STOP_FINISHED),
    (RUN, ELSEWHERE, 0, 3, False, False, A.STOP_FINISHED),  # our round trains a finished job
    (FAIL, ELSEWHERE, 0, 3, False, False, A.STOP_FINISHED),
    (OK, ELSEWHERE, 0, 3, False, False, A.FINISH),
    (RUN, BLIND, 0, 3, False, False, A.STOP_BLIND),
])
def test_once_the_job_finished_no_decision_restarts_the_workers(group, membership, used, maximum, exclude, outage,
                                                               expected):
    view = AgentView(workers(group), membership, used, maximum, grace_over=True, exclude=exclude, store_outage=outage)
    assert decide(view) is expected


@pytest.mark.parametrize("group, rejoin_pending, expected", [
    (RUN, True, A.AWAIT_MEMBERSHIP),  # a member rejoined: ours get the grace to end on their own
    (RUN, False, A.RESTART_FOR_MEMBERSHIP),  # the grace is over (or a newcomer waits)
    (OK, True, A.FINISH),  # they finished within it: the job is done, not restarted
    (FAIL, True, A.RESTART_FOR_MEMBERSHIP),  # they failed within it: the rejoin's consequence
])
def test_running_workers_get_the_rejoin_grace_before_a_restart(group, rejoin_pending, expected):
    view = AgentView(workers(group), WAIT, 0, 3, grace_over=True, rejoin_pending=rejoin_pending)
    assert decide(view) is expected


@pytest.mark.parametrize("group, follows_rounds, waiting, rejoining, waits", [
    (RUN, False, 1, 1, True),    # only a member rejoined: ours may still end on their own
    (RUN, False, 2, 1, False),   # a newcomer waits too: restart for it now
    (RUN, False, 0, 0, False),   # nobody waits
    (FAIL, False, 1, 1, False),  # ours already ended
    (OK, False, 1, 1, False),
    (RUN, True, 1, 1, False),    # live workers do not end with their peers: they wait for the round
])
def test_the_rejoin_grace_is_for_running_workers_that_end_with_their_round(group, follows_rounds, waiting,
                                                                          rejoining, waits):
    membership = MembershipStatus(WAIT, waiting=waiting, rejoining=rejoining)
    assert rejoin_waits(workers(group, follows_rounds=follows_rounds), membership) is waits
    other = MembershipStatus(LOST, waiting=waiting, rejoining=rejoining)
    assert not rejoin_waits(workers(group, follows_rounds=follows_rounds), other)
