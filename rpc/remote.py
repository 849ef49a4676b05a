"""A module that lives on another worker: built there, run there, its parameters as RRefs.

    layer = rpc.RemoteModule("ps0", torch.nn.Linear, 16, 4)   # built on worker ps0
    out = layer(x)                                            # forward on ps0 (rpc_sync)
    opt = rpc.distributed_optimizer(torch.optim.SGD, layer.parameter_rrefs(), lr=0.1)

A thin alternative to ``torch.distributed.nn.RemoteModule``, which generates TorchScript
interfaces at construction: here the factory (a class or function importable on the owner, as
every RPC function must be) is called on the owner and the result is held by an ``OwnerRRef``.
Inputs may be tensors or RRefs (fetched on the owner with ``to_here``), so outputs chain from
worker to worker without passing through the caller (:mod:`rpc.pipeline`).

Errors raised on the owner by the factory or by ``forward`` reach the caller as torch raises
them: the same exception type, the owner's name and the remote traceback in the message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch
    from torch.distributed.rpc import RRef, WorkerInfo
    from torch.futures import Future

__all__ = ["RemoteModule"]


class RemoteModule:
    """A module on ``owner``, called like a local one.

    Args:
        owner: the worker's name or ``WorkerInfo`` (may be this worker).
        module_factory: called on the owner as ``module_factory(*args, **kwargs)``; must return
            an ``nn.Module``.

    Raises (on construction): whatever the factory raised on the owner (remote traceback in the
    message), ``TypeError`` if it returned something else than a module.
    """

    def __init__(self, owner: str | WorkerInfo, module_factory: Callable[..., torch.nn.Module], *args, **kwargs):
        import torch.distributed.rpc as trpc

        info = trpc.get_worker_info(owner) if isinstance(owner, str) else owner
        self._attach(trpc.remote(info, _construct, args=(module_factory, args, kwargs)))

    @classmethod
    def from_module(cls, owner: str | WorkerInfo, module: torch.nn.Module) -> RemoteModule:
        """Ship ``module`` (with its current weights) to ``owner`` and hold it there."""
        import torch.distributed.rpc as trpc

        info = trpc.get_worker_info(owner) if isinstance(owner, str) else owner
        remote = cls.__new__(cls)
        remote._attach(trpc.remote(info, _construct, args=(_identity, (module,), {})))
        return remote

    @classmethod
    def from_rref(cls, module_rref: RRef) -> RemoteModule:
        """Wrap an RRef to a module that already exists on its owner."""
        remote = cls.__new__(cls)
        remote._attach(module_rref)
        return remote

    def _attach(self, module_rref: RRef) -> None:
        import torch.distributed.rpc as trpc

        self.module_rref = module_rref
        self.owner: WorkerInfo = module_rref.owner()
        # Surface a failed construction now, with its remote traceback, not at the first forward.
        self._summary: str = trpc.rpc_sync(self.owner, _summary, (module_rref,))

    # -- running it -----------------------------------------------------------------------------
    def forward(self, *args, **kwargs) -> Any:
        """``module(*args, **kwargs)`` on the owner; RRef arguments are fetched there first."""
        import torch.distributed.rpc as trpc

        return trpc.rpc_sync(self.owner, _forward, (self.module_rref, args, kwargs))

    __call__ = forward

    def forward_async(self, *args, **kwargs) -> Future:
        """Like :meth:`forward`, returning a future."""
        import torch.distributed.rpc as trpc

        return trpc.rpc_async(self.owner, _forward, (self.module_rref, args, kwargs))

    def forward_remote(self, *args, **kwargs) -> RRef:
        """Like :meth:`forward`, leaving the output on the owner: returns an RRef to it."""
        import torch.distributed.rpc as trpc

        return trpc.remote(self.owner, _forward, (self.module_rref, args, kwargs))

    # -- its state ------------------------------------------------------------------------------
    def parameter_rrefs(self) -> list[RRef]:
        """RRefs to the module's parameters on the owner (for a ``DistributedOptimizer``)."""
        import torch.distributed.rpc as trpc

        return trpc.rpc_sync(self.owner, _parameter_rrefs, (self.module_rref,))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A copy of the module's state dict, fetched from the owner."""
        import torch.distributed.rpc as trpc

        return trpc.rpc_sync(self.owner, _state_dict, (self.module_rref,))

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load ``state`` into the module on the owner (strict, as ``nn.Module.load_state_dict``)."""
        import torch.distributed.rpc as trpc

        trpc.rpc_sync(self.owner, _load_state_dict, (self.module_rref, state))

    def __repr__(self) -> str:
        return f"RemoteModule(owner={self.owner.name}, {self._summary})"


# -- run on the owner (module level: RPC pickles functions by reference) -----------------------


def _construct(factory: Callable[..., Any], args: tuple, kwargs: dict) -> torch.nn.Module:
    import torch

    module = factory(*args, **kwargs)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"The module factory {factory!r} returned a {type(module).__name__}, not an nn.Module.")
    return module


def _identity(module: torch.nn.Module) -> torch.nn.Module:
    return module


def _summary(module_rref: RRef) -> str:
    module = module_rref.local_value()
    count = sum(parameter.numel() for parameter in module.parameters())
    return f"{type(module).__name__}, {count} parameters"


def _fetch(value: Any) -> Any:
    from torch.distributed.rpc import PyRRef

    return value.to_here() if isinstance(value, PyRRef) else value


def _forward(module_rref: RRef, args: tuple, kwargs: dict) -> Any:
    module = module_rref.local_value()
    return module(*[_fetch(arg) for arg in args], **{key: _fetch(value) for key, value in kwargs.items()})


def _parameter_rrefs(module_rref: RRef) -> list[RRef]:
    from torch.distributed.rpc import RRef

    return [RRef(parameter) for parameter in module_rref.local_value().parameters()]


def _state_dict(module_rref: RRef) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone() for key, value in module_rref.local_value().state_dict().items()}


def _load_state_dict(module_rref: RRef, state: dict[str, torch.Tensor]) -> None:
    module_rref.local_value().load_state_dict(state)
