"""Live recovery in the worker: keep the process and its state across membership changes.

Opt-in and torch-only in the worker. The agent starts each worker with a read-only pipe
(``ELASTIC_ROUND_FD``) and writes one JSON line per new round (:mod:`elastic.worker.rounds`);
:class:`LiveTraining` re-forms the default process group under the new round at a step
boundary, or when a collective fails, and heals ranks that are behind from a live peer::

    import torch, torch.nn.functional as F
    from elastic.worker import LiveTraining

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def state_dict():
        return {"model": model.state_dict(), "opt": opt.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])

    with LiveTraining(state_dict, load_state_dict) as live:
        ddp = live.ddp(model)              # one DDP for every group to come
        while live.step < 1000:
            with live.train_step():        # re-forms and heals here when needed
                x, y = batch(live.step, live.rank, live.world_size)
                opt.zero_grad()
                F.mse_loss(ddp(x), y).backward()
                opt.step()                 # last: a step that fails before it runs again

The public API is what ``__all__`` lists: :class:`LiveTraining` and :class:`LiveOptions`; the
values ``LiveTraining`` hands out (:class:`Round` for ``live.round``, :class:`Recovery` and its
:class:`Cause` for ``live.recoveries``); and the errors a training loop may catch:
:class:`LiveRecoveryError` (the base), :class:`LiveOptionsError` and :class:`WorkerEnvError`
(on construction), :class:`StateTransferError`, :class:`GroupLost` (recoverable; ``train_step``
swallows it) and :class:`RecoveryFailed` (terminal) with :class:`FailingRoundsError`. The
modules of this package are internal: the agent imports the pipes' codec from
:mod:`elastic.worker.rounds`.

Importing this package does not import torch; ``LiveTraining``, ``Recovery`` and ``Cause`` load
it on first use.
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
    UnsupportedBackendError,
    WorkerEnvError,
)
from elastic.worker.options import LiveOptions
from elastic.worker.rounds import Round

if TYPE_CHECKING:
    from elastic.worker.live import LiveTraining
    from elastic.worker.reporting import Cause, Recovery

__all__ = [
    "Cause",
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
    "UnsupportedBackendError",
    "WorkerEnvError",
]

_LAZY = {"LiveTraining": "elastic.worker.live", "Cause": "elastic.worker.reporting", "Recovery": "elastic.worker.reporting"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'elastic.worker' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
