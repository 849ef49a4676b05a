"""ElasticLoader with real DataLoader worker processes: the data follows the world."""

from __future__ import annotations

import json
import os
import socket
import time
from collections import Counter, defaultdict

import pytest
import torch
import torch.utils.data as tud

from elastic.worker.data import ElasticLoader
from elastic.worker.data_plan import DataPosition, batch_indices, epoch_order, plan_step
from elastic.worker.errors import DataPlanError

pytestmark = pytest.mark.needs_torch


class Recorded(tud.Dataset):
    """Sample ``i`` is ``[i, pid]``: the index and the process that loaded it."""

    def __init__(self, length: int, delay: float = 0.0) -> None:
        self.length, self.delay = length, delay

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return torch.tensor([index, os.getpid()])


@pytest.fixture
def loaders():
    """``make(length, ...)``: an ElasticLoader over Recorded(length) with 2 persistent workers,
    closed at teardown (its worker processes stopped)."""
    made = []

    def make(length: int, delay: float = 0.0, **kwargs) -> ElasticLoader:
        kwargs = {"batch_size": 2, "num_workers": 2, "seed": 11, **kwargs}
        if kwargs["num_workers"]:
            kwargs["multiprocessing_context"] = "fork"
        loader = ElasticLoader(Recorded(length, delay), **kwargs)
        made.append(loader)
        return loader

    try:
        yield make
    finally:
        for loader in made:
            loader.close()


def indices(step) -> list[list[int]]:
    return [micro.data[:, 0].tolist() for micro in step]


def pids(step) -> set[int]:
    return {pid for micro in step for pid in micro.data[:, 1].tolist()}


def planned(loader: ElasticLoader, length: int, position: DataPosition, accumulation: int) -> list[list[int]]:
    """What the pure plan says the loader's rank takes at ``position``."""
    plan = plan_step(position, length, loader.rank, loader.world_size, loader.batching.micro_batch, accumulation)
    return [list(micro) for micro in batch_indices(plan, epoch_order(length, position.seed, position.epoch, True))]


def test_a_world_that_shrinks_and_grows_within_epochs_uses_every_index_once(loaders):
    # 99 samples, steps of 16 in world 4: the second epoch's last step has 3 samples for 4 ranks
    length, accumulation = 99, 2
    events = [4, "commit", "commit", "commit", "lost", 3, "lost", "commit", "commit", "lost", 1, "commit", "lost",
              "commit", 4, "commit", "lost", 2, "commit"] + ["commit"] * 6 + [3, "lost", 4] + ["commit"] * 4
    ranks: dict[int, ElasticLoader] = {}
    used: dict[int, list[int]] = defaultdict(list)
    fillers = 0
    for event in events:
        if isinstance(event, int):  # a new world: the ranks above it are gone, new ones join
            for rank in [rank for rank in ranks if rank >= event]:
                ranks.pop(rank).close()
            for rank in range(event):
                if rank not in ranks:
                    ranks[rank] = loaders(length, accumulation=accumulation)
                    ranks[rank].load_state_dict(json.loads(json.dumps(ranks[0].state_dict())))
                ranks[rank].set_world(rank, event)
            continue
        steps = {rank: loader.next_step() for rank, loader in ranks.items()}
        for rank, step in steps.items():
            assert indices(step) == planned(ranks[rank], length, step.plan.position, accumulation)
        assert len({len(step) for step in steps.values()}) == 1
        if event == "commit":
            for rank, step in steps.items():
                used[step.plan.position.epoch].extend(
                    index for micro, batch in zip(step, indices(step)) if micro.samples for index in batch)
                fillers += sum(not micro.samples for micro in step)
                ranks[rank].commit()
    assert sorted(used) == [0, 1] and ranks[0].position == DataPosition(2, 0, seed=11) and fillers == 1
    for epoch in (0, 1):
        assert Counter(used[epoch]) == Counter(range(length)), f"epoch {epoch}"
    assert used[0] != used[1]  # the next epoch is shuffled anew


