"""HSDP's pieces in one process (a shard group of one rank, real gloo, real FSDP2): what a heal
sends of a sharded model and its optimizer round-trips through the codec into a fresh replica,
and the shard group outlives a re-forming of the default group."""

from __future__ import annotations

import tempfile

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from elastic.worker import hsdp
from elastic.worker.codec import assemble, decode_header, encode_state
from elastic.worker.errors import WorkerEnvError

pytestmark = pytest.mark.needs_torch


class OneReplica:
    """What ``average_gradients`` reads of a LiveTraining: a group of one."""

    step, world_size = 0, 1

    class round:  # noqa: N801 - the attribute LiveTraining has
        round = 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor)
        return tensor


@pytest.fixture
def shards(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    group = hsdp.form_shard_group({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": tmp_path.name},
                                  timeout=10)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield group
    group.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def _replica(mesh) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train(model, opt, shards, steps: int = 2) -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        hsdp.average_gradients(OneReplica(), model, shards)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # DTensor's collectives on the shard group
        opt.step()


def _through_codec(state):
    encoded = encode_state(state, 4096)
    return assemble(decode_header(encoded.header), list(encoded.chunks))


def test_a_fresh_replica_loaded_with_the_shards_trains_as_the_one_it_healed_from(shards):
    torch.manual_seed(0)
    model, opt = _replica(shards.mesh)
    _train(model, opt, shards)
    torch.manual_seed(7)  # another initialisation: only the heal makes them equal
    fresh, fresh_opt = _replica(shards.mesh)
    hsdp.ShardState(fresh).load_state_dict(_through_codec(hsdp.ShardState(model).state_dict()))
    hsdp.OptimizerShardState(fresh_opt).load_state_dict(_through_codec(hsdp.OptimizerShardState(opt).state_dict()))
    assert hsdp.shard_checksum(fresh) == hsdp.shard_checksum(model)
    _train(model, opt, shards, 1)
    _train(fresh, fresh_opt, shards, 1)
    assert hsdp.shard_checksum(fresh) == hsdp.shard_checksum(model)


def test_the_shard_group_outlives_a_reforming_of_the_default_group(shards):
    model, opt = _replica(shards.mesh)
    _train(model, opt, shards, 1)
    dist.destroy_process_group()  # what every re-forming does
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    shards.register()
    _train(model, opt, shards, 1)


def test_shards_of_another_layout_are_refused(shards):
    model, _ = _replica(shards.mesh)
    state = hsdp.ShardState(model).state_dict()
    state["0.weight"] = torch.zeros(3, 3)
    with pytest.raises(hsdp.LiveRecoveryError, match="another shard layout"):
        hsdp.ShardState(model).load_state_dict(state)


def test_a_shard_group_needs_the_local_ranks_in_one_line():
    with pytest.raises(WorkerEnvError, match="LOCAL_RANK and LOCAL_WORLD_SIZE"):
        hsdp.form_shard_group({})
