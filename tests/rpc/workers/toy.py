"""The small models and data the RPC tests train, distributed and locally, step for step.

Deterministic: the same seed gives the same weights, and ``batch(step)`` the same data, in any
process, so a distributed run can be compared with a local one and a resumed run with an
uninterrupted one.
"""

from __future__ import annotations

import torch
from torch import nn

IN, HIDDEN, OUT = 8, 16, 4
LR = 0.05


def make_model(seed: int = 0) -> nn.Sequential:
    """Five layers (three with parameters), to be split into two pipeline stages."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))


def batch(step: int, size: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randn(size, IN, generator=generator), torch.randn(size, OUT, generator=generator)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def train_locally(steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The reference: the same model trained in one process with torch.optim.SGD."""
    model = make_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = batch(step)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def as_lists(state: dict[str, torch.Tensor]) -> dict[str, list]:
    return {key: value.tolist() for key, value in state.items()}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), (sorted(a), sorted(b))
    return max(float((a[key].double() - b[key].double()).abs().max()) for key in a)
