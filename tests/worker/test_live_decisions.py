"""Case tables for the pure decisions of live recovery."""

from __future__ import annotations

import pytest

from elastic.worker.decisions import (
    Close,
    CloseAction,
    CloseView,
    HealPlan,
    LossAction,
    RoundAction,
    Standing,
    decide_after_loss,
    decide_close,
    decide_round,
    holds_newest,
    interrupt_due,
    Mark,
    plan_heal,
    plan_shard_heals,
)


@pytest.mark.parametrize(
    ("current", "pending", "incoming", "known", "action"),
    [
        (3, None, 4, False, RoundAction.NEWER),
        (3, None, 9, False, RoundAction.NEWER),  # rounds may be skipped
        (3, None, 3, True, RoundAction.REPEAT),  # the round in use, written again
        (3, None, 2, False, RoundAction.RENUMBERED),  # the job's keys were deleted: rounds start again at 0
        (0, None, 0, False, RoundAction.RENUMBERED),  # ... and may reach the number in use: another store
        (3, 5, 6, False, RoundAction.NEWER),  # replaces the pending one
        (3, 5, 5, True, RoundAction.REPEAT),
        (3, 5, 4, False, RoundAction.RENUMBERED),  # lower than the pending one: numbered anew after it
        (3, 0, 1, False, RoundAction.RENUMBERED),  # the new numbering goes on: replaces the pending 0
        (3, 5, 3, True, RoundAction.REPEAT),
        (0, None, 0, True, RoundAction.REPEAT),
    ],
)
def test_decide_round(current, pending, incoming, known, action):
    assert decide_round(current, pending, incoming, known) is action


@pytest.mark.parametrize(
    ("started", "now", "grace", "due"),
    [(10.0, 10.2, 0.5, False), (10.0, 10.5, 0.5, True), (10.0, 13.0, 0.5, True), (10.0, 10.0, 0.001, False)],
)
def test_interrupt_due(started, now, grace, due):
    assert interrupt_due(started, now, grace) is due


def marks(*pairs):
    """``marks((25, 3), 0)``: Mark(25, 3), Mark(0) (a bare step: nothing committed since the start)."""
    return [Mark(*pair) if isinstance(pair, tuple) else Mark(pair) for pair in pairs]


@pytest.mark.parametrize(
    ("given", "init_sync", "plan"),
    [
        ((0, 0, 0), True, HealPlan(Mark(0), 0, (1, 2))),  # job start: rank 0's initialisation everywhere
        ((0, 0, 0), False, HealPlan(Mark(0), None, ())),
        ((0,), True, HealPlan(Mark(0), None, ())),  # alone: nothing to send
        (((25, 3), (25, 3)), True, HealPlan(Mark(25, 3), None, ())),  # survivors after a crash: nobody behind
        (((25, 3), (25, 3), 0), True, HealPlan(Mark(25, 3), 0, (2,))),  # a new worker heals from rank 0
        ((0, (25, 3), (25, 3)), True, HealPlan(Mark(25, 3), 1, (0,))),  # the joiner took rank 0: rank 1 sends
        (((25, 3), (24, 3), (25, 3)), True, HealPlan(Mark(25, 3), 0, (1,))),  # its last all-reduce failed late
        (((7, 1), (25, 3), 0, (25, 3)), False, HealPlan(Mark(25, 3), 1, (0, 2))),
        # Level by step, but rank 1 committed step 25 in round 3, a group its peers had abandoned
        # (it froze after the step's last collective); they ran step 25 again in round 4.
        (((25, 4), (25, 3)), True, HealPlan(Mark(25, 4), 0, (1,))),
        (((25, 3), (25, 4), (25, 4)), True, HealPlan(Mark(25, 4), 1, (0,))),
        # A step ahead in the abandoned round (its collective completed with the abandoned works:
        # a full step of the old world) wins over peers who have not run that step again yet.
        (((26, 3), (25, 4)), True, HealPlan(Mark(26, 3), 0, (1,))),
    ],
)
def test_plan_heal(given, init_sync, plan):
    assert plan_heal(marks(*given), init_sync) == plan


@pytest.mark.parametrize("given", [(), (3, -1)])
def test_plan_heal_rejects_bad_steps(given):
    with pytest.raises(ValueError):
        plan_heal(marks(*given), True)


