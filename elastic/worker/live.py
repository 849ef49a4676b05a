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
(:class:`~elastic.worker.reporting.Reporter`).
"""

from __future__ import annotations

import atexit
import collections
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import torch
import torch.distributed as dist

from elastic.worker.backend import choose_backend
from elastic.worker.codec import check_state
from elastic.worker.commits import Commits
from elastic.worker.control import GroupControl
from elastic.worker.decisions import Mark
from elastic.worker.environment import read_worker_env
from elastic.worker.errors import LiveRecoveryError
from elastic.worker.options import LiveOptions
from elastic.worker.recoverer import Recoverer, StateHooks
from elastic.worker.reporting import Recovery, Reporter
from elastic.worker.rounds import Round
from elastic.worker.state import Stateful, TrainingState
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
        environ = os.environ if environ is None else environ
        env = read_worker_env(environ)
        self._label = env.label
        self._env, self._environ = env, environ
        self._training = TrainingState(state, state_dict, load_state_dict, self.options.seed)
        self._commits = Commits()
        hooks = StateHooks(lambda: self._training.compose(self._commits.step),
                           lambda received: self._training.apply(received, "the state received in a heal"))
        self._reporter = Reporter(env.ready_fd, env.label)
        reformed = None if on_reform is None else lambda: on_reform(self)
        self._recoverer = Recoverer(env, environ, hooks, self._commits, self._reporter, self.options, reformed, clock)
        self._started = False
        self._closed = False
        self._steps = Steps(self, self._recoverer, self._training, lambda: self._started and not self._closed)
        recoverer = self._recoverer
        self.control = GroupControl(recoverer.mailbox, recoverer.generation_watch, recoverer.in_use)
        """For a layer over the loop (HSDP's shard group): :mod:`elastic.worker.control`."""

    # -- what the loop reads ------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Steps committed so far (by every rank of the group, after a heal)."""
        return self._commits.step

    @property
    def rank(self) -> int:
        """This worker's rank in the group in use (the round's rank, or its index among the
        ranks that formed the group while others join later)."""
        return self._recoverer.rank

    @property
    def world_size(self) -> int:
        """The group in use's size: the round's, or fewer while ranks join later."""
        return self._recoverer.world_size

    @property
    def local_rank(self) -> int:
        return self._recoverer.round.local_rank

    @property
    def round(self) -> Round:
        """The round in use (or being formed)."""
        return self._recoverer.round

    @property
    def group(self) -> dist.ProcessGroup:
        """The current default process group; it changes with every round.

        Raises:
            LiveRecoveryError: no group is formed (before :meth:`start`, or after :meth:`close`).
        """
        return self._recoverer.in_use.require().group

    @property
    def recoveries(self) -> collections.deque[Recovery]:
        """The last groups this worker formed, oldest first."""
        return self._reporter.recoveries

    @property
    def abandoned_works(self) -> int:
        """Collectives of abandoned groups still running (hung on a frozen peer); each ends by
        the collective timeout, and its group's threads and sockets with it."""
        return self._recoverer.in_use.abandoned_works()

    @property
    def new_round_pending(self) -> bool:
        """Whether a newer round is waiting to be formed at the next step boundary (cheap)."""
        return self._recoverer.mailbox.pending is not None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> LiveTraining:
        """Form the first round's group (from the environment) and heal; returns ``self``.

        Raises:
            UnsupportedBackendError: the backend is NCCL under a live agent and not opted in,
                or cannot run here (:mod:`elastic.worker.backend`); nothing was formed.
            StateTransferError: ``state_dict()`` holds a value that cannot be sent.
            RecoveryFailed: the first round could not be formed and no newer one came.
        """
        self.options = _check_start(self._started, self.options, self._environ, self._env.has_pipe, self._label)
        self._recoverer.use_options(self.options)
        check_state(self._training.compose(self.step))
        self._started = True
        atexit.register(self.close)
        self._recoverer.start()
        return self

    def close(self) -> None:
        """Leave the group, stop watching the pipe, and wait (bounded) for abandoned collectives."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._recoverer.close()

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
        return self._training.compose(self.step)

    def load_state_dict(self, state: Any) -> None:
        """Restore a checkpoint of :meth:`state_dict`, before :meth:`start`; ranks that did not
        load it receive it in the first heal. Raises ``StateTransferError``, ``LiveRecoveryError``."""
        if self._started:
            raise LiveRecoveryError(f"{self._label}: load_state_dict() restores a checkpoint before start(); "
                                    "after it, the heals keep the ranks level.")
        step = self._training.apply(state, "the checkpoint")
        self._commits.adopt(Mark(step))  # committed in no round of this run's numbering

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """All-reduce ``tensor`` in place over the current group; returns it.

        Raises:
            GroupLost: the collective failed, or a newer round abandoned it.
        """
        return self._recoverer.in_use.all_reduce(tensor, op)

    def ddp(self, module: torch.nn.Module, **kwargs: Any) -> torch.nn.parallel.DistributedDataParallel:
        """A DDP of ``module`` whose gradients are averaged over the live group; it survives
        every re-forming (see :func:`elastic.worker.ddp.live_ddp`)."""
        from elastic.worker.ddp import live_ddp

        return live_ddp(self._recoverer.in_use, module, **kwargs)


def _check_start(started: bool, options: LiveOptions, environ: Mapping[str, str], live: bool,
                 label: str) -> LiveOptions:
    """The options to form with (the backend chosen, :func:`~elastic.worker.backend.choose_backend`).

    Raises:
        LiveRecoveryError: started already, or the default process group exists.
        UnsupportedBackendError: see :func:`~elastic.worker.backend.choose_backend`.
    """
    if started:
        raise LiveRecoveryError(f"{label}: start() was called twice.")
    options = choose_backend(options, environ, label, live=live)
    if dist.is_initialized():
        raise LiveRecoveryError(f"{label}: the default process group is already initialized; "
                                "LiveTraining forms it itself (remove the init_process_group call).")
    return options
