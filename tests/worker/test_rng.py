"""The seeds a live worker derives (:mod:`elastic.worker.rng`) and what seeding them does."""

from __future__ import annotations

import random

import numpy
import pytest
import torch

from elastic.worker.options import LiveOptions, LiveOptionsError
from elastic.worker.rng import derive_seed, preserved_rngs, sample_seed, seed_generators, step_seed

pytestmark = pytest.mark.needs_torch


def test_a_seed_is_pinned_so_every_process_and_version_derives_the_same():
    assert step_seed(0, 0, 0) == 3064952005205320372
    assert sample_seed(3, 1, 7) == 3098841467429068572


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (step_seed(0, 5, 0), step_seed(0, 5, 1)),       # another rank
        (step_seed(0, 5, 0), step_seed(0, 6, 0)),       # another step
        (step_seed(0, 5, 0), step_seed(1, 5, 0)),       # another seed
        (step_seed(0, 1, 23), step_seed(0, 12, 3)),     # not a concatenation of digits
        (step_seed(0, 5, 0), sample_seed(0, 5, 0)),     # a step is not a sample
        (sample_seed(0, 0, 1), sample_seed(0, 1, 1)),   # another epoch
        (derive_seed(1), derive_seed("1")),             # an int is not a string
    ],
)
def test_seeds_of_different_uses_differ(one, other):
    assert one != other


def test_seeds_are_64_bit_and_take_any_integer():
    for parts in [(), (2**200,), (-(2**70), 0), ("x", -1)]:
        assert 0 <= derive_seed(*parts) < 2**64


def _draws() -> tuple:
    return torch.rand(3).tolist(), random.random(), numpy.random.rand()


def test_seeding_makes_torch_random_and_numpy_draw_the_same_again():
    seed_generators(step_seed(0, 7, 1))
    first = _draws()
    _draws()
    seed_generators(step_seed(0, 7, 1))
    assert _draws() == first
    seed_generators(step_seed(0, 7, 2))
    assert _draws() != first


def test_preserved_rngs_leave_the_generators_where_they_were():
    seed_generators(11)
    with preserved_rngs():
        seed_generators(12)
        _draws()
    after = _draws()
    seed_generators(11)
    assert _draws() == after


@pytest.mark.parametrize("seed", [True, 1.0, "0", 2**64, -(2**63) - 1])
def test_a_seed_that_is_not_an_integer_in_range_is_one_clear_error(seed):
    with pytest.raises(LiveOptionsError, match="seed"):
        LiveOptions(seed=seed)


def test_no_seed_is_allowed():
    assert LiveOptions(seed=None).seed is None and LiveOptions().seed == 0