@pytest.mark.parametrize(
    ("pending", "eof", "deadline_passed", "action"),
    [
        (True, False, False, LossAction.TAKE_PENDING),
        (True, True, True, LossAction.TAKE_PENDING),  # published before the agent went away
        (False, True, False, LossAction.GIVE_UP_AGENT_GONE),
        (False, True, True, LossAction.GIVE_UP_AGENT_GONE),
        (False, False, True, LossAction.GIVE_UP_DEADLINE),
        (False, False, False, LossAction.WAIT),
    ],
)
def test_decide_after_loss(pending, eof, deadline_passed, action):
    assert decide_after_loss(pending, eof, deadline_passed) is action


@pytest.mark.parametrize(
    ("pending", "eof", "deadline_passed", "action"),
    [
        (False, False, False, LossAction.REFILL),        # re-form the round's next generation first
        (False, False, True, LossAction.REFILL),         # (its own barrier has the deadline)
        (True, False, False, LossAction.TAKE_PENDING),   # a newer round is already there: form it
        (False, True, False, LossAction.GIVE_UP_AGENT_GONE),  # no agent: nobody starts a replacement
    ],
)
def test_a_lost_group_tries_its_next_generation_unless_a_round_is_pending_or_the_agent_gone(pending, eof,
                                                                                             deadline_passed, action):
    assert decide_after_loss(pending, eof, deadline_passed, refill=True) is action
    assert decide_after_loss(pending, eof, deadline_passed, failing=True, refill=True) is LossAction.GIVE_UP_FAILING


@pytest.mark.parametrize(("pending", "eof", "deadline_passed"), [(True, False, False), (False, True, False),
                                                                 (False, False, True), (False, False, False)])
def test_too_many_failed_groups_in_a_row_give_up_whatever_else_holds(pending, eof, deadline_passed):
    # Another round would break the same way (peers that reach the rendezvous but not each
    # other): the agent's restart, counted against --max-restarts, ends the loop.
    assert decide_after_loss(pending, eof, deadline_passed, failing=True) is LossAction.GIVE_UP_FAILING


@pytest.mark.parametrize(("moved", "refill", "action"), [
    (True, True, LossAction.REGROUP),    # a peer left the group for a newer generation: join it, nothing failed
    (True, False, LossAction.REGROUP),
    (False, True, LossAction.REFILL),
    (False, False, LossAction.WAIT),
])
def test_a_group_left_for_a_newer_generation_regroups_unless_a_round_is_pending_or_the_agent_gone(moved, refill,
                                                                                                 action):
    assert decide_after_loss(False, False, False, refill=refill, moved=moved) is action
    assert decide_after_loss(True, False, False, refill=refill, moved=moved) is LossAction.TAKE_PENDING
    assert decide_after_loss(False, True, False, refill=refill, moved=moved) is LossAction.GIVE_UP_AGENT_GONE


GO, WAIT, ABANDON, TIMEOUT = CloseAction.GO, CloseAction.WAIT, CloseAction.ABANDON, CloseAction.TIMEOUT


def view(present, holders=(), world=3, expected=None, window=False, deadline=False, newer=False):
    return CloseView(world, frozenset(present), frozenset(holders), None if expected is None else frozenset(expected),
                     window, deadline, newer)


@pytest.mark.parametrize(("given", "close"), [
    (view({0, 1, 2}), Close(GO, (0, 1, 2))),                                   # everyone: go, holders or not
    (view({0, 1, 2}, newer=True), Close(ABANDON)),                               # a newer round wins over all
    (view({0}, {0}, newer=True, window=True), Close(ABANDON)),
    (view({0, 2}, {0, 2}), Close(WAIT)),                                        # survivors, within the window
    (view({0, 2}, {0, 2}, window=True), Close(GO, (0, 2))),                      # ... past it: go without rank 1
    (view({0, 1, 2}, {0, 2}, world=4, window=True), Close(GO, (0, 1, 2))),       # a fresh rank present goes too
    (view({1}, (), window=True), Close(WAIT)),                                   # fresh ranks never open the window
    (view({0, 1}, ()), Close(WAIT)),                                             # a job's first formation: wait for all
    (view({0, 1}, (), deadline=True), Close(TIMEOUT)),                           # ... up to the form timeout
    (view({0}, {0}, deadline=True), Close(GO, (0,))),                           # a holder at the deadline goes
    (view({1}, (), expected={0, 2}, window=True), Close(WAIT)),                  # a regroup's joiner waits for the members
    (view({0, 1}, {0}, expected={0, 2}, window=True), Close(WAIT)),              # ... all of them, past the window
    (view({0, 1, 2}, {0, 2}, world=4, expected={0, 2}), Close(GO, (0, 1, 2))),   # ... and not for anyone else
    (view({0, 1}, {0}, expected={0, 2}, deadline=True), Close(TIMEOUT)),
])
def test_decide_close(given, close):
    assert decide_close(given) == close


