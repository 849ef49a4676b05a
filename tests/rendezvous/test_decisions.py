"""Case tables for the protocol's pure decision functions."""

import pytest

from backends.api import EventType, KeyValue, WatchEvent
from elastic.rendezvous import records
from elastic.rendezvous.decisions import (
    CloseAction,
    Joiner,
    agreed_restart_count,
    everyone_back,
    holds_for_members,
    round_is_full,
    is_spare,
    assign_ranks,
    decide_close,
    join_fills_round,
    last_call_deadline,
    rejoin_deadline,
)
from elastic.rendezvous.round_events import (
    MonitorState,
    RoundView,
    spare_count,
    classify,
    deleted_by_hand,
    waiting_counts,
)
from elastic.rendezvous.reconcile import RoundSnapshot, reconcile
from elastic.rendezvous.records import Member, RendezvousKeys, RoundRecord
from elastic.rendezvous.api import MembershipChange

KEYS = RendezvousKeys("/elastic", "job")


def joiner(node, revision):
    return Joiner(node, f"{node}.host", 29500, revision)


def members(*nodes):
    return tuple(Member(node, f"{node}.host", 29500) for node in nodes)


@pytest.mark.parametrize(
    "joined, minimum, maximum, deadline, now, action, wait_until",
    [
        (0, 2, 4, None, 0.0, CloseAction.WAIT, None),
        (1, 2, 4, None, 5.0, CloseAction.WAIT, None),
        (2, 2, 4, 30.0, 5.0, CloseAction.WAIT, 30.0),
        (2, 2, 4, 30.0, 30.0, CloseAction.CLOSE, None),
        (3, 2, 4, 30.0, 31.0, CloseAction.CLOSE, None),
        (4, 2, 4, 30.0, 5.0, CloseAction.CLOSE, None),
        (4, 4, 4, None, 0.0, CloseAction.CLOSE, None),
        (5, 2, 4, None, 0.0, CloseAction.CLOSE, None),
    ],
)
def test_decide_close(joined, minimum, maximum, deadline, now, action, wait_until):
    # (Without full_since: the closer closes at the maximum at once.)
    decision = decide_close(joined, minimum, maximum, deadline, now)
    assert decision.action is action
    assert decision.wait_until == wait_until
    assert decision.reason


@pytest.mark.parametrize(
    "previous, joined, minimum, now, expected",
    [
        (None, 1, 2, 10.0, None),  # below min: no last call yet
        (None, 2, 2, 10.0, 40.0),  # min reached: window opens now
        (40.0, 3, 2, 20.0, 40.0),  # more joins do not extend it
        (40.0, 1, 2, 20.0, None),  # a node left below min: window resets
    ],
)
def test_last_call_deadline(previous, joined, minimum, now, expected):
    assert last_call_deadline(previous, joined, minimum, now, 30.0) == expected


@pytest.mark.parametrize("opened, previous, joined, timeout, expected", [
    (None, ("a", "b"), ["a"], 0.3, 100.3),   # a member is back: the window opens
    (None, ("a", "b"), ["c"], 0.3, None),    # a newcomer alone does not open it (members may be stopping)
    (None, None, ["a"], 0.3, None),          # the first round has only the last call
    (None, ("a", "b"), ["a"], None, None),   # not configured
    (99.0, ("a", "b"), ["a", "b"], 0.3, 99.0),  # once open, it keeps its end
])
def test_rejoin_deadline(opened, previous, joined, timeout, expected):
    record = RoundRecord(4, members(*previous), 10) if previous else None
    assert rejoin_deadline(opened, record, joined, 100.0, timeout) == expected


