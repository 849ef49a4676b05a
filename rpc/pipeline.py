"""Split an ``nn.Sequential`` into consecutive stages on workers and run it as a pipeline.

    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    pipe = rpc.Pipeline(model, ["stage0", "stage1"], microbatches=4)
    opt = rpc.distributed_optimizer(torch.optim.SGD, pipe.parameter_rrefs(), lr=0.05)
    with rpc.distributed_step() as step:
        step.backward(loss_fn(pipe(x), y))
        step.step(opt)

Each stage is a :class:`~rpc.remote.RemoteModule` holding its layers (shipped with their
weights). The forward of a micro-batch is a chain of ``rpc.remote`` calls, each stage fetching
its input from the previous stage's RRef on its own; only the last output comes back to the
caller. The calls of all micro-batches are issued before any result is awaited, so stages work
on different micro-batches at once. Inside a distributed autograd context, every hop records
its send/recv pair, and the backward runs across the stages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from rpc.remote import RemoteModule

if TYPE_CHECKING:
    import torch
    from torch.distributed.rpc import RRef, WorkerInfo

__all__ = ["Pipeline", "split_sizes"]


def split_sizes(num_layers: int, num_stages: int, balance: Sequence[int] | None = None) -> list[int]:
    """Layers per stage: ``balance`` if given (validated), else as even as possible, front-loaded.

    Raises:
        ValueError: fewer layers than stages, or a ``balance`` that does not add up to the layers
            or has a stage without layers.
    """
    if num_stages < 1:
        raise ValueError(f"A pipeline needs at least one stage (got {num_stages}).")
    if balance is not None:
        sizes = list(balance)
        if len(sizes) != num_stages or any(size < 1 for size in sizes) or sum(sizes) != num_layers:
            raise ValueError(
                f"The balance {sizes} must give each of the {num_stages} stages at least one layer and add "
                f"up to the model's {num_layers} layers."
            )
        return sizes
    if num_layers < num_stages:
        raise ValueError(f"The model has {num_layers} layers, fewer than the {num_stages} stages.")
    base, extra = divmod(num_layers, num_stages)
    return [base + (1 if index < extra else 0) for index in range(num_stages)]


class Pipeline:
    """``model`` split over ``workers`` (one stage each, in order).

    Args:
        model: the ``nn.Sequential`` to split; its layers are copied to the workers, so the
            local object is no longer trained.
        workers: names or ``WorkerInfo`` of the stage owners, first stage first.
        balance: layers per stage (default: even split).
        microbatches: split each input along dim 0 into this many chunks.

    Raises (on construction): ``TypeError`` if ``model`` is not an ``nn.Sequential``;
    ``ValueError`` for a bad split or micro-batch count.
    """

    def __init__(
        self,
        model: torch.nn.Sequential,
        workers: Sequence[str | WorkerInfo],
        *,
        balance: Sequence[int] | None = None,
        microbatches: int = 1,
    ) -> None:
        import torch

        if not isinstance(model, torch.nn.Sequential):
            raise TypeError(f"Pipeline splits an nn.Sequential, not a {type(model).__name__}.")
        if microbatches < 1:
            raise ValueError(f"The number of micro-batches ({microbatches}) must be at least 1.")
        self.sizes = split_sizes(len(model), len(workers), balance)
        self.microbatches = microbatches
        self.stages: list[RemoteModule] = []
        start = 0
        for worker, size in zip(workers, self.sizes):
            self.stages.append(RemoteModule.from_module(worker, model[start:start + size]))
            start += size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's output for ``x``, computed stage by stage on the workers."""
        import torch

        chunks = x.chunk(self.microbatches) if self.microbatches > 1 else (x,)
        outputs: list[RRef] = []
        for chunk in chunks:
            current: torch.Tensor | RRef = chunk
            for stage in self.stages:
                current = stage.forward_remote(current)
            outputs.append(current)
        results = [output.to_here() for output in outputs]
        return results[0] if len(results) == 1 else torch.cat(results)

    __call__ = forward

    def parameter_rrefs(self) -> list[RRef]:
        """RRefs to every stage's parameters, first stage first."""
        return [rref for stage in self.stages for rref in stage.parameter_rrefs()]

    def modules(self) -> dict[str, RemoteModule]:
        """The stages by name (``stage0``, ``stage1``, ...), e.g. for :func:`rpc.checkpoint.save`."""
        return {f"stage{index}": stage for index, stage in enumerate(self.stages)}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict, keyed as the original ``nn.Sequential``'s.

        (A slice of an ``nn.Sequential`` keeps its layers' names, so the stages' keys already are.)
        """
        merged: dict[str, torch.Tensor] = {}
        for stage in self.stages:
            merged.update(stage.state_dict())
        return merged

    def __repr__(self) -> str:
        stages = ", ".join(f"{stage.owner.name}: {size} layers" for stage, size in zip(self.stages, self.sizes))
        return f"Pipeline({stages}; {self.microbatches} micro-batches)"
