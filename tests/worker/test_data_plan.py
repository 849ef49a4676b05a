"""Case tables for the data plan: which samples each rank uses in each step, in any world."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from elastic.worker.data_plan import (
    Batching,
    DataPosition,
    StepPlan,
    accumulation_for,
    batch_indices,
    epoch_order,
    plan_step,
)
from elastic.worker.errors import DataPlanError, LiveRecoveryError

REPO = str(Path(__file__).resolve().parents[2])


@pytest.mark.parametrize(
    ("length", "consumed", "world", "micro", "accumulation", "size", "by_rank", "after"),
    [
        # a full step: slot i * world + r is micro-batch i of rank r
        (100, 0, 2, 3, 2, 12, {0: [(0, 3), (6, 9)], 1: [(3, 6), (9, 12)]}, (0, 12)),
        (100, 40, 1, 5, 1, 5, {0: [(40, 45)]}, (0, 45)),
        # the epoch's last step, shorter: as many micro-batches as it needs, shares even
        (20, 12, 2, 3, 2, 8, {0: [(12, 14), (16, 18)], 1: [(14, 16), (18, 20)]}, (1, 0)),
        (7, 0, 4, 2, 1, 7, {0: [(0, 2)], 1: [(2, 4)], 2: [(4, 6)], 3: [(6, 7)]}, (1, 0)),  # the larger first
        (100, 95, 2, 4, 3, 5, {0: [(95, 98)], 1: [(98, 100)]}, (1, 0)),  # one micro-batch per rank is enough
        (5, 4, 1, 2, 2, 1, {0: [(4, 5)]}, (1, 0)),
        # fewer samples than ranks: a filler (an empty range) keeps rank 3 in the all-reduce
        (11, 8, 4, 2, 2, 3, {0: [(8, 9)], 1: [(9, 10)], 2: [(10, 11)], 3: [(11, 11)]}, (1, 0)),
        # micro-batches of 1: a remainder the world does not divide leaves fillers
        (10, 0, 4, 1, 2, 8, {0: [(0, 1), (4, 5)], 3: [(3, 4), (7, 8)]}, (0, 8)),
        (10, 8, 4, 1, 2, 2, {0: [(8, 9)], 1: [(9, 10)], 2: [(10, 10)], 3: [(10, 10)]}, (1, 0)),
        (13, 8, 4, 1, 2, 5, {0: [(8, 9), (12, 13)], 1: [(9, 10), (13, 13)]}, (1, 0)),
        # a step that ends exactly at the epoch's end is full, and rolls the epoch over
        (24, 12, 2, 3, 2, 12, {0: [(12, 15), (18, 21)]}, (1, 0)),
    ],
)
def test_a_step_deals_the_samples_after_the_position_as_the_table_says(
        length, consumed, world, micro, accumulation, size, by_rank, after):
    start = DataPosition(3, consumed, seed=7)
    for rank, expected in by_rank.items():
        plan = plan_step(start, length, rank, world, micro, accumulation)
        assert plan.size == size
        assert [(r.start, r.stop) for r in plan.micro_batches] == expected
        assert plan.after == DataPosition(3 + after[0], after[1], seed=7)
        assert plan.ends_epoch is (after[0] == 1)


def test_weights_make_the_ranks_mean_the_mean_over_the_steps_samples():
    full = plan_step(DataPosition(0, 0), 100, 1, 4, 2, 3)
    assert full.weights == (1 / 3, 1 / 3, 1 / 3)
    short = [plan_step(DataPosition(0, 8), 11, rank, 4, 2, 2) for rank in range(4)]
    assert [plan.weights for plan in short] == [(4 / 3,), (4 / 3,), (4 / 3,), (0.0,)]
    assert [plan.samples for plan in short] == [(1,), (1,), (1,), (0,)]


def test_a_filler_is_the_steps_first_sample_and_the_rest_go_through_the_order():
    order = epoch_order(11, seed=1, epoch=0, shuffle=True)
    plans = [plan_step(DataPosition(0, 8, seed=1), 11, rank, 4, 2, 2) for rank in range(4)]
    assert [batch_indices(plan, order) for plan in plans] == [
        ((order[8],),), ((order[9],),), ((order[10],),), ((order[8],),)]


# -- any sequence of worlds uses every sample of the epoch once -----------------------------------

def run_epochs(length, attempts, batching, seed=0, epochs=1):
    """Play ``attempts`` ((world size, committed), cycled) from an epoch's start as every rank of
    each world would, until ``epochs`` epochs end; check each step's shape on the way.

    Returns the dataset indices the committed steps used (fillers left out), one list per epoch.
    """
    position, used, cycle = DataPosition(0, 0, seed), [[] for _ in range(epochs)], 0
    while position.epoch < epochs:
        world, committed = attempts[cycle % len(attempts)]
        cycle += 1
        accumulation = batching.accumulation_in(world)
        order = epoch_order(length, seed, position.epoch, shuffle=True)
        plans = [plan_step(position, length, rank, world, batching.micro_batch, accumulation)
                 for rank in range(world)]
        assert len({len(plan.micro_batches) for plan in plans}) == 1, "ranks differ in micro-batches"
        assert len({(plan.size, plan.after) for plan in plans}) == 1, "ranks disagree on the step"
        assert all(0 <= n <= batching.micro_batch for plan in plans for n in plan.samples)
        assert sum(w for plan in plans for w in plan.weights) == pytest.approx(world)
        assert sum(sum(plan.samples) for plan in plans) == plans[0].size
        if committed:
            for plan in plans:
                for micro, indices in zip(plan.micro_batches, batch_indices(plan, order)):
                    used[position.epoch].extend(indices if micro else ())
            position = plans[0].after
        assert cycle < 100_000, "the epoch never ended"
    return used


def exactly_once(length, used):
    return Counter(used) == Counter(range(length))


@pytest.mark.parametrize(
    ("length", "micro", "accumulation", "attempts"),
    [
        # 4 -> 3 -> 1 -> 4 at arbitrary steps, each change after a step that was lost (retried)
        (101, 2, 2, [(4, True), (4, True), (4, False), (3, True), (3, False), (1, True), (1, True),
                     (1, False), (4, True)]),
        (97, 3, 1, [(4, True), (3, True), (3, True), (1, False), (1, True), (4, False), (4, True)]),
        (64, 4, 2, [(4, True)]),  # a constant world that divides the epoch
        (5, 4, 2, [(4, True), (3, False)]),  # one short step
        (3, 1, 1, [(4, True)]),  # fewer samples than ranks
        (50, 1, 3, [(1, True), (2, True), (3, False), (5, True), (7, True)]),
        (1, 1, 1, [(8, False), (8, True)]),
    ],
)
def test_any_sequence_of_worlds_and_retries_uses_every_sample_of_the_epoch_once(length, micro, accumulation, attempts):
    [used] = run_epochs(length, attempts, Batching(micro, accumulation=accumulation))
    assert exactly_once(length, used)


def test_random_sequences_of_worlds_and_retries_use_every_sample_once_in_every_epoch():
    rng = random.Random(37)
    for _ in range(300):
        length, micro = rng.randint(1, 150), rng.randint(1, 5)
        attempts = [(rng.randint(1, 6), rng.random() < 0.8) for _ in range(rng.randint(1, 12))]
        attempts.append((rng.randint(1, 6), True))
        batching = Batching(micro, accumulation=rng.randint(1, 4))
        for used in run_epochs(length, attempts, batching, seed=rng.randint(0, 9), epochs=2):
            assert exactly_once(length, used), (length, micro, attempts)


def test_a_constant_global_batch_uses_every_sample_once_across_worlds_that_divide_it():
    [used] = run_epochs(1000, [(4, True), (2, True), (1, False), (8, True)], Batching(2, global_batch=64))
    assert exactly_once(1000, used)


def test_epochs_roll_over_into_a_new_shuffle_that_is_again_used_once():
    first, second = run_epochs(30, [(4, True), (3, True)], Batching(2, accumulation=2), seed=5, epochs=2)
    assert exactly_once(30, first) and exactly_once(30, second)
    assert first != second


# -- the global order ----------------------------------------------------------------------------

def test_the_order_is_a_permutation_drawn_from_the_seed_and_the_epoch():
    orders = {(seed, epoch): list(epoch_order(200, seed, epoch, shuffle=True)) for seed in (0, 1) for epoch in (0, 1)}
    assert all(sorted(order) == list(range(200)) for order in orders.values())
    assert len({tuple(order) for order in orders.values()}) == 4
    assert list(epoch_order(200, 1, 0, shuffle=True)) == orders[(1, 0)]  # the same on every rank


def test_the_order_is_the_same_in_every_process_and_release():
    # a job's ranks must agree on it; a new release that changed it would mix two orders in one epoch
    assert list(epoch_order(10, seed=0, epoch=0, shuffle=True)) == [6, 0, 7, 2, 1, 9, 5, 3, 8, 4]


def test_without_shuffling_the_order_is_the_datasets():
    assert epoch_order(5, seed=3, epoch=2, shuffle=False) == range(5)


# -- the position and the batching ---------------------------------------------------------------

def test_a_position_goes_through_its_dict_and_json_unchanged():
    position = DataPosition(epoch=4, consumed=123, seed=-9)
    assert position.state_dict() == {"epoch": 4, "consumed": 123, "seed": -9}
    assert DataPosition.from_state_dict(json.loads(json.dumps(position.state_dict()))) == position


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"epoch": 1, "consumed": 2}, "not 'consumed', 'epoch'"),
        ({"epoch": 1, "consumed": 2, "seed": 0, "extra": 1}, "not 'consumed', 'epoch', 'extra', 'seed'"),
        ({}, "not no key"),
        ([1, 2, 3], "not a list"),
        ({"epoch": -1, "consumed": 0, "seed": 0}, r"The epoch \(-1\) must be at least 0"),
        ({"epoch": 0, "consumed": 2.0, "seed": 0}, r"The count of samples consumed \(2.0\) must be an integer"),
        ({"epoch": True, "consumed": 0, "seed": 0}, r"The epoch \(True\) must be an integer"),
        ({"epoch": 0, "consumed": 0, "seed": "7"}, r"The seed \('7'\) must be an integer"),
        ({"epoch": 0, "consumed": 0, "seed": -2**63 - 1}, r"The seed must be in the int64 range"),
        ({"epoch": 2**63, "consumed": 0, "seed": 0}, r"The epoch must be in the int64 range"),
        ({"epoch": 0, "consumed": -10**5000, "seed": 0}, r"The count of samples consumed must be in the int64 range"),
        ({"epoch": 0, "consumed": 0, "seed": "x" * 1000}, r"The seed \('x{39}\) must be an integer"),
    ],
)
def test_a_bad_position_dict_is_refused_in_one_line(state, message):
    with pytest.raises(DataPlanError, match=message) as raised:
        DataPosition.from_state_dict(state)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("global_batch", "world", "micro", "accumulation"),
    [(64, 4, 2, 8), (64, 1, 64, 1), (96, 3, 4, 8), (12, 6, 2, 1)],
)
def test_a_global_batch_gives_the_accumulation_of_each_world(global_batch, world, micro, accumulation):
    assert accumulation_for(global_batch, world, micro) == accumulation
    assert Batching(micro, global_batch=global_batch).accumulation_in(world) == accumulation


def test_a_global_batch_the_world_does_not_divide_is_refused_in_one_line():
    with pytest.raises(DataPlanError, match=r"^The global batch \(64\) is not a multiple of world size x "
                                            r"micro-batch \(3 x 2 = 6\): choose") as raised:
        Batching(2, global_batch=64).accumulation_in(3)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("kwargs", "world", "accumulation"),
    [({}, 5, 1), ({"accumulation": 3}, 5, 3), ({"accumulation": 3}, 1, 3)],
)
def test_a_fixed_accumulation_does_not_follow_the_world(kwargs, world, accumulation):
    assert Batching(4, **kwargs).accumulation_in(world) == accumulation


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"micro_batch": 0}, r"The micro-batch size \(0\) must be at least 1"),
        ({"micro_batch": 2, "accumulation": 0}, r"The accumulation \(0\) must be at least 1"),
        ({"micro_batch": 2, "accumulation": 2, "global_batch": 8}, "not both"),
        ({"micro_batch": 3, "global_batch": 8}, r"The global batch \(8\) is not a multiple of the micro-batch size \(3\)"),
        ({"micro_batch": 2.0}, "must be an integer"),
    ],
)
def test_bad_batching_is_refused_in_one_line(kwargs, message):
    with pytest.raises(DataPlanError, match=message):
        Batching(**kwargs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((DataPosition(0, 0), 0, 0, 1, 1, 1), r"The dataset length \(0\) must be at least 1"),
        ((DataPosition(0, 0), 10, 4, 4, 1, 1), r"The rank \(4\) must be an integer in \[0, 4\)"),
        ((DataPosition(0, 0), 10, -1, 4, 1, 1), r"The rank \(-1\)"),
        ((DataPosition(0, 0), 10, 0, 0, 1, 1), r"The world size \(0\) must be at least 1"),
        ((DataPosition(0, 0), 10, 0, 1, 0, 1), r"The micro-batch size \(0\)"),
        ((DataPosition(0, 0), 10, 0, 1, 1, 0), r"The accumulation \(0\)"),
        ((DataPosition(2, 10), 10, 0, 1, 1, 1),
         r"The data position \(epoch 2, 10 samples consumed\) is past the end of the dataset \(10 samples\)"),
    ],
)
def test_a_step_that_cannot_be_planned_is_refused_in_one_line(args, message):
    with pytest.raises(DataPlanError, match=message) as raised:
        plan_step(*args)
    assert isinstance(raised.value, LiveRecoveryError) and isinstance(raised.value, ValueError)


def test_a_plan_is_a_frozen_value():
    plan = plan_step(DataPosition(0, 0), 10, 0, 1, 2, 1)
    assert isinstance(plan, StepPlan) and plan == plan_step(DataPosition(0, 0), 10, 0, 1, 2, 1)
    with pytest.raises(AttributeError):
        plan.size = 3


def test_the_data_plan_imports_without_torch():
    code = "import sys, elastic.worker.data_plan; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": REPO})