@pytest.mark.parametrize(
    "previous, joined, maximum, expected_members, expected_spares",
    [
        # first round: join order
        (None, [("c", 3), ("a", 5), ("b", 4)], 8, ["c", "b", "a"], []),
        # survivors keep their relative order, newcomers follow in join order
        (("x", "y", "z"), [("new2", 9), ("z", 3), ("x", 5), ("new1", 8)], 8, ["x", "z", "new1", "new2"], []),
        # beyond max: the newest are spares
        (None, [("a", 1), ("b", 2), ("c", 3)], 2, ["a", "b"], ["c"]),
        # survivors are never displaced by newcomers
        (("y", "x"), [("n", 1), ("x", 2), ("y", 3)], 2, ["y", "x"], ["n"]),
    ],
)
def test_assign_ranks(previous, joined, maximum, expected_members, expected_spares):
    record = RoundRecord(0, members(*previous)) if previous else None
    ordered, spares = assign_ranks(record, [joiner(node, revision) for node, revision in joined], maximum)
    assert [member.node_id for member in ordered] == expected_members
    assert [spare.node_id for spare in spares] == expected_spares


def view(nodes=("me", "a", "b"), maximum=4, number=3):
    return RoundView(KEYS, RoundRecord(number, members(*nodes)), "me", maximum)


def event(kind, key, value=b""):
    return WatchEvent(kind, KeyValue(key, value, 1, 10))


PUT, DELETE = EventType.PUT, EventType.DELETE


@pytest.mark.parametrize(
    "the_event, expected",
    [
        (event(DELETE, KEYS.node(3, "a")), MembershipChange.MEMBER_LOST),
        (event(DELETE, KEYS.node(3, "me")), None),  # our own key: we are the one leaving
        (event(DELETE, KEYS.node(3, "stranger")), None),  # a non-member moving on
        (event(PUT, KEYS.node(3, "late")), None),  # a late joiner of our round moves to the next
        (event(PUT, KEYS.node(4, "new")), MembershipChange.NODES_WAITING),
        (event(PUT, KEYS.node(2, "old")), None),
        (event(PUT, KEYS.closed, records.encode_closed(records.ClosedRecord("done"))), MembershipChange.CLOSED),
        (event(PUT, KEYS.round, records.encode_round(RoundRecord(4, members("x")))), MembershipChange.ROUND_SUPERSEDED),
        (event(PUT, KEYS.round, records.encode_round(RoundRecord(3, members("me")))), None),  # our own close
        (event(PUT, "/elastic/other-job/rounds/4/nodes/x"), None),
    ],
)
def test_classify(the_event, expected):
    change, _ = classify(view(), the_event, MonitorState())
    assert change is expected


def deletion(key, revision):
    return WatchEvent(DELETE, KeyValue(key, b"", 0, revision))


@pytest.mark.parametrize("batch, says", [
    ([deletion(KEYS.node(3, "a"), 20)], None),  # one lease expired: a member lost, as classify says
    ([deletion(KEYS.node(3, "a"), 20), deletion(KEYS.node(3, "b"), 21)], None),  # two leases, two revisions
    ([deletion(KEYS.node(3, "a"), 20), deletion(KEYS.node(3, "me"), 20)], "the join keys of a, me in round 3"),
    ([deletion(KEYS.node(3, "a"), 20), deletion(KEYS.node(3, "stranger"), 20)], None),  # not both members
    ([deletion(KEYS.node(2, "a"), 20), deletion(KEYS.node(2, "b"), 20)], None),  # an older round's keys
    ([deletion(KEYS.round, 20)], "the round record /elastic/job/state/round is gone"),
    ([WatchEvent(PUT, KeyValue(KEYS.round, b"", 1, 20))], None),
])
def test_keys_deleted_by_hand_are_told_from_a_lost_member(batch, says):
    found = deleted_by_hand(view(), batch)
    if says is None:
        assert found is None
    else:
        assert found.startswith("the job's keys were deleted") and says in found


OURS = RoundRecord(3, members("me", "a", "b"))


def snapshot(present=("me", "a", "b"), done=(), waiting=(), record=OURS, closed=False):
    """What a re-read after a compacted watch shows of round 3 (ours), round 4 and state/."""
    return RoundSnapshot(90, record, closed, frozenset(present), frozenset(done), frozenset(waiting))


