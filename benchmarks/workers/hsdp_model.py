"""The HSDP benchmark workers' model: ``examples/train_hsdp_live.py``'s (Linear(16, H), ReLU,
Dropout, Linear(H, 1); H = 64 there), sharded with FSDP2 layer by layer as the example does,
its data and the byte count of a rank's local state."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

HIDDEN = 64


def make_sharded(mesh, hidden: int = HIDDEN) -> torch.nn.Module:
    """The example's model, seeded as it is, sharded over ``mesh`` (1-D: FSDP; 2-D: HSDP)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(hidden, 1))
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s micro-batch of 8 at ``step``: y = x . w + 0.5, as the example's data."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(8, 16, generator=generator)
    return x, x @ (torch.arange(16.0) / 16).unsqueeze(1) + 0.5


def _local(value):
    return value.to_local() if isinstance(value, DTensor) else value


def local_nbytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Bytes of this rank's own tensors: its parameter shards and its optimizer state's."""
    total = sum(_local(p).numel() * _local(p).element_size() for p in model.parameters())
    for entry in opt.state.values():
        total += sum(_local(v).numel() * _local(v).element_size() for v in entry.values()
                     if isinstance(v, torch.Tensor) and v.dim() > 0)
    return total