def replicas(present, holders=(), expected=None, window=False, deadline=False):
    """Two nodes of two workers: replicas {0, 1} and {2, 3}."""
    return CloseView(4, frozenset(present), frozenset(holders), None if expected is None else frozenset(expected),
                     window, deadline, False, replica_size=2)


@pytest.mark.parametrize(("given", "close"), [
    (replicas({0, 1, 2, 3}), Close(GO, (0, 1, 2, 3))),                               # everyone
    (replicas({0, 1, 2}, {0, 1, 2}), Close(WAIT)),                                  # a worker crashed: within the window
    (replicas({0, 1, 2}, {0, 1, 2}, window=True), Close(GO, (0, 1))),               # ... past it: its partner stays out
    (replicas({0, 1}, {0, 1}, window=True), Close(GO, (0, 1))),                     # a node lost
    (replicas({2}, {2}, window=True), Close(WAIT)),                                 # no whole replica: wait
    (replicas({0, 1, 2}, {0, 1}, expected={0, 1}), Close(WAIT)),                    # a regroup: the joiner's partner may come
    (replicas({0, 1, 2, 3}, {0, 1}, expected={0, 1}), Close(GO, (0, 1, 2, 3))),     # ... it came: the replica joins whole
    (replicas({0, 1, 2}, {0, 1}, expected={0, 1}, window=True), Close(GO, (0, 1))),  # ... not by the window: go without
])
def test_a_formation_with_replicas_takes_whole_replicas_only(given, close):
    assert decide_close(given) == close


@pytest.mark.parametrize(("given", "shards", "plans"), [
    # a replica (ranks 2, 3) healing: each shard index from the rank of the live replica holding it
    (((5, 1), (5, 1), (0, -1), (0, -1)), (0, 1, 0, 1),
     {0: HealPlan(Mark(5, 1), 0, (2,)), 1: HealPlan(Mark(5, 1), 1, (3,))}),
    # nobody behind: nobody sends
    (((5, 1), (5, 1)), (0, 1), {0: HealPlan(Mark(5, 1), None, ()), 1: HealPlan(Mark(5, 1), None, ())}),
    # the first formation with init_sync: the lowest rank of each shard index sends
    (((0, -1),) * 4, (0, 1, 0, 1), {0: HealPlan(Mark(0, -1), 0, (2,)), 1: HealPlan(Mark(0, -1), 1, (3,))}),
])
def test_a_sharded_heal_pairs_ranks_of_one_shard_index(given, shards, plans):
    assert plan_shard_heals(marks(*given), shards, True) == plans


def test_a_sharded_heal_needs_a_shard_index_per_rank():
    with pytest.raises(ValueError, match="2 marks for 3 shard indices"):
        plan_shard_heals(marks((1, 1), (1, 1)), (0, 1, 0), True)


@pytest.mark.parametrize(("standing", "holds"), [
    (Standing(4, -1), False),                                      # never formed: a fresh process
    (Standing(0, -1), False),                                      # a job's first round
    (Standing(4, 4), True),                                        # a later generation of the round it formed
    (Standing(4, 4, unclean=True), False),                         # ... after a stall: its peer may be cut off
    (Standing(4, 4, left_out=True), False),                        # ... after one formed without it
    (Standing(5, 4, departed_clean=True), True),                   # the next round, having ended round 4 cleanly
    (Standing(5, 4, departed_clean=False), False),                 # ... without: round 4 may train on without it
    (Standing(5, 4, unclean=True, departed_clean=True), True),      # the next round is etcd's word, not the stall's
    (Standing(5, 4, left_out=True, departed_clean=True), False),
    (Standing(6, 4, departed_clean=True), False),                  # it missed round 5, which may have trained without it
    (Standing(3, 4), False),                                       # renumbered rounds
])
def test_holds_newest(standing, holds):
    assert holds_newest(standing) is holds
