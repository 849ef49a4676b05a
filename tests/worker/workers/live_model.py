"""The model, data and reference run shared by the live-recovery worker script, its tests and
the benchmark. Deterministic: the data of step ``s`` depends on ``s`` only, and a rank takes
rows ``rank::world_size`` of a global batch of 12 rows, so the averaged gradient is the full
batch's whatever the world size (1, 2, 3, 4, 6 or 12): a run with faults must follow the
undisturbed loss curve up to float rounding."""

from __future__ import annotations

import torch
import torch.nn.functional as F

GLOBAL_BATCH = 12
FEATURES = 16
LR = 0.05


def make_model(seed: int, hidden: int = 32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))


def big_hidden(mb: int) -> int:
    """The hidden width for a state of ~``mb`` MiB of parameters and Adam's two moments (18 floats
    per hidden unit: 16 + 1 weights and a bias, times three); 32 (the small model) for 0."""
    return mb * 1024 * 1024 // (3 * 4 * 18) if mb else 32


def state_nbytes(state) -> int:
    """Bytes of the tensors in a (nested) state dict: what a checkpoint or a heal must move."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_nbytes(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_nbytes(value) for value in state)
    return 0


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, FEATURES, generator=generator)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def shard(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = global_batch(step)
    return x[rank::world_size], y[rank::world_size]


def full_loss(model: torch.nn.Module, step: int) -> float:
    x, y = global_batch(step)
    with torch.no_grad():
        return float(F.mse_loss(model(x), y))


def reference_losses(steps: int) -> list[float]:
    """The undisturbed run: one process, the full batch, rank 0's initialisation."""
    model = make_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        losses.append(full_loss(model, step))
        x, y = global_batch(step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return losses
