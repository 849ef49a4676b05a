"""Case table for the agent's restart decision."""

import pytest

from elastic.agent.decisions import AgentAction, AgentView, decide
from elastic.agent.workers import GroupStatus
from elastic.rendezvous.decisions import MembershipChange

RUN, OK, FAIL = GroupStatus.RUNNING, GroupStatus.SUCCEEDED, GroupStatus.FAILED
LOST, WAIT, CLOSED = MembershipChange.MEMBER_LOST, MembershipChange.NODES_WAITING, MembershipChange.CLOSED
A = AgentAction


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
    ],
)
def test_decide(group, membership, used, maximum, grace_over, expected):
    assert decide(AgentView(group, membership, used, maximum, grace_over)) is expected