@pytest.mark.parametrize("seen, read, maximum, change, finding", [
    (MonitorState(), snapshot(), 4, None, "nothing changed"),  # an etcd restart that lost no one
    (MonitorState(), snapshot(present=("me", "b")), 4, MembershipChange.MEMBER_LOST, "member lost: a"),
    (MonitorState(), snapshot(present=("me",)), 4, MembershipChange.MEMBER_LOST, "members lost: a, b"),
    (MonitorState(), snapshot(present=("a", "b")), 4, None, "nothing changed"),  # our own key: the session says
    (MonitorState(), snapshot(present=("me", "b"), done=("a",)), 4, None, "nothing changed"),  # a finished, left
    (MonitorState(done=frozenset({"a"})), snapshot(present=("me", "b")), 4, None,  # its done mark went with it
     "nothing changed"),
    (MonitorState(), snapshot(present=("me", "b", "stranger")), 4, MembershipChange.MEMBER_LOST, "member lost: a"),
    (MonitorState(), snapshot(waiting=("new",)), 4, MembershipChange.NODES_WAITING, "waiting for round 4: new"),
    (MonitorState(), snapshot(waiting=("new",)), 3, None, "nothing changed"),  # full: a spare, no restart
    (MonitorState(), snapshot(waiting=("a",)), 3, MembershipChange.NODES_WAITING, "waiting for round 4: a"),
    (MonitorState(), snapshot(waiting=("me",)), 4, None, "nothing changed"),  # ourselves
    (MonitorState(), snapshot(record=RoundRecord(4, members("a", "b"))), 4, MembershipChange.ROUND_SUPERSEDED,
     "round 4 was closed"),
    (MonitorState(), snapshot(record=RoundRecord(2, members("me"))), 4, None, "nothing changed"),
    (MonitorState(), snapshot(record=None), 4, MembershipChange.MEMBER_LOST,
     "the job's keys were deleted"),  # only a client deletes a closed round's record
    (MonitorState(), snapshot(record=None, present=()), 4, MembershipChange.MEMBER_LOST,
     "the job's keys were deleted"),  # not "members lost: a, b": nobody was lost
    (MonitorState(), snapshot(present=(), closed=True, waiting=("new",)), 4, MembershipChange.CLOSED,
     "the rendezvous was closed"),
    (MonitorState(), snapshot(present=("me",), record=RoundRecord(4, members("a"))), 4,
     MembershipChange.ROUND_SUPERSEDED, "round 4 was closed"),  # superseded outranks lost
    (MonitorState(), snapshot(present=("me", "b"), waiting=("new",)), 4, MembershipChange.MEMBER_LOST,
     "member lost: a"),  # lost outranks waiting
])
def test_reconcile_after_a_compacted_watch(seen, read, maximum, change, finding):
    found = reconcile(RoundView(KEYS, OURS, "me", maximum), seen, read)
    assert found.change is change
    assert found.finding.startswith(finding)


def test_reconcile_takes_the_read_as_the_state_and_keeps_the_done_marks_it_had_seen():
    seen = MonitorState(waiting=frozenset({"gone"}), done=frozenset({"a"}))
    found = reconcile(RoundView(KEYS, OURS, "me", 4), seen, snapshot(done=("b",), waiting=("new",)))
    assert found.state == MonitorState(waiting=frozenset({"new"}), done=frozenset({"a", "b"}))


def test_the_put_of_our_own_round_record_is_skipped_without_decoding_it():
    current = RoundView(KEYS, RoundRecord(3, members("me", "a")), "me", 4, record_revision=10)
    change, _ = classify(current, event(PUT, KEYS.round, b"not decoded: it is the record we hold"), MonitorState())
    assert change is None


def test_a_member_that_finished_may_leave_without_being_lost():
    current = view()
    change, state = classify(current, event(PUT, KEYS.done(3, "a")), MonitorState())
    assert change is None and state.done == {"a"}
    change, _ = classify(current, event(DELETE, KEYS.node(3, "a")), state)
    assert change is None
    change, _ = classify(current, event(DELETE, KEYS.node(3, "b")), state)
    assert change is MembershipChange.MEMBER_LOST


def test_waiting_nodes_are_tracked_through_puts_and_deletes():
    current = view()
    change, state = classify(current, event(PUT, KEYS.node(4, "n1")), MonitorState())
    assert state.waiting == {"n1"}
    change, state = classify(current, event(DELETE, KEYS.node(4, "n1")), state)
    assert state.waiting == set() and change is None


