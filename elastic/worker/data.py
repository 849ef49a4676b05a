"""A ``DataLoader`` whose samples follow the world: each step's micro-batches come from the
current rank and world size and the data position every rank shares
(:mod:`elastic.worker.data_plan`), so after any shrink or grow every sample of an epoch is
still used exactly once::

    loader = ElasticLoader(dataset, batch_size=32, accumulation=4, num_workers=2)
    loader.set_world(rank, world_size)           # at every group formed
    loader.load_state_dict(state["data"])        # at a heal, with the model's state
    step = loader.next_step()                    # the same step again until committed
    for i, micro in enumerate(step):
        with ddp.no_sync() if i < len(step) - 1 else contextlib.nullcontext():
            x, y = micro.data
            (F.cross_entropy(ddp(x), y) * micro.weight).backward()
    opt.step()
    loader.commit()                              # once the step is committed on every rank

Under ``LiveTraining`` give it to ``live.run(fn, data=loader)``, which does all of this (see
:mod:`elastic.worker.steps`); around ``train_step()`` commit only when the scope says
``committed``: a body can return from a step that is not committed.

The worker processes load ahead (``prefetch_factor`` micro-batches each) on the assumption that
every step is committed in the same world. A new world, a new position, or a retried step in a
new world resets the loader's iterator before its next step: every micro-batch loaded ahead is
dropped and loading starts again from the position. With ``persistent_workers`` (the default
when ``num_workers > 0``) the worker processes are kept: a reset waits for the micro-batches
they were loading and costs no process start. A step retried in the same world is the same
step, already loaded.

Each sample is loaded with the random generators (torch's, ``random``'s, numpy's if imported)
seeded from the data seed, its epoch and its index (:func:`elastic.worker.rng.sample_seed`), in
a worker process or not: an augmentation draws the same for a sample whichever rank, world or
attempt loads it, and a joiner's batches equal its peers'. Loading never moves the caller's
generators.

A worker process forked while a process group is in use would hold copies of its TCP sockets,
and keep them open after this process died: the peers would see no connection close and wait
out the collective timeout instead of failing at once (and then take the failure for a stall,
:mod:`elastic.worker.standing`). So each worker process first closes the TCP sockets it
inherited (:func:`close_inherited_sockets`); a dataset that needs a connection opens its own
in the worker, as it must anyway.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch.utils.data as tud

from elastic.worker.data_plan import Batching, DataPosition, StepPlan, batch_indices, epoch_order, plan_step
from elastic.worker.errors import DataPlanError
from elastic.worker.rng import preserved_rngs, sample_seed, seed_generators

__all__ = ["ElasticBatchSampler", "ElasticLoader", "MicroBatch", "Step", "close_inherited_sockets"]

log = logging.getLogger(__name__)

_OWNED = ("sampler", "batch_sampler", "drop_last")
"""DataLoader arguments the loader decides itself."""


def close_inherited_sockets() -> int:
    """Close this process's TCP sockets (in a process just forked: the parent's copies stay
    open); the number closed. Other descriptors (pipes, Unix sockets: the DataLoader's own
    queues) are left alone."""
    closed = 0
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: nothing to find them by
        return 0
    for fd in fds:
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            probe = socket.socket(fileno=fd)
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        try:
            tcp = probe.family in (socket.AF_INET, socket.AF_INET6) and probe.type == socket.SOCK_STREAM
        finally:
            probe.detach()
        if tcp:
            os.close(fd)
            closed += 1
    return closed


class _WorkerInit:
    """A DataLoader worker's start: close the inherited TCP sockets, then the caller's
    ``worker_init_fn`` (picklable whenever that one is)."""

    def __init__(self, then: Callable[[int], None] | None) -> None:
        self.then = then

    def __call__(self, worker_id: int) -> None:
        close_inherited_sockets()
        if self.then is not None:
            self.then(worker_id)


class _SeededSamples(tud.Dataset):
    """``dataset`` whose items are asked for as ``(index, seed)``: each is loaded with the
    generators seeded from ``seed`` (the sampler's :func:`~elastic.worker.rng.sample_seed`)."""

    def __init__(self, dataset: tud.Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, seed = key
        seed_generators(seed, devices=False)
        return self.dataset[index]


class ElasticBatchSampler(tud.Sampler[list[tuple[int, int]]]):
    """One rank's micro-batches, as lists of ``(dataset index, sample seed)``, for the steps
    from a start on.

    An iteration yields the micro-batches of the step at the start, then of each next step as if
    every step were committed in the same world, across epochs without end. :meth:`restart`
    moves the start of the next iteration. Used from the loader's thread only.
    """

    def __init__(self, length: int, batching: Batching, shuffle: bool) -> None:
        super().__init__()
        self.length = length
        self.batching = batching
        self.shuffle = shuffle
        self._start: tuple[DataPosition, int, int, int] | None = None
        self._orders: dict[tuple[int, int], Sequence[int]] = {}

    def restart(self, position: DataPosition, rank: int, world_size: int, accumulation: int) -> None:
        """Begin the next iteration at ``position``, for rank ``rank`` of ``world_size``."""
        self._start = (position, rank, world_size, accumulation)

    def plan(self, position: DataPosition, rank: int, world_size: int, accumulation: int) -> StepPlan:
        """The step at ``position`` (see :func:`elastic.worker.data_plan.plan_step`)."""
        return plan_step(position, self.length, rank, world_size, self.batching.micro_batch, accumulation)

    def order(self, position: DataPosition) -> Sequence[int]:
        """The global order of ``position``'s epoch; the last two epochs' orders are kept."""
        key = (position.seed, position.epoch)
        if key not in self._orders:
            while len(self._orders) >= 2:
                del self._orders[next(iter(self._orders))]
            self._orders[key] = epoch_order(self.length, position.seed, position.epoch, self.shuffle)
        return self._orders[key]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        if self._start is None:
            raise DataPlanError("The batch sampler has no start: its loader sets one before each iteration.")
        position, rank, world_size, accumulation = self._start
        while True:
            plan = self.plan(position, rank, world_size, accumulation)
            for indices in batch_indices(plan, self.order(position)):
                yield [(index, sample_seed(position.seed, position.epoch, index)) for index in indices]
            position = plan.after


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of a step: ``data`` as the DataLoader collated it, its ``samples`` (0: a
    filler, one sample of weight 0) and the ``weight`` to multiply its mean loss by."""

    data: Any
    samples: int
    weight: float


@dataclass(frozen=True)
class Step:
    """A rank's micro-batches for one step, in order; ``plan`` says where they come from."""

    plan: StepPlan
    micro_batches: tuple[MicroBatch, ...]

    def __iter__(self) -> Iterator[MicroBatch]:
        return iter(self.micro_batches)

    def __len__(self) -> int:
        return len(self.micro_batches)


class ElasticLoader:
    """A ``DataLoader`` over a map-style ``dataset`` whose steps follow the world.

    Args:
        dataset: a map-style dataset (``__len__`` and ``__getitem__``), the same on every rank.
        batch_size: samples per micro-batch.
        accumulation: micro-batches per rank and step (default 1); the global batch is then
            ``world_size * batch_size * accumulation`` and follows the world.
        global_batch: instead of ``accumulation``: keep the global batch constant; each world's
            accumulation is ``global_batch / (world_size * batch_size)``.
        shuffle: a new permutation each epoch (the same on every rank), else the dataset's order.
        seed: the seed of the first position; afterwards the position's seed rules (a joiner
            takes its peers' with the position).
        num_workers, **dataloader_kwargs: the ``DataLoader``'s (``persistent_workers`` is on by
            default with workers; ``worker_init_fn`` runs after the inherited TCP sockets are
            closed); ``sampler``, ``batch_sampler``, ``drop_last`` and
            ``in_order=False`` are refused.

    Raises (on construction):
        DataPlanError: a size is out of range, the dataset is not map-style or is empty, or a
            DataLoader argument the loader decides is given.
    """

    def __init__(self, dataset: tud.Dataset, batch_size: int, *, accumulation: int | None = None,
                 global_batch: int | None = None, shuffle: bool = True, seed: int = 0,
                 num_workers: int = 0, **dataloader_kwargs: Any) -> None:
        self.batching = Batching(batch_size, accumulation, global_batch)
        if isinstance(dataset, tud.IterableDataset) or not hasattr(dataset, "__len__"):
            raise DataPlanError("ElasticLoader deals samples by index: it needs a map-style dataset "
                                "(__len__ and __getitem__), not an iterable one.")
        owned = [name for name in _OWNED if name in dataloader_kwargs]
        if dataloader_kwargs.get("in_order") is False:
            owned.append("in_order=False")
        if owned:
            raise DataPlanError(f"ElasticLoader deals the samples itself: drop {', '.join(owned)}.")
        self._position = DataPosition(0, 0, seed)
        self._sampler = ElasticBatchSampler(len(dataset), self.batching, shuffle)
        self._sampler.plan(self._position, 0, 1, 1)  # refuses an empty dataset now
        dataloader_kwargs.setdefault("persistent_workers", num_workers > 0)
        dataloader_kwargs["worker_init_fn"] = _WorkerInit(dataloader_kwargs.get("worker_init_fn"))
        self._loader = tud.DataLoader(_SeededSamples(dataset), batch_sampler=self._sampler, num_workers=num_workers,
                                      **dataloader_kwargs)
        self._world: tuple[int, int] | None = None
        self._step: Step | None = None
        self._batches: Iterator[Any] | None = None
        self._stream: tuple[int, int, int, DataPosition] | None = None  # its world and next step's start

    @property
    def position(self) -> DataPosition:
        """The position of the next step: where the committed steps have brought the data."""
        return self._position

    @property
    def rank(self) -> int | None:
        return None if self._world is None else self._world[0]

    @property
    def world_size(self) -> int | None:
        return None if self._world is None else self._world[1]

    @property
    def accumulation(self) -> int:
        """Micro-batches per rank in a full step of the current world.

        Raises:
            DataPlanError: no world was set, or it does not divide the global batch.
        """
        return self.batching.accumulation_in(self._require_world()[1])

    def set_world(self, rank: int, world_size: int) -> None:
        """Use rank ``rank`` of ``world_size`` from the next step on (at every group formed).

        Raises:
            DataPlanError: the rank is not in ``[0, world_size)`` or the world does not divide
                the global batch.
        """
        # planning a step checks the rank and the world as every later step will
        self._sampler.plan(DataPosition(0, 0), rank, world_size, self.batching.accumulation_in(world_size))
        if self._world != (rank, world_size):
            self._world = (rank, world_size)
            self._step = None

    def set_position(self, position: DataPosition) -> None:
        """Continue from ``position`` (a heal's): the next step is the one there.

        Raises:
            DataPlanError: the position is past the dataset's end.
        """
        self._sampler.plan(position, 0, 1, 1)
        if position != self._position:
            self._position = position
            self._step = None

    def state_dict(self) -> dict[str, int]:
        """The position as plain numbers, for the heal state or a checkpoint."""
        return self._position.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """:meth:`set_position` from what :meth:`state_dict` gave.

        Raises:
            DataPlanError: ``state`` is not a position, or one past the dataset's end.
        """
        self.set_position(DataPosition.from_state_dict(state))

    def next_step(self) -> Step:
        """This rank's micro-batches for the step at the position, in the current world.

        Until :meth:`commit` it returns the same step, unless the world or the position changed
        in between: then the step there, for the new world, without any micro-batch loaded before.

        Raises:
            DataPlanError: no world was set, or it does not divide the global batch.
            Whatever the dataset, the collate function or a worker process raised.
        """
        if self._step is not None:
            return self._step
        rank, world_size = self._require_world()
        accumulation = self.batching.accumulation_in(world_size)
        plan = self._sampler.plan(self._position, rank, world_size, accumulation)
        restart = self._batches is None or self._stream != (rank, world_size, accumulation, self._position)
        # a new iterator draws its workers' base seed from torch's generator; samples loaded here are seeded
        with preserved_rngs() if restart or self._loader.num_workers == 0 else nullcontext():
            if restart:
                self._restart(rank, world_size, accumulation)
            batches = self._batches
            self._batches = None  # a step left half-read by an error restarts the stream
            data = [next(batches) for _ in plan.micro_batches]
        self._batches, self._stream = batches, (rank, world_size, accumulation, plan.after)
        micro_batches = tuple(map(MicroBatch, data, plan.samples, plan.weights))
        self._step = Step(plan, micro_batches)
        return self._step

    def commit(self) -> None:
        """Move the position past the step :meth:`next_step` gave (every rank does the same).

        Raises:
            DataPlanError: no step was taken since the last commit, or the world or position
                changed since it was (the step taken before is dropped).
        """
        if self._step is None:
            raise DataPlanError("commit() needs a step: call next_step() first; a step is committed once, "
                                "and a new world or position drops the step taken before.")
        self._position, self._step = self._step.plan.after, None

    def close(self) -> None:
        """Stop the worker processes (the loader cannot be used after)."""
        self._batches, self._step = None, None
        iterator, self._loader._iterator = self._loader._iterator, None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def __enter__(self) -> ElasticLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _require_world(self) -> tuple[int, int]:
        if self._world is None:
            raise DataPlanError("The loader has no world yet: call set_world(rank, world_size) first.")
        return self._world

    def _restart(self, rank: int, world_size: int, accumulation: int) -> None:
        """Drop whatever was loaded ahead and load from the position for this world."""
        log.debug("data: rank %s of %s loads from epoch %s, sample %s", rank, world_size,
                  self._position.epoch, self._position.consumed)
        self._sampler.restart(self._position, rank, world_size, accumulation)
        self._batches = iter(self._loader)  # persistent workers: a reset of the same processes
