"""Distributed autograd over ``torch.distributed.rpc`` for elastic jobs.

    import rpc

    with rpc.start() as session:                     # names f"{role}{role_rank}", fresh per attempt
        layer = rpc.RemoteModule("ps0", torch.nn.Linear, 16, 4)
        opt = rpc.distributed_optimizer(torch.optim.SGD, layer.parameter_rrefs(), lr=0.05)
        loss = rpc.train_step(lambda: layer(x).pow(2).mean(), opt)

Modules, one job each: :mod:`rpc.env` (the worker environment, pure), :mod:`rpc.rendezvous`
(the attempt's init method), :mod:`rpc.bootstrap` (start/stop, SIGTERM, atexit),
:mod:`rpc.signals`, :mod:`rpc.lookup` (workers by role and rank), :mod:`rpc.training`
(context, backward, optimizer), :mod:`rpc.remote` (remote modules), :mod:`rpc.pipeline`,
:mod:`rpc.introspect` (send/recv functions, ids), :mod:`rpc.graph` (the graph as text and DOT),
:mod:`rpc.checkpoint` (per-owner checkpoints across restarts), :mod:`rpc.errors`.

Importing ``rpc`` does not import torch (the launcher side stays torch-free); the names below
are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # bootstrap
    "start": "rpc.bootstrap", "init": "rpc.bootstrap", "shutdown": "rpc.bootstrap",
    "current": "rpc.bootstrap", "is_started": "rpc.bootstrap", "RpcSession": "rpc.bootstrap",
    # environment and names
    "RpcWorkerEnv": "rpc.env", "RpcOptions": "rpc.env", "worker_name": "rpc.env", "parse_worker_name": "rpc.env",
    # lookups
    "worker": "rpc.lookup", "workers": "rpc.lookup", "roles": "rpc.lookup", "worker_infos": "rpc.lookup",
    # training
    "DistributedStep": "rpc.training", "distributed_step": "rpc.training", "train_step": "rpc.training",
    "distributed_optimizer": "rpc.training", "parameter_rrefs": "rpc.training",
    "RemoteModule": "rpc.remote", "Pipeline": "rpc.pipeline",
    # introspection
    "describe_context": "rpc.introspect", "describe_remote_context": "rpc.introspect",
    "describe_all_contexts": "rpc.introspect", "split_id": "rpc.introspect", "ContextInfo": "rpc.introspect",
    "autograd_graph": "rpc.graph", "AutogradGraph": "rpc.graph",
    # errors
    "RpcError": "rpc.errors", "RpcSetupError": "rpc.errors", "WorkerEnvError": "rpc.errors",
    "RpcOptionsError": "rpc.errors", "RpcInitError": "rpc.errors", "RpcNotStartedError": "rpc.errors",
    "RpcShutdownError": "rpc.errors", "WorkerLookupError": "rpc.errors", "IntrospectionError": "rpc.errors",
    "CheckpointError": "rpc.errors",
}  # fmt: skip
_SUBMODULES = {"bootstrap", "checkpoint", "env", "errors", "graph", "introspect", "lookup", "pipeline", "remote",
               "rendezvous", "signals", "training"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"rpc.{name}")
    raise AttributeError(f"module 'rpc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)