@pytest.mark.parametrize(
    "world, maximum, waiting, expected",
    [
        (("me", "a"), 4, {"n1", "n2"}, 2),  # room to grow: newcomers count
        (("me", "a"), 2, {"n1"}, 0),  # full world: a newcomer is a spare
        (("me", "a"), 2, {"a"}, 1),  # a member rejoining always counts (it restarted)
        (("me", "a"), 4, {"me"}, 0),  # ourselves never
    ],
)
def test_waiting_counts(world, maximum, waiting, expected):
    assert waiting_counts(view(world, maximum), waiting) == expected


@pytest.mark.parametrize(
    "count, max_nodes, fills",
    [
        (4, 4, True),  # this join brought the round to its maximum
        (3, 4, False),  # more may come (the closer decides, after the last call)
        (5, 4, False),  # a spare: the round was already full
        (1, 1, True),  # a one-node job closes on its own join
        (None, 4, False),  # the backend did not count
    ],
)
def test_only_the_join_that_reaches_max_nodes_fills_the_round(count, max_nodes, fills):
    assert join_fills_round(count, max_nodes) is fills


@pytest.mark.parametrize(
    "joined, full_since, now, action, wait_until",
    [
        (4, 10.0, 10.0, CloseAction.WAIT, 15.0),  # just full: the join that filled it closes it
        (4, 10.0, 14.9, CloseAction.WAIT, 15.0),
        (4, 10.0, 15.0, CloseAction.CLOSE, None),  # it did not: the closer does
        (5, 10.0, 20.0, CloseAction.CLOSE, None),
        (3, None, 20.0, CloseAction.WAIT, 32.0),  # below the maximum the last call rules
    ],
)
def test_at_the_maximum_the_closer_waits_the_fill_grace_before_closing(joined, full_since, now, action, wait_until):
    decision = decide_close(joined, 2, 4, 32.0 if joined < 4 else None, now, full_since, fill_grace=5.0)
    assert (decision.action, decision.wait_until) == (action, wait_until)


# -- the agreed restart count -------------------------------------------------------------------
def _previous(restarts, *ids):
    return RoundRecord(4, tuple(Member(node, "h", 1) for node in ids), restart_count=restarts)


def _joiners(*specs):
    """(node id, failed round or None) per joiner."""
    return [Joiner(node, "h", 1, index, failed_round=failed) for index, (node, failed) in enumerate(specs)]


@pytest.mark.parametrize("previous, members, expected, why", [
    (None, _joiners(("a", None), ("b", None)), 0, "the first round starts at 0"),
    (_previous(0, "a", "b"), _joiners(("a", 4), ("b", None)), 1, "a worker of a failed, everyone came back"),
    (_previous(0, "a", "b"), _joiners(("a", 4), ("b", 4)), 1, "both failed in one round: one restart"),
    (_previous(2, "a", "b"), _joiners(("a", None), ("b", None)), 2, "a membership change (someone waited)"),
    (_previous(2, "a", "b"), _joiners(("a", 4)), 2, "b is gone: a's failure was its consequence"),
    (_previous(2, "a", "b"), _joiners(("a", 4), ("c", None)), 2, "b was replaced by c: not counted"),
    (_previous(1, "a", "b"), _joiners(("a", 4), ("b", None), ("c", None)), 2, "a newcomer does not hide a failure"),
    (_previous(1, "a", "b"), _joiners(("a", 3), ("b", None)), 1, "a failure report from an older round is stale"),
])
def test_the_closer_decides_one_restart_count_for_every_member(previous, members, expected, why):
    assert agreed_restart_count(previous, members) == expected, why


# -- spares -------------------------------------------------------------------------------------
FULL_AB = RoundRecord(7, members("a", "b"))  # max_nodes 2 below: full


