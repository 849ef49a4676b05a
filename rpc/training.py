"""One training step of distributed autograd: context, backward, optimizer step.

    opt = rpc.distributed_optimizer(torch.optim.SGD, model.parameter_rrefs(), lr=0.05)
    with rpc.distributed_step() as step:      # a dist_autograd.context()
        loss = loss_fn(model(x), y)
        step.backward(loss)                   # FAST-mode engine, across workers
        step.step(opt)                        # each owner steps its own parameters

or in one call: ``loss = rpc.train_step(lambda: loss_fn(model(x), y), opt)``.

Gradients of a step live in its context (``step.gradients()``), never in ``.grad``; the
context, and its parts on every worker it reached, are released when the ``with`` ends.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

if TYPE_CHECKING:
    import torch
    from torch.distributed.optim import DistributedOptimizer
    from torch.distributed.rpc import RRef

__all__ = ["DistributedStep", "distributed_optimizer", "distributed_step", "parameter_rrefs", "train_step"]


@dataclass(frozen=True)
class DistributedStep:
    """The distributed autograd context of one step, and what can be done in it."""

    context_id: int

    def backward(self, *losses: torch.Tensor, retain_graph: bool = False) -> None:
        """Run the distributed backward pass from one or more local scalar losses.

        Raises:
            ValueError: no loss given, or a loss is not a scalar that requires grad.
            RuntimeError: from torch, when the backward fails on any worker (the message names it).
        """
        import torch.distributed.autograd as dist_autograd

        if not losses:
            raise ValueError("backward() needs at least one loss.")
        for index, loss in enumerate(losses):
            if loss.numel() != 1 or not loss.requires_grad:
                raise ValueError(
                    f"Loss {index} must be a scalar that requires grad (got shape {tuple(loss.shape)}, "
                    f"requires_grad={loss.requires_grad})."
                )
        dist_autograd.backward(self.context_id, list(losses), retain_graph=retain_graph)

    def gradients(self) -> dict[torch.Tensor, torch.Tensor]:
        """This worker's gradients of the step: ``{tensor: gradient}`` (``.grad`` is not used)."""
        import torch.distributed.autograd as dist_autograd

        return dist_autograd.get_gradients(self.context_id)

    def step(self, optimizer: DistributedOptimizer) -> None:
        """Apply ``optimizer`` with this step's gradients, on every parameter's owner."""
        optimizer.step(self.context_id)


@contextlib.contextmanager
def distributed_step() -> Iterator[DistributedStep]:
    """A distributed autograd context for one step (released on every worker at exit)."""
    import torch.distributed.autograd as dist_autograd

    with dist_autograd.context() as context_id:
        yield DistributedStep(context_id)


def train_step(
    compute_losses: Callable[[], torch.Tensor | Sequence[torch.Tensor]],
    optimizer: DistributedOptimizer,
) -> torch.Tensor | list[torch.Tensor]:
    """Forward, backward and optimizer step in one context; returns the detached loss(es).

    ``compute_losses`` runs inside the context and returns one loss or a sequence of them.
    Raises what :meth:`DistributedStep.backward` raises, and what the forward raises.
    """
    with distributed_step() as step:
        result = compute_losses()
        losses = [result] if _is_tensor(result) else list(result)
        step.backward(*losses)
        step.step(optimizer)
    detached = [loss.detach() for loss in losses]
    return detached[0] if _is_tensor(result) else detached


def parameter_rrefs(*modules: torch.nn.Module) -> list[RRef]:
    """RRefs to the parameters of local ``modules``, for a :class:`DistributedOptimizer`."""
    from torch.distributed.rpc import RRef

    return [RRef(parameter) for module in modules for parameter in module.parameters()]


def distributed_optimizer(
    optimizer_class: type[torch.optim.Optimizer], params: Iterable[RRef], **defaults
) -> DistributedOptimizer:
    """A ``DistributedOptimizer`` over parameter RRefs: one local optimizer per owner.

    Raises:
        ValueError: ``params`` is empty (a typo'd model would otherwise train nothing, silently).
    """
    from torch.distributed.optim import DistributedOptimizer

    rrefs = list(params)
    if not rrefs:
        raise ValueError("The distributed optimizer needs at least one parameter RRef.")
    return DistributedOptimizer(optimizer_class, rrefs, **defaults)


def _is_tensor(value: object) -> bool:
    import torch

    return isinstance(value, torch.Tensor)
