"""The training loop's side of live recovery: :class:`LiveTraining`.

A worker started by an agent that publishes rounds (``ELASTIC_ROUND_FD``) keeps its process and
its state across membership changes and peer failures: at each step boundary it re-forms its
group when a newer round is pending or the group was lost, and heals the ranks that are behind
(:mod:`elastic.worker.recoverer`).

A loop iterates :meth:`LiveTraining.run`, whose ``for`` body runs once per committed step
(:mod:`elastic.worker.steps`); a heal sends the whole training state, registered objects and
the library's (:mod:`elastic.worker.state`).

:class:`LiveTraining` is the facade a training loop sees; the jobs behind it are the recovery
loop (:class:`~elastic.worker.recoverer.Recoverer`), the steps
(:class:`~elastic.worker.steps.Steps`), the training state
(:class:`~elastic.worker.state.TrainingState`), the commit bookkeeping
(:class:`~elastic.worker.commits.Commits`), the group in use and its collectives
(:class:`~elastic.worker.collectives.GroupInUse`) and the reports
(:class:`~elastic.worker.reporting.Reporter`), built together by
:func:`~elastic.worker.assembly.assemble`; its start and close are
:class:`~elastic.worker.lifecycle.Lifecycle`'s.
"""

from __future__ import annotations

import collections
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import torch
import torch.distributed as dist

from elastic.worker.assembly import assemble
from elastic.worker.lifecycle import Lifecycle
from elastic.worker.options import LiveOptions
from elastic.worker.reporting import Recovery
from elastic.worker.rounds import Round
from elastic.worker.state import Stateful
from elastic.worker.steps import CommittedStep, StepAttempt, Steps, StepScope

if TYPE_CHECKING:
    from elastic.worker.data import ElasticLoader

__all__ = ["LiveTraining"]


class LiveTraining:
    """Live recovery for one worker process.

    Args:
        state_dict, load_state_dict: the program's own pair (returns the training state to send
            to a rank that is behind: tensors, numbers, strings, lists, tuples, dicts, see
            :mod:`elastic.worker.codec`; applies one received). Or instead:
        state: name → object whose ``state_dict()``/``load_state_dict()`` a heal sends and
            applies (model, optimizer, LR scheduler, GradScaler, an object of your own).
        on_reform: called with this object after every group formed and healed (to rebuild
            what depends on the rank or world size: a DDP on :attr:`group`, a data sampler).
        options: see :class:`LiveOptions`.
        environ: the worker environment (default ``os.environ``); a mutable one is updated
            with each round's ranks (:func:`elastic.worker.rounds.export_round`).

    Raises (on construction):
        WorkerEnvError: the environment lacks a variable or holds a bad one.
        TrainingStateError: the state is given both ways or neither, or an object lacks a method.
    """

    def __init__(
        self,
        state_dict: Callable[[], Any] | None = None,
        load_state_dict: Callable[[Any], None] | None = None,
        *,
        state: Mapping[str, Stateful] | None = None,
        on_reform: Callable[[LiveTraining], None] | None = None,
        options: LiveOptions | None = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options or LiveOptions()
        reformed = None if on_reform is None else lambda: on_reform(self)
        self._parts = assemble(os.environ if environ is None else environ, state, state_dict, load_state_dict,
                               self.options, reformed, clock)
        self._lifecycle = Lifecycle(self._parts)
        self._steps = Steps(self, self._parts.recoverer, self._parts.training, self._lifecycle.is_open)
        self.control = self._parts.control
        """For a layer over the loop (HSDP's shard group): :mod:`elastic.worker.control`."""

    # -- what the loop reads ------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Steps committed so far (by every rank of the group, after a heal)."""
        return self._parts.commits.step

    @property
    def rank(self) -> int:
        """This worker's rank in the group in use (the round's rank, or its index among the
        ranks that formed the group while others join later)."""
        return self._parts.recoverer.rank

    @property
    def world_size(self) -> int:
        """The group in use's size: the round's, or fewer while ranks join later."""
        return self._parts.recoverer.world_size

    @property
    def local_rank(self) -> int:
        return self._parts.recoverer.round.local_rank

    @property
    def round(self) -> Round:
        """The round in use (or being formed)."""
        return self._parts.recoverer.round

    @property
    def group(self) -> dist.ProcessGroup:
        """The current default process group; it changes with every round.

        Raises:
            LiveRecoveryError: no group is formed (before :meth:`start`, or after :meth:`close`).
        """
        return self._parts.recoverer.in_use.require().group

    @property
    def recoveries(self) -> collections.deque[Recovery]:
        """The last groups this worker formed, oldest first."""
        return self._parts.reporter.recoveries

    @property
    def abandoned_works(self) -> int:
        """Collectives of abandoned groups still running (hung on a frozen peer); each ends by
        the collective timeout, and its group's threads and sockets with it."""
        return self._parts.recoverer.in_use.abandoned_works()

    @property
    def new_round_pending(self) -> bool:
        """Whether a newer round is waiting to be formed at the next step boundary (cheap)."""
        return self._parts.recoverer.mailbox.pending is not None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> LiveTraining:
        """Form the first round's group (from the environment) and heal; returns ``self``.

        Raises:
            UnsupportedBackendError: the backend is NCCL under a live agent and not opted in,
                or cannot run here (:mod:`elastic.worker.backend`); nothing was formed.
            StateTransferError: ``state_dict()`` holds a value that cannot be sent.
            RecoveryFailed: the first round could not be formed and no newer one came.
        """
        self.options = self._lifecycle.open(self.options)
        self._parts.recoverer.start()
        return self

    def close(self) -> None:
        """Leave the group, stop watching the pipe, and wait (bounded) for abandoned collectives."""
        self._lifecycle.close()

    def __enter__(self) -> LiveTraining:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the steps ----------------------------------------------------------------------------
    def run(self, fn: Callable[[StepAttempt], Any], data: ElasticLoader | None = None,
            until: int | None = None) -> Iterator[CommittedStep]:
        """Yield each committed step until ``until`` are; ``fn(attempt)`` runs each attempt
        (:mod:`elastic.worker.steps`). Raises ``RecoveryFailed``, and what ``fn`` raised but a loss."""
        return self._steps.run(fn, data, until)

    def train_step(self) -> StepScope:
        """A context manager around one step's body (:class:`~elastic.worker.steps.StepScope`);
        code after the block runs for attempts not committed too. Prefer :meth:`run`."""
        return self._steps.scope()

    def state_dict(self) -> dict[str, Any]:
        """The whole training state, the step included: a whole-job checkpoint (:mod:`elastic.worker.state`)."""
        return self._parts.whole_state()

    def load_state_dict(self, state: Any) -> None:
        """Restore a checkpoint of :meth:`state_dict`, before :meth:`start`; ranks that did not
        load it receive it in the first heal. Raises ``StateTransferError``, ``LiveRecoveryError``."""
        self._lifecycle.restore(state)

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """All-reduce ``tensor`` in place over the current group; returns it.

        Raises:
            GroupLost: the collective failed, or a newer round abandoned it.
        """
        return self._parts.recoverer.in_use.all_reduce(tensor, op)

    def ddp(self, module: torch.nn.Module, **kwargs: Any) -> torch.nn.parallel.DistributedDataParallel:
        """A DDP of ``module`` whose gradients are averaged over the live group; it survives
        every re-forming (see :func:`elastic.worker.ddp.live_ddp`)."""
        from elastic.worker.ddp import live_ddp

        return live_ddp(self._parts.recoverer.in_use, module, **kwargs)