def test_batches_loaded_before_a_world_or_position_change_are_never_used(loaders):
    length = 400
    loader = loaders(length, delay=0.002, batch_size=4, accumulation=2, prefetch_factor=4)
    loader.set_world(0, 4)
    first = loader.next_step()
    workers = pids(first)
    assert len(workers) == 2 and os.getpid() not in workers
    loader.commit()
    time.sleep(0.2)  # the workers load the next steps of world 4 ahead
    stale = planned(loader, length, loader.position, 2)

    loader.set_world(1, 3)  # the step after a committed one, in a new world
    step = loader.next_step()
    assert indices(step) == planned(loader, length, loader.position, 2) != stale
    time.sleep(0.2)

    loader.set_world(2, 3)  # the same step retried in another world (never committed)
    retried = loader.next_step()
    assert retried.plan.position == step.plan.position
    assert indices(retried) == planned(loader, length, loader.position, 2) != indices(step)
    loader.commit()
    time.sleep(0.2)

    elsewhere = DataPosition(1, 37, seed=5)  # a heal brought another position
    loader.set_position(elsewhere)
    assert indices(loader.next_step()) == planned(loader, length, elsewhere, 2)
    assert pids(loader.next_step()) <= workers  # the same worker processes throughout


def test_a_step_retried_in_the_same_world_is_the_same_step(loaders):
    loader = loaders(50)
    loader.set_world(1, 2)
    step = loader.next_step()
    loader.set_world(1, 2)  # a re-formed group with the same ranks
    loader.set_position(loader.position)
    assert loader.next_step() is step
    loader.commit()
    assert loader.next_step().plan.position == step.plan.after


def test_a_joiner_restored_from_the_dict_takes_the_same_batches_as_a_survivor(loaders):
    survivor = loaders(90, accumulation=3)
    survivor.set_world(0, 2)
    for _ in range(4):
        survivor.next_step()
        survivor.commit()
    joiner = loaders(90, accumulation=3, seed=999)  # its own seed is overruled by the position's
    joiner.load_state_dict(json.loads(json.dumps(survivor.state_dict())))
    for loader in (survivor, joiner):
        loader.set_world(2, 3)
    for _ in range(3):
        mine, theirs = survivor.next_step(), joiner.next_step()
        assert indices(mine) == indices(theirs)
        assert mine.plan == theirs.plan
        survivor.commit()
        joiner.commit()


def test_a_rank_without_samples_at_the_epochs_end_gets_a_filler_of_weight_zero(loaders):
    steps = []
    for rank in range(4):
        loader = loaders(3, batch_size=2, shuffle=False)
        loader.set_world(rank, 4)
        steps.append(loader.next_step())
    assert [indices(step) for step in steps] == [[[0]], [[1]], [[2]], [[0]]]
    assert [(step.micro_batches[0].samples, step.micro_batches[0].weight) for step in steps] == [
        (1, 4 / 3), (1, 4 / 3), (1, 4 / 3), (0, 0.0)]
    assert all(step.plan.ends_epoch for step in steps)


def test_a_constant_global_batch_changes_the_accumulation_with_the_world(loaders):
    loader = loaders(200, global_batch=16, num_workers=0)
    loader.set_world(0, 4)
    assert len(loader.next_step()) == 2 and loader.accumulation == 2
    loader.set_world(0, 2)
    assert len(loader.next_step()) == 4
    with pytest.raises(DataPlanError, match=r"^The global batch \(16\) is not a multiple of world size x "
                                            r"micro-batch \(3 x 2 = 6\)"):
        loader.set_world(0, 3)
    assert loader.world_size == 2  # the world that fits is kept


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sampler": None}, "ElasticLoader deals the samples itself: drop sampler"),
        ({"drop_last": True, "in_order": False}, "drop drop_last, in_order=False"),
        ({"accumulation": 2, "global_batch": 8}, "not both"),
        ({"batch_size": 0}, r"The micro-batch size \(0\)"),
    ],
)
def test_arguments_the_loader_decides_are_refused_in_one_line(kwargs, message):
    with pytest.raises(DataPlanError, match=message):
        ElasticLoader(Recorded(10), **{"batch_size": 2, **kwargs})


