"""Case tables for live recovery's decisions, on one look at the workers (a WorkersView): keep
them through a restart, replace a failed one at once, whether they answered a round, and how the
agent's decision reads their answers. No processes, no clocks."""

from __future__ import annotations

import pytest

from elastic.agent.decisions import AgentAction, AgentView, decide
from elastic.agent.live.decisions import AnswerView, RoundAnswer, decide_answer, group_broken, keeps_workers, refills
from elastic.agent.processes.group_state import GroupState, GroupStatus, WorkersView
from elastic.rendezvous.api import MembershipChange

A = AgentAction
RUN, FAIL = GroupStatus.RUNNING, GroupStatus.FAILED
WAIT, LOST = MembershipChange.NODES_WAITING, MembershipChange.MEMBER_LOST


def live(status: GroupStatus = RUN, *, follows_rounds: bool = True, unanswered: bool = False, silent: bool = False,
         broken: bool = False) -> WorkersView:
    """A look at workers in ``status``; by default live workers that all spoke and answered."""
    return WorkersView(GroupState(status), follows_rounds=follows_rounds, unanswered=unanswered, silent=silent,
                       broken=broken)


@pytest.mark.parametrize("follows_rounds, action, unanswered, silent, keeps", [
    (True, A.RESTART_FOR_MEMBERSHIP, False, False, True),   # a peer failed, a node was lost or joined
    (True, A.RESTART_AFTER_FAILURE, False, False, True),    # our own worker died: the others keep training
    (False, A.RESTART_FOR_MEMBERSHIP, False, False, False),  # not opted in: today's group restart
    (False, A.RESTART_AFTER_FAILURE, False, False, False),
    (False, A.REJOIN_BROKEN, False, False, False),
    (True, A.RESTART_FOR_MEMBERSHIP, True, False, False),   # a worker ignored the last round: group restart
    (True, A.RESTART_AFTER_FAILURE, True, False, False),
    (True, A.RESTART_FOR_MEMBERSHIP, False, True, False),   # a worker never spoke the protocol: group restart
    (True, A.RESTART_AFTER_FAILURE, False, True, False),
    (True, A.RESTART_UNANSWERED, True, False, False),
    (True, A.REJOIN_BROKEN, False, False, True),            # a live worker's group broke: rejoin, keep them
    (True, A.RESTART_FOR_OUTAGE, False, False, False),      # the store is away: nothing to publish
    (True, A.FINISH, False, False, False),
    (True, A.GIVE_UP, False, False, False),
    (True, A.STOP_CLOSED, False, False, False),
    (True, A.EXCLUDE, False, False, False),
    (True, A.STOP_FINISHED, False, False, False),
])
def test_keeps_workers(follows_rounds, action, unanswered, silent, keeps):
    view = live(follows_rounds=follows_rounds, unanswered=unanswered, silent=silent)
    assert keeps_workers(action, view) is keeps


def test_a_group_of_one_attempt_is_never_kept():
    plain = WorkersView(GroupState(FAIL))  # what WorkerGroup.look() says
    assert not any(keeps_workers(action, plain) for action in AgentAction)


@pytest.mark.parametrize("status, follows_rounds, restart_left, unanswered, silent, prewarmed, refill", [
    (FAIL, True, True, False, False, True, True),     # a live worker died: replace it now, in the round in use
    (RUN, True, True, False, False, True, False),     # nothing failed
    (FAIL, True, False, False, False, True, False),   # no restart left: the failure ends the job
    (FAIL, True, True, True, False, True, False),     # a worker left a round unanswered: the group restarts
    (FAIL, True, True, False, True, True, False),     # a worker never spoke the protocol: the group restarts
    (FAIL, True, True, False, False, False, False),   # --no-prewarm: the next round comes before a fresh process
    (FAIL, False, True, False, False, True, False),   # workers that end with their round: the group restarts
])
def test_refills(status, follows_rounds, restart_left, unanswered, silent, prewarmed, refill):
    view = live(status, follows_rounds=follows_rounds, unanswered=unanswered, silent=silent)
    assert refills(view, restart_left, prewarmed) is refill


@pytest.mark.parametrize("published, formed, over, expected", [
    (None, {0: -1}, True, RoundAnswer.NONE_DUE),     # nothing published since the start
    (3, {0: 3, 1: 3}, False, RoundAnswer.ANSWERED),
    (3, {0: 3, 1: 4}, False, RoundAnswer.ANSWERED),  # a newer round formed answers an older one
    (3, {0: 3, 1: 2}, False, RoundAnswer.WAITING),
    (3, {0: 3, 1: -1}, True, RoundAnswer.OVERDUE),
    (3, {0: 3, 1: 3}, True, RoundAnswer.ANSWERED),  # answered, however late we look
    (3, {}, True, RoundAnswer.ANSWERED),             # every worker exited: their exits are handled
])
def test_decide_answer(published, formed, over, expected):
    assert decide_answer(AnswerView(published, formed, over)) is expected


@pytest.mark.parametrize("group, membership, expected", [
    (RUN, None, A.RESTART_UNANSWERED),
    (RUN, WAIT, A.RESTART_UNANSWERED),  # the membership restart would keep a worker that ignores rounds
    (FAIL, None, A.RESTART_AFTER_FAILURE),  # and keeps_workers says no: a group restart
    (FAIL, LOST, A.RESTART_FOR_MEMBERSHIP),
    (GroupStatus.SUCCEEDED, None, A.FINISH),
])
def test_an_unanswered_round_restarts_the_group(group, membership, expected):
    assert decide(AgentView(live(group, unanswered=True), membership, 0, 3)) is expected


@pytest.mark.parametrize("group, membership, unanswered, expected", [
    (RUN, None, False, A.REJOIN_BROKEN),                 # a peer died: rejoin now, not after its lease
    (RUN, LOST, False, A.RESTART_FOR_MEMBERSHIP),        # the change says more: act on it
    (RUN, WAIT, False, A.RESTART_FOR_MEMBERSHIP),
    (RUN, None, True, A.RESTART_UNANSWERED),             # a worker ignored the last round: group restart
    (FAIL, None, False, A.RESTART_AFTER_FAILURE),        # our own worker died: that is reported and charged
    (GroupStatus.SUCCEEDED, None, False, A.FINISH),
    (RUN, MembershipChange.CLOSED, False, A.STOP_CLOSED),
])
def test_a_broken_group_rejoins_unless_something_else_decides(group, membership, unanswered, expected):
    assert decide(AgentView(live(group, unanswered=unanswered, broken=True), membership, 0, 3)) is expected


@pytest.mark.parametrize("current, lost, broken", [
    (3, {0: -1, 1: -1}, False),  # nobody reported a loss
    (3, {0: 3, 1: -1}, True),    # local rank 0's group of the current round broke
    (3, {0: 2}, False),          # reported for a round this node already left: it forms the next
    (3, {0: 4}, True),           # a round it formed after the agent's (the rounds raced on the pipe)
    (3, {}, False),              # no running worker
])
def test_group_broken(current, lost, broken):
    assert group_broken(current, lost) is broken
