"""HSDP under live recovery: FSDP2 shards a replica inside a node, replicas span the nodes.

A node's local ranks hold one replica of the model, sharded by FSDP2 (``fully_shard``) over
the *shard group*: a gloo group of those ranks, formed once by :func:`form_shard_group` and
fixed for the life of the replica. The replicate dimension is live: with
``LiveOptions(hsdp=True)`` a rank's live group is the ranks holding its shard index (its
local rank) on every node (:func:`elastic.worker.rounds.replica_round`), re-formed each round
and generation and healed per shard index, like the DDP group. So:

* :func:`average_gradients`, after backward, averages this rank's gradient shard over the
  ranks with its shard index (one all-reduce of the shard on the live group);
* :class:`ShardState` and :class:`OptimizerShardState` make a heal send a rank's own shard
  only (the DTensors' local tensors, parameters and optimizer state): a healing rank receives
  from the live rank with its shard index, every shard index at once, in its own group.

A rank whose shard partner dies cannot all-gather: its FSDP collective fails, the program
exits non-zero, and the agent replaces it; the replica's new workers form a new shard group
(the next generation of the node's shard groups, :func:`form_shard_group`) and heal. The
other replicas train on without them. A node's workers find each other through a file store
in the system's temporary directory named after the run, the host and their parent (the
node's agent): workers must be the agent's children (not forked from templates).
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Mapping

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from elastic.worker.errors import LiveRecoveryError, WorkerEnvError

if TYPE_CHECKING:
    from elastic.worker.live import LiveTraining

__all__ = ["OptimizerShardState", "ShardGroup", "ShardState", "average_gradients", "form_shard_group", "shard_checksum"]


@dataclass(frozen=True)
class ShardGroup:
    """A replica's shard group: its gloo group, the 1-D mesh ``fully_shard`` takes, this rank's
    shard index among ``size``, and which of the node's shard groups it is (``generation``)."""

    group: dist.ProcessGroup
    mesh: DeviceMesh
    index: int
    size: int
    generation: int


def _node_store_path(environ: Mapping[str, str]) -> str:
    run_id = environ.get("TORCHELASTIC_RUN_ID") or "none"
    key = hashlib.sha256(f"{run_id}/{socket.gethostname()}/{os.getppid()}".encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"elastic-hsdp-{key}")


def form_shard_group(environ: Mapping[str, str] | None = None, timeout: float = 60.0) -> ShardGroup:
    """Form this node's shard group of ``LOCAL_WORLD_SIZE`` ranks, this rank at ``LOCAL_RANK``.

    The node's workers count their arrivals in a file store; each ``LOCAL_WORLD_SIZE``
    arrivals form one generation, so a replica's replacements form a new group, not the
    broken one. Call it before :class:`~elastic.worker.live.LiveTraining` starts.

    Raises:
        WorkerEnvError: ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` are missing or bad.
        LiveRecoveryError: the partners did not arrive within ``timeout`` seconds, or this
            torch's private API for building a group changed.
    """
    environ = os.environ if environ is None else environ
    try:
        index, size = int(environ["LOCAL_RANK"]), int(environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError) as error:
        raise WorkerEnvError(f"HSDP needs LOCAL_RANK and LOCAL_WORLD_SIZE in the environment ({error}).") from None
    if not 0 <= index < size:
        raise WorkerEnvError(f"LOCAL_RANK ({index}) must be in [0, LOCAL_WORLD_SIZE={size}).")
    try:
        store = dist.FileStore(_node_store_path(environ), -1)
        store.set_timeout(timedelta(seconds=timeout))
        generation = (store.add("arrivals", 1) - 1) // size
        name = f"elastic-hsdp-shard-{os.getppid()}-{generation}"
        group = _gloo_group(dist.PrefixStore(f"generation-{generation}", store), index, size, name, timeout)
    except (RuntimeError, dist.DistStoreError) as error:
        raise LiveRecoveryError(f"local rank {index}: the shard group of {size} did not form: {error}") from error
    mesh = DeviceMesh("cpu", torch.arange(size), _init_backend=False, _rank=index)
    mesh._dim_group_names = [name]
    mesh._pg_registry[name] = group
    return ShardGroup(group, mesh, index, size, generation)


def _gloo_group(store: Any, rank: int, size: int, name: str, timeout: float) -> dist.ProcessGroup:
    """A gloo group outside the default group's world, registered by ``name`` (DTensor's
    collectives resolve groups by name) with its own ranks as global ranks."""
    try:
        group = dist.ProcessGroup(store, rank, size)
        backend = dist.ProcessGroupGloo(store, rank, size, timedelta(seconds=timeout))
        group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
        group._set_group_name(name)
        world = dist.distributed_c10d._world
        world.pg_group_ranks[group] = {r: r for r in range(size)}
        world.pg_map[group] = ("gloo", store)
        world.pg_names[group] = name
        world.pg_backend_config[group] = "cpu:gloo"
        dist.distributed_c10d._register_process_group(name, group)
    except (AttributeError, TypeError) as error:
        raise LiveRecoveryError(f"cannot build a shard group with torch {torch.__version__}: {error}") from error
    return group


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def average_gradients(live: LiveTraining, module: torch.nn.Module) -> None:
    """Average this rank's gradient shards over its live group (the ranks with its shard
    index, one per replica): one all-reduce of the shards packed together.

    Raises:
        GroupLost: the all-reduce failed, or a newer round abandoned it.
    """
    grads = [_local(p.grad) for p in module.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    live.all_reduce(flat).div_(live.world_size)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()


class ShardState:
    """A sharded module's state as a heal sends it: ``{name: local shard}``; applying one
    copies each received shard into the parameter's or buffer's local tensor.

    Raises (``load_state_dict``):
        LiveRecoveryError: a name is missing, or a shard's shape differs from this rank's.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: _local(value).detach() for name, value in self.module.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        mine = self.module.state_dict()
        if set(state) != set(mine):
            raise LiveRecoveryError(f"the received shards name {sorted(set(state) ^ set(mine))[:4]} differently from this module")
        with torch.no_grad():
            for name, value in mine.items():
                local = _local(value)
                if tuple(state[name].shape) != tuple(local.shape):
                    raise LiveRecoveryError(f"the received shard of {name} is {tuple(state[name].shape)}, "
                                            f"this rank's {tuple(local.shape)}: another shard layout")
                local.copy_(state[name])


class OptimizerShardState:
    """An optimizer of sharded parameters as a heal sends it: its ``state_dict()`` with each
    DTensor replaced by its local tensor; applying one wraps each tensor shaped like its
    parameter's shard back into a DTensor of the parameter's mesh and placements."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        state = self.optimizer.state_dict()
        return {"state": {pid: {key: _local(value) for key, value in entry.items()} for pid, entry in state["state"].items()},
                "param_groups": state["param_groups"]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        entries = {}
        for pid, entry in state["state"].items():
            param = params[int(pid)]
            entries[int(pid)] = {key: _as_param_shard(value, param) for key, value in entry.items()}
        self.optimizer.load_state_dict({"state": entries, "param_groups": state["param_groups"]})


def _as_param_shard(value: Any, param: torch.Tensor) -> Any:
    if isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.shape == param.to_local().shape and value.dim() > 0:
        return DTensor.from_local(value, param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())
    return value


def shard_checksum(module: torch.nn.Module) -> str:
    """A hex digest of this rank's local shards (parameters and buffers, by name)."""
    digest = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(_local(value).detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]