def test_a_dataset_it_cannot_deal_by_index_is_refused_in_one_line():
    class Stream(tud.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(DataPlanError, match="needs a map-style dataset"):
        ElasticLoader(Stream(), 2)
    with pytest.raises(DataPlanError, match=r"The dataset length \(0\) must be at least 1"):
        ElasticLoader(Recorded(0), 2)


def test_a_step_needs_a_world_and_a_commit_needs_a_step():
    loader = ElasticLoader(Recorded(10), 2)
    with pytest.raises(DataPlanError, match=r"no world yet: call set_world\(rank, world_size\) first"):
        loader.next_step()
    loader.set_world(0, 1)
    with pytest.raises(DataPlanError, match=r"commit\(\) needs a step"):
        loader.commit()
    with pytest.raises(DataPlanError, match=r"The rank \(2\) must be an integer in \[0, 2\)"):
        loader.set_world(2, 2)
    with pytest.raises(DataPlanError, match=r"past the end of the dataset \(10 samples\)"):
        loader.load_state_dict({"epoch": 0, "consumed": 10, "seed": 0})


class Augmented(tud.Dataset):
    """Sample ``i`` is ``[i, torch draw, random draw, numpy draw]``: an augmentation's randomness."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        import random

        import numpy

        return torch.tensor([index, torch.rand(()).item(), random.random(), numpy.random.rand()], dtype=torch.float64)


def _augmentations(loader: ElasticLoader, steps: int) -> dict[tuple[int, int], tuple[float, ...]]:
    seen = {}
    for _ in range(steps):
        step = loader.next_step()
        for micro in step:
            for row in micro.data[:micro.samples].tolist():
                seen[(step.plan.position.epoch, int(row[0]))] = tuple(row[1:])
        loader.commit()
    return seen


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_samples_augmentation_draws_the_same_whichever_rank_world_or_process_loads_it(num_workers):
    kwargs = {"num_workers": num_workers, "seed": 5, **({"multiprocessing_context": "fork"} if num_workers else {})}
    draws: dict[tuple[int, int], set] = defaultdict(set)
    for world_size in (1, 2, 3):
        for rank in range(world_size):
            with ElasticLoader(Augmented(12), 2, **kwargs) as loader:
                loader.set_world(rank, world_size)
                for key, value in _augmentations(loader, 12 // (2 * world_size) * 2).items():  # two epochs
                    draws[key].add(value)
    assert sorted(draws) == [(epoch, index) for epoch in (0, 1) for index in range(12)]
    assert all(len(values) == 1 for values in draws.values()), draws
    assert len({next(iter(values)) for values in draws.values()}) == 24  # every sample and epoch its own


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loading_a_step_leaves_the_callers_generators_where_they_were(num_workers):
    kwargs = {"num_workers": num_workers, **({"multiprocessing_context": "fork"} if num_workers else {})}
    with ElasticLoader(Augmented(20), 2, **kwargs) as loader:
        loader.set_world(0, 2)
        for world in ((0, 2), (1, 2), (1, 3)):  # a reset draws the workers' base seed
            loader.set_world(*world)
            torch.manual_seed(3)
            loader.next_step()
            after = torch.rand(2).tolist()
            torch.manual_seed(3)
            assert torch.rand(2).tolist() == after
            loader.commit()


class OpenFds(tud.Dataset):
    """Sample ``i`` says whether each of ``fds`` is open in the process that loads it."""

    def __init__(self, fds: list[int]) -> None:
        self.fds = fds

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        def open_(fd: int) -> bool:
            try:
                os.fstat(fd)
                return True
            except OSError:
                return False

        return torch.tensor([open_(fd) for fd in self.fds])


def test_a_forked_loader_worker_keeps_no_tcp_connection_of_its_parent_open():
    # A process group's sockets are open when the loader's workers are forked; a worker that kept
    # them would hold the connections open after its trainer died: the peers would wait out the
    # collective timeout instead of failing at once.
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    read_fd, write_fd = os.pipe()
    loader = ElasticLoader(OpenFds([client.fileno(), read_fd]), batch_size=1, num_workers=1, shuffle=False,
                           multiprocessing_context="fork")
    try:
        loader.set_world(0, 1)
        [micro] = loader.next_step()
        assert micro.data.tolist() == [[False, True]]  # the TCP socket closed, the pipe left alone
        client.close()
        server.settimeout(10)
        assert server.recv(1) == b"", "the peer saw no end of the connection"
    finally:
        loader.close()
        for each in (client, server, listener):
            each.close()
        os.close(read_fd)
        os.close(write_fd)
