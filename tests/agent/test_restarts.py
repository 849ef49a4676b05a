"""Case table for settling the agent's pending restart against the next round."""

import pytest

from elastic.agent.observe.events import RestartCause
from elastic.agent.processes.group_state import GroupState, GroupStatus
from elastic.agent.restarts import PendingCause, PendingRestart, Settlement, settle
from elastic.rendezvous.api import RendezvousInfo
from elastic.rendezvous.records import Member, NodeLayout

FAILURE, MEMBERSHIP, OUTAGE = PendingCause.FAILURE, PendingCause.MEMBERSHIP, PendingCause.OUTAGE
COUNTED, CHANGE, STORE = RestartCause.WORKER_FAILURE, RestartCause.MEMBERSHIP_CHANGE, RestartCause.STORE_OUTAGE
NOT_COUNTED = "worker failure not counted: b, a member of the previous round, is absent from round 1"


def pending(cause: PendingCause, members: tuple[str, ...] = ("a", "b")) -> PendingRestart:
    return PendingRestart(cause, GroupState(GroupStatus.FAILED), members, "why")


def round_info(members: str, *, restart_count: int = 0, culprit: str | None = None, agreed: bool = True):
    nodes = tuple(Member(node, "h", 1) for node in members)
    layout = NodeLayout(0, len(nodes), 1, 0, len(nodes), "default", 0, len(nodes)) if agreed else None
    return RendezvousInfo("job", 1, 0, len(nodes), "h", 1, nodes, restart_count=restart_count, layout=layout,
                          culprit=culprit)


@pytest.mark.parametrize("cause, info, used, in_a_row, expected", [
    # With a round record, the closer decided: its count is the truth.
    (None, round_info("ab"), 0, 0, Settlement(0, 0)),
    (None, round_info("ab", restart_count=2), 1, 0, Settlement(2, 0)),  # a restart this node missed
    (FAILURE, round_info("ab", restart_count=1, culprit="a"), 0, 0, Settlement(1, 1, COUNTED, counted=True)),
    (FAILURE, round_info("ab", restart_count=2, culprit="a"), 1, 1, Settlement(2, 2, COUNTED, counted=True)),
    (FAILURE, round_info("a"), 0, 0, Settlement(0, 0, CHANGE, not_counted=NOT_COUNTED)),
    (FAILURE, round_info("ab", restart_count=1, culprit="b"), 0, 3, Settlement(1, 0, COUNTED, counted=True)),
    # A peer's failure counted in the round we rejoined for its membership change.
    (MEMBERSHIP, round_info("ab", restart_count=1, culprit="b"), 0, 0, Settlement(1, 0, COUNTED)),
    (MEMBERSHIP, round_info("abc"), 0, 2, Settlement(0, 0, CHANGE)),
    (OUTAGE, round_info("ab"), 0, 0, Settlement(0, 0, STORE)),
    (OUTAGE, round_info("ab", restart_count=1, culprit="b"), 0, 0, Settlement(1, 0, COUNTED)),
    # Without one (static rendezvous), this node counts its own failures.
    (None, round_info("ab", agreed=False), 1, 0, Settlement(1, 0)),
    (FAILURE, round_info("ab", agreed=False), 1, 0, Settlement(2, 0, COUNTED, counted=True)),
    (FAILURE, round_info("a", agreed=False), 1, 0,
     Settlement(1, 0, CHANGE, not_counted="worker failure after the loss of b (absent from round 1)")),
    (MEMBERSHIP, round_info("ab", agreed=False), 1, 0, Settlement(1, 0, CHANGE)),
    (OUTAGE, round_info("ab", agreed=False), 1, 0, Settlement(1, 0, STORE)),
])
def test_settle(cause, info, used, in_a_row, expected):
    assert settle(pending(cause) if cause else None, info, used, in_a_row, "a") == expected


@pytest.mark.parametrize("members, info, says", [
    (("a", "b", "c"), round_info("a"), "worker failure not counted: b, c, members of the previous round, are absent "
                                       "from round 1"),
    (("a", "b"), round_info("ab"), "worker failure not counted: round 1's closer counted no failure restart"),
])
def test_an_uncounted_failure_names_the_absent_members(members, info, says):
    assert settle(pending(FAILURE, members), info, 0, 0, "a").not_counted == says


def test_an_outage_is_never_settled_as_a_membership_change():
    for agreed in (True, False):
        assert settle(pending(OUTAGE), round_info("ab", agreed=agreed), 0, 0, "a").recorded is STORE
