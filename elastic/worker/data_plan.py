"""Which samples each rank uses in each step, from the world and a position. Pure, no torch.

An epoch is one *global order* of the dataset's indices, the same on every rank: a permutation
drawn from ``(seed, epoch)``, or the identity without shuffling (:func:`epoch_order`). Training
walks it from the front; the *position* (:class:`DataPosition`) is how many samples of the
epoch committed steps have used, summed over every rank. A step takes the next
``world_size * micro_batch * accumulation`` samples of the order, deals them to the ranks as
micro-batches, and once committed moves the position past all of them (:func:`plan_step`). So
the world can change at any step boundary, or a step can be retried in another world, and the
next step simply deals what follows the position among the ranks there are then: every sample
of an epoch is used exactly once whatever the sequence of worlds, and a rank needs nothing
but the position, its rank and the world size (no per-rank history).

The last step of an epoch takes what is left when fewer samples remain than a full step. It
uses the fewest micro-batches per rank that keep each at most ``micro_batch``; its samples
are dealt as evenly as possible (micro-batches differ by at most one sample), and every rank
does the same number of micro-batches, so every rank joins the same all-reduces. When fewer
samples remain than micro-batch slots (fewer than ranks; with micro-batches of 1, a remainder
that the world does not divide) a slot left empty is a *filler*: the step's first sample again,
with weight 0, so its rank runs the step like the others and adds nothing to the gradient.
Nothing is padded, repeated with weight, or dropped.

Each micro-batch carries a *weight*: its samples times the world size over the step's samples.
A loss averaged over the micro-batch, multiplied by it, gives after DDP's mean over ranks the
gradient of the mean over every sample of the step: ``1 / accumulation`` in a full step, the
share of a short one, 0 for a filler.

The global batch is ``world_size * micro_batch * accumulation``, so it follows the world. To
keep it constant give :class:`Batching` a ``global_batch``: the accumulation is then
``global_batch / (world_size * micro_batch)`` in each world, refused in one line in a world that
does not divide it.
"""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from elastic.worker.errors import DataPlanError

__all__ = [
    "Batching",
    "DataPosition",
    "StepPlan",
    "accumulation_for",
    "batch_indices",
    "epoch_order",
    "plan_step",
]


_INT64 = 2**63
"""Every number of a plan or a position is below it in magnitude, as an int64 holds."""


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DataPlanError(f"The {name} ({value!r:.40}) must be an integer.")
    if not -_INT64 <= value < _INT64:
        raise DataPlanError(f"The {name} must be in the int64 range, [-2**63, 2**63).")
    if value < minimum:
        raise DataPlanError(f"The {name} ({value}) must be at least {minimum}.")
    return value


@dataclass(frozen=True)
class DataPosition:
    """Where the data of a training stands: ``consumed`` samples of epoch ``epoch`` are used,
    summed over every rank, in the order drawn from ``seed``.

    Every rank holds the same position; it travels in the heal state as plain numbers
    (:meth:`state_dict`), never pickled. ``consumed`` is below the dataset's length: the step
    that uses an epoch's last sample moves the position to the next epoch's start.

    Raises (on construction):
        DataPlanError: a field is not an integer in the int64 range, or the epoch or the count
            is negative.
    """

    epoch: int = 0
    consumed: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        _count("epoch", self.epoch, 0)
        _count("count of samples consumed", self.consumed, 0)
        _count("seed", self.seed, -_INT64)

    def state_dict(self) -> dict[str, int]:
        """The position as plain numbers: ``{"epoch": ..., "consumed": ..., "seed": ...}``."""
        return {"epoch": self.epoch, "consumed": self.consumed, "seed": self.seed}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> DataPosition:
        """The position :meth:`state_dict` gave.

        Raises:
            DataPlanError: ``state`` is not a mapping of exactly those three integers.
        """
        fields = ("epoch", "consumed", "seed")
        if not isinstance(state, Mapping) or set(state) != set(fields):
            given = (", ".join(sorted(repr(key)[:40] for key in state)[:6]) or "no key"
                     if isinstance(state, Mapping) else f"a {type(state).__name__}")
            raise DataPlanError(f"A data position is a dict of 'consumed', 'epoch' and 'seed', not {given}.")
        return cls(**{name: state[name] for name in fields})


def accumulation_for(global_batch: int, world_size: int, micro_batch: int) -> int:
    """The micro-batches per rank and step that keep a global batch of ``global_batch`` samples.

    Raises:
        DataPlanError: an argument is not a positive integer, or ``world_size * micro_batch``
            does not divide ``global_batch``.
    """
    _count("global batch", global_batch, 1)
    _count("world size", world_size, 1)
    _count("micro-batch size", micro_batch, 1)
    per_pass = world_size * micro_batch
    if global_batch % per_pass:
        raise DataPlanError(
            f"The global batch ({global_batch}) is not a multiple of world size x micro-batch "
            f"({world_size} x {micro_batch} = {per_pass}): choose a global batch that every world "
            f"size the job may have divides, or a fixed accumulation.")
    return global_batch // per_pass


