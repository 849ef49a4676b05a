"""The training loop's side of live recovery: :class:`LiveTraining`.

A worker started by an agent that publishes rounds (``ELASTIC_ROUND_FD``) keeps its process and
its state across membership changes and peer failures: at each step boundary it re-forms its
group when a newer round is pending or the group was lost, and heals the ranks that are behind
(:mod:`elastic.worker.recoverer`).

A step is committed (``step`` += 1) when its body returns; a body that raises because the
group was lost is not committed and runs again on the next group, at the same step. The body
must therefore change the training state only after its last collective (the optimizer step
last), as with TorchFT's ``should_commit``.

:class:`LiveTraining` is the facade a training loop sees; the jobs behind it are the recovery
loop (:class:`~elastic.worker.recoverer.Recoverer`), the commit bookkeeping
(:class:`~elastic.worker.commits.Commits`), the group in use and its collectives
(:class:`~elastic.worker.collectives.GroupInUse`) and the reports
(:class:`~elastic.worker.reporting.Reporter`).
"""

from __future__ import annotations

import atexit
import collections
import os
import time
from types import TracebackType
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist

from elastic.worker.backend import choose_backend
from elastic.worker.codec import check_state
from elastic.worker.commits import Commits
from elastic.worker.environment import read_worker_env
from elastic.worker.errors import LiveRecoveryError
from elastic.worker.options import LiveOptions
from elastic.worker.recoverer import Recoverer, StateHooks
from elastic.worker.reporting import Recovery, Reporter
from elastic.worker.rounds import Round

__all__ = ["LiveTraining"]


class LiveTraining:
    """Live recovery for one worker process.

    Args:
        state_dict: returns the training state to send to a rank that is behind (tensors,
            numbers, strings, lists, tuples, dicts; see :mod:`elastic.worker.codec`).
        load_state_dict: applies a state received from a peer.
        on_reform: called with this object after every group formed and healed (to rebuild
            what depends on the rank or world size: a DDP on :attr:`group`, a data sampler).
        options: see :class:`LiveOptions`.
        environ: the worker environment (default ``os.environ``); a mutable one is updated
            with each round's ranks (:func:`elastic.worker.rounds.export_round`).

    Raises (on construction):
        WorkerEnvError: the environment lacks a variable or holds a bad one.
    """

    def __init__(
        self,
        state_dict: Callable[[], Any],
        load_state_dict: Callable[[Any], None],
        *,
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
        self._state = StateHooks(state_dict, load_state_dict)
        self._commits = Commits()
        self._reporter = Reporter(env.ready_fd, env.label)
        reformed = None if on_reform is None else lambda: on_reform(self)
        self._recoverer = Recoverer(env, environ, self._state, self._commits, self._reporter, self.options, reformed, clock)
        self._started = False
        self._closed = False

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
        if self._started:
            raise LiveRecoveryError(f"{self._label}: start() was called twice.")
        self.options = choose_backend(self.options, self._environ, self._label, live=self._env.has_pipe)
        self._recoverer.use_options(self.options)
        if dist.is_initialized():
            raise LiveRecoveryError(f"{self._label}: the default process group is already initialized; "
                                    "LiveTraining forms it itself (remove the init_process_group call).")
        check_state(self._state.state_dict())
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

    # -- the step -----------------------------------------------------------------------------
    def train_step(self) -> _StepScope:
        """A context manager around one step's body; see the module docstring.

        On entry it re-forms the group if a newer round is pending or the group was lost
        (raising :class:`RecoveryFailed` when it cannot). On exit it commits the step, or
        swallows the loss of the group (the step runs again) and re-raises any other error.
        """
        return _StepScope(self, self._recoverer)

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


class _StepScope:
    """One step's body: a step boundary on entry; the commit, or the loss of the group, on exit."""

    def __init__(self, live: LiveTraining, recoverer: Recoverer) -> None:
        self._live = live
        self._recoverer = recoverer

    def __enter__(self) -> LiveTraining:
        live = self._live
        if not live._started or live._closed:
            raise LiveRecoveryError(f"{live._label}: train_step() needs start() first and close() not yet.")
        self._recoverer.before_step()
        return live

    def __exit__(self, exc_type: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> bool:
        return self._recoverer.after_step(error)
