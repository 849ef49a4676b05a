"""Live recovery in the worker: keep the process and its state across membership changes.

Opt-in and torch-only in the worker. The agent starts each worker with a read-only pipe
(``ELASTIC_ROUND_FD``) and writes one JSON line per new round (:mod:`elastic.worker.rounds`);
:class:`LiveTraining` re-forms the default process group under the new round at a step
boundary, or when a collective fails, and heals ranks that are behind from a live peer with
the whole training state::

    import torch, torch.nn.functional as F
    from elastic.worker import ElasticLoader, LiveTraining

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 100)
    loader = ElasticLoader(dataset, batch_size=32)

    def train_step(step):                  # run again when not committed: the optimizer step last
        opt.zero_grad()
        for micro in step.batches:
            x, y = micro.data
            (F.mse_loss(ddp(x), y) * micro.weight).backward()
        opt.step()

    with LiveTraining(state={"model": model, "opt": opt, "sched": sched}) as live:
        ddp = live.ddp(model)              # one DDP for every group to come
        for done in live.run(train_step, data=loader, until=1000):
            sched.step()                   # once per committed step, on every rank

The public API is what ``__all__`` lists: :class:`LiveTraining`, :class:`LiveOptions` and
:class:`ElasticLoader`; the values ``LiveTraining`` hands out (:class:`StepAttempt` and
:class:`CommittedStep` from ``run``, :class:`Round` for ``live.round``, :class:`Recovery` and
its :class:`Cause` for ``live.recoveries``); and the errors a training loop may catch:
:class:`LiveRecoveryError` (the base), :class:`LiveOptionsError`, :class:`TrainingStateError`
and :class:`WorkerEnvError` (on construction), :class:`StateTransferError`, :class:`GroupLost`
(recoverable; ``run`` and ``train_step`` swallow it) and :class:`RecoveryFailed` (terminal) with
:class:`FailingRoundsError`. HSDP with FSDP2 (``LiveOptions(hsdp=True)``) uses the public module
:mod:`elastic.worker.hsdp`. The other modules of this package are internal: the agent imports
the pipes' codec from :mod:`elastic.worker.rounds`.

Importing this package does not import torch; ``LiveTraining``, ``ElasticLoader``,
``StepAttempt``, ``CommittedStep``, ``Recovery`` and ``Cause`` load it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from elastic.worker.errors import (
    FailingRoundsError,
    GroupLost,
    LiveOptionsError,
    LiveRecoveryError,
    RecoveryFailed,
    StateTransferError,
    TrainingStateError,
    UnsupportedBackendError,
    WorkerEnvError,
)
from elastic.worker.options import LiveOptions
from elastic.worker.rounds import Round

if TYPE_CHECKING:
    from elastic.worker.data import ElasticLoader
    from elastic.worker.live import LiveTraining
    from elastic.worker.reporting import Cause, Recovery
    from elastic.worker.steps import CommittedStep, StepAttempt

__all__ = [
    "Cause",
    "CommittedStep",
    "ElasticLoader",
    "FailingRoundsError",
    "GroupLost",
    "LiveOptions",
    "LiveOptionsError",
    "LiveRecoveryError",
    "LiveTraining",
    "Recovery",
    "RecoveryFailed",
    "Round",
    "StateTransferError",
    "StepAttempt",
    "TrainingStateError",
    "UnsupportedBackendError",
    "WorkerEnvError",
]

_LAZY = {"LiveTraining": "elastic.worker.live", "Cause": "elastic.worker.reporting", "Recovery": "elastic.worker.reporting",
         "ElasticLoader": "elastic.worker.data", "StepAttempt": "elastic.worker.steps", "CommittedStep": "elastic.worker.steps"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'elastic.worker' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