@pytest.mark.parametrize("previous, joined, alive, hold, why", [
    (None, {"c"}, set(), False, "the first round: nobody to keep"),
    (RoundRecord(7, members("a")), {"c"}, {"a"}, False, "the last round had room: c is a newcomer, not a spare"),
    (FULL_AB, {"c"}, {"a", "b"}, True, "full and everyone alive: c is a spare and must not close a round alone"),
    (FULL_AB, {"c", "d"}, {"a", "b"}, True, "two spares fill a round: still no close (it would replace a and b)"),
    (FULL_AB, {"a", "c"}, {"b"}, True, "a rejoined (its worker failed), b is alive: wait for b"),
    (FULL_AB, {"a", "b", "c"}, set(), False, "every member is back: close; c stays out by rank order"),
    (FULL_AB, {"c"}, {"a"}, False, "b was lost: c takes its place"),
    (FULL_AB, {"a", "c"}, set(), False, "b was lost and a is back: close with a and c"),
    (FULL_AB, {"a"}, {"b"}, False, "no spare: nothing to keep b from; the last call decides"),
    (FULL_AB, {"a", "b"}, set(), False, "every member back, no spare"),
])
def test_a_spare_never_takes_the_place_of_a_live_member(previous, joined, alive, hold, why):
    assert holds_for_members(previous, joined, alive, max_nodes=2) is hold, why


@pytest.mark.parametrize("previous, joined, alive, back, why", [
    (None, {"a", "b"}, set(), False, "the first round always has its last call"),
    (FULL_AB, {"a", "b"}, set(), True, "both rejoined after a worker failure: close at once"),
    (FULL_AB, {"a", "b", "c"}, set(), True, "a newcomer that is already here comes along"),
    (FULL_AB, {"a"}, {"b"}, False, "b's lease lives: it may still come (or its lease runs out)"),
    (FULL_AB, {"a"}, set(), True, "b's lease expired: a need not wait for anyone"),
    (FULL_AB, {"a", "c"}, set(), True, "b is gone, a is back, c joined"),
    (FULL_AB, {"c"}, set(), False, "no member came back: a new world gathers in the last call"),
    (FULL_AB, set(), set(), False, "nobody joined"),
    (RoundRecord(7, members("a")), {"a"}, set(), True, "a round with room re-forms the same way"),
])
def test_a_re_formed_round_knows_when_everyone_who_can_come_is_back(previous, joined, alive, back, why):
    assert everyone_back(previous, joined, alive) is back, why


@pytest.mark.parametrize("joined, everyone, action, wait_until", [
    (2, True, CloseAction.CLOSE, None),  # min reached and everyone back: no last call
    (1, True, CloseAction.WAIT, None),  # below min nothing closes
    (2, False, CloseAction.WAIT, 30.0),  # someone may come: the last call
    (4, True, CloseAction.WAIT, 15.0),  # at the maximum the join that filled it closes it
])
def test_a_round_with_everyone_back_closes_without_the_last_call(joined, everyone, action, wait_until):
    decision = decide_close(joined, 2, 4, 30.0 if joined >= 2 else None, 10.0,
                            full_since=10.0 if joined >= 4 else None, fill_grace=5.0, everyone_back=everyone)
    assert (decision.action, decision.wait_until) == (action, wait_until)


@pytest.mark.parametrize("previous, full", [
    (None, False),
    (RoundRecord(7, members("a")), False),
    (FULL_AB, True),
    (RoundRecord(7, members("a", "b", "c")), True),
])
def test_a_round_is_full_at_the_maximum(previous, full):
    assert round_is_full(previous, max_nodes=2) is full


@pytest.mark.parametrize("previous, node, spare", [
    (None, "c", False),
    (FULL_AB, "c", True),
    (FULL_AB, "a", False),
    (RoundRecord(7, members("a")), "c", False),
])
def test_a_node_outside_a_full_round_is_a_spare(previous, node, spare):
    assert is_spare(previous, node, max_nodes=2) is spare


@pytest.mark.parametrize("record, waiting, spares", [
    (FULL_AB, {"c", "d"}, 2),
    (FULL_AB, {"a", "c"}, 1),  # a rejoining member is not a spare
    (RoundRecord(7, members("a")), {"c"}, 0),  # room: c is waited for, not a spare
])
def test_members_count_spares_only_beyond_a_full_round(record, waiting, spares):
    view = RoundView(KEYS, record, "a", max_nodes=2)
    assert spare_count(view, waiting) == spares
