"""The parameter-server example's model under Hogwild: concurrent trainers share it on the server.

Trainers run forwards on the server while others ask it for ``parameter_rrefs()`` or a
checkpoint, and step the parameters in place between another trainer's forward and backward.
Both were the example's failure "modified by an inplace operation" (about 1 run in 8 here):
the old forward swapped copies into the shared module (``torch.func.functional_call``), and a
trainer that read ``parameters()`` meanwhile got a copy, stepped it, and broke the backward of
the trainer whose forward had made it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

pytestmark = pytest.mark.needs_torch

REPO = Path(__file__).resolve().parents[2]


def load_example():
    spec = importlib.util.spec_from_file_location("rpc_parameter_server", REPO / "examples" / "rpc_parameter_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ParametersWatch(TorchFunctionMode):
    """Records, at every torch call inside a forward, whether the model still holds its parameters."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.expected = [id(parameter) for parameter in model.parameters()]
        self.seen: list[bool] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append([id(parameter) for parameter in self.model.parameters()] == self.expected)
        return func(*args, **(kwargs or {}))


def test_the_forward_never_swaps_the_parameters_another_trainer_may_read():
    model = load_example().make_model()
    watch = ParametersWatch(model)
    with watch:
        model(torch.randn(4, 16))
    assert watch.seen and all(watch.seen)


def test_a_step_between_forward_and_backward_leaves_the_backward_intact_and_the_gradient_reaches_the_parameters():
    model = load_example().make_model()
    loss = model(torch.randn(4, 16)).pow(2).sum()
    with torch.no_grad():
        for parameter in model.parameters():  # another trainer's optimizer step, in place
            parameter.add_(0.01)
    loss.backward()
    assert all(parameter.grad is not None and parameter.grad.abs().sum() > 0 for parameter in model.parameters())
