"""Case tables for the pure decisions of live recovery."""

from __future__ import annotations

import pytest

from elastic.worker.decisions import (
    HealPlan,
    LossAction,
    RoundAction,
    decide_after_loss,
    decide_round,
    interrupt_due,
    Mark,
    plan_heal,
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