@dataclass(frozen=True)
class Batching:
    """How a step is made of micro-batches: ``micro_batch`` samples each, and either a fixed
    ``accumulation`` (micro-batches per rank and step; the global batch follows the world) or a
    constant ``global_batch`` (the accumulation follows the world). Neither: accumulation 1.

    Raises (on construction):
        DataPlanError: a size is not a positive integer, both ``accumulation`` and
            ``global_batch`` are given, or the micro-batch does not divide the global batch.
    """

    micro_batch: int
    accumulation: int | None = None
    global_batch: int | None = None

    def __post_init__(self) -> None:
        _count("micro-batch size", self.micro_batch, 1)
        if self.accumulation is not None and self.global_batch is not None:
            raise DataPlanError("Give an accumulation or a global batch, not both: "
                                "the global batch decides the accumulation in each world.")
        if self.accumulation is not None:
            _count("accumulation", self.accumulation, 1)
        if self.global_batch is not None:
            _count("global batch", self.global_batch, 1)
            if self.global_batch % self.micro_batch:
                raise DataPlanError(f"The global batch ({self.global_batch}) is not a multiple of "
                                    f"the micro-batch size ({self.micro_batch}).")

    def accumulation_in(self, world_size: int) -> int:
        """Micro-batches per rank in a full step of a world of ``world_size`` ranks.

        Raises:
            DataPlanError: the world is not a positive integer, or does not divide the global batch.
        """
        if self.global_batch is not None:
            return accumulation_for(self.global_batch, world_size, self.micro_batch)
        _count("world size", world_size, 1)
        return 1 if self.accumulation is None else self.accumulation


def epoch_order(length: int, seed: int, epoch: int, shuffle: bool) -> Sequence[int]:
    """The global order of the indices of a dataset of ``length`` samples in epoch ``epoch``.

    A permutation from ``(seed, epoch)`` (Python's Mersenne Twister seeded with a string, so
    the same on every machine and process), or ``range(length)`` without shuffling. It takes
    8 bytes per sample and time linear in ``length``: compute it once per epoch.

    Raises:
        DataPlanError: ``length`` is not positive, or the epoch or seed is not an integer.
    """
    _count("dataset length", length, 1)
    position = DataPosition(epoch, 0, seed)
    if not shuffle:
        return range(length)
    order = array("q", range(length))
    random.Random(f"elastic.worker.data_plan/{position.seed}/{position.epoch}").shuffle(order)
    return order


@dataclass(frozen=True)
class StepPlan:
    """The samples rank ``rank`` of ``world_size`` uses in the step that starts at ``position``.

    Attributes:
        position: where the step starts.
        after: where the next step starts once this one is committed (the next epoch's start
            after an epoch's last step).
        size: the samples the step uses, summed over every rank.
        world_size, rank: the world the step is planned for.
        micro_batches: this rank's micro-batches, each a range of positions in the epoch's
            order; an empty range is a filler (see the module's docstring). Every rank of the
            world has the same number of them.
    """

    position: DataPosition
    after: DataPosition
    size: int
    world_size: int
    rank: int
    micro_batches: tuple[range, ...]

    @property
    def samples(self) -> tuple[int, ...]:
        """The samples of each micro-batch (0: a filler)."""
        return tuple(len(micro) for micro in self.micro_batches)

    @property
    def weights(self) -> tuple[float, ...]:
        """What to multiply each micro-batch's mean loss by (see the module's docstring)."""
        return tuple(len(micro) * self.world_size / self.size for micro in self.micro_batches)

    @property
    def ends_epoch(self) -> bool:
        """Whether this step uses the epoch's last samples."""
        return self.after.epoch != self.position.epoch


def plan_step(position: DataPosition, length: int, rank: int, world_size: int, micro_batch: int,
              accumulation: int) -> StepPlan:
    """The step at ``position`` for rank ``rank`` of ``world_size``, in an epoch of ``length``.

    The step takes the ``world_size * micro_batch * accumulation`` samples that follow the
    position, or what is left of the epoch. With ``a`` the fewest micro-batches per rank that
    hold them, they are cut into ``world_size * a`` consecutive slots whose sizes differ by at
    most one (the larger first), and slot ``i * world_size + r`` is micro-batch ``i`` of rank
    ``r``. Every rank computes the same ``size`` and ``a``: they depend on the position and the
    world only.

    Raises:
        DataPlanError: a size, the rank or the world is out of range, or the position is past
            the dataset's end (it was saved with another dataset).
    """
    _count("dataset length", length, 1)
    _count("world size", world_size, 1)
    _count("micro-batch size", micro_batch, 1)
    _count("accumulation", accumulation, 1)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise DataPlanError(f"The rank ({rank!r}) must be an integer in [0, {world_size}), the world size.")
    if position.consumed >= length:
        raise DataPlanError(
            f"The data position (epoch {position.epoch}, {position.consumed} samples consumed) is past "
            f"the end of the dataset ({length} samples): was it saved with another dataset?")
    size = min(length - position.consumed, world_size * micro_batch * accumulation)
    per_rank = -(-size // (world_size * micro_batch))
    slots = world_size * per_rank
    base, larger = divmod(size, slots)
    micro_batches = []
    for index in range(per_rank):
        slot = index * world_size + rank
        start = position.consumed + slot * base + min(slot, larger)
        micro_batches.append(range(start, start + base + (slot < larger)))
    consumed = position.consumed + size
    after = (DataPosition(position.epoch, consumed, position.seed) if consumed < length
             else DataPosition(position.epoch + 1, 0, position.seed))
    return StepPlan(position, after, size, world_size, rank, tuple(micro_batches))


def batch_indices(plan: StepPlan, order: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The dataset indices of each of the plan's micro-batches, ``order`` being the epoch's
    (:func:`epoch_order`); a filler is the step's first sample, once."""
    filler = (order[plan.position.consumed],)
    return tuple(tuple(order[p] for p in micro) if micro else filler for micro in plan.micro_batches)
