"""The parts behind one :class:`~elastic.worker.live.LiveTraining`, built from the worker's
environment and wired together: the training state, the commit bookkeeping, the reports, the
recovery loop and the control a layer over the loop sees.

Built in one place so the facade only reads its arguments and delegates; nothing here forms a
group or starts a thread (that is :meth:`~elastic.worker.recoverer.Recoverer.start`'s, through
:mod:`elastic.worker.lifecycle`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from elastic.worker.commits import Commits
from elastic.worker.control import GroupControl
from elastic.worker.environment import WorkerEnv, read_worker_env
from elastic.worker.options import LiveOptions
from elastic.worker.recoverer import Recoverer, StateHooks
from elastic.worker.reporting import Reporter
from elastic.worker.state import Stateful, TrainingState

__all__ = ["LiveParts", "assemble"]


@dataclass(frozen=True)
class LiveParts:
    """One object per job of a live worker, wired to each other by :func:`assemble`."""

    env: WorkerEnv
    environ: Mapping[str, str]
    """Updated with each round's ranks when mutable (:func:`elastic.worker.rounds.export_round`)."""
    training: TrainingState
    commits: Commits
    reporter: Reporter
    recoverer: Recoverer
    control: GroupControl

    def whole_state(self) -> dict[str, Any]:
        """The whole training state at the step committed: what a heal sends, what a whole-job
        checkpoint saves (:mod:`elastic.worker.state`)."""
        return self.training.compose(self.commits.step)


def assemble(environ: Mapping[str, str], state: Mapping[str, Stateful] | None,
             state_dict: Callable[[], Any] | None, load_state_dict: Callable[[Any], None] | None,
             options: LiveOptions, on_formed: Callable[[], None] | None,
             clock: Callable[[], float] = time.monotonic) -> LiveParts:
    """The parts of a live worker started with ``environ``, whose training state is ``state`` or
    the ``state_dict``, ``load_state_dict`` pair (see :class:`~elastic.worker.state.TrainingState`);
    ``on_formed`` is called after every group formed and healed.

    Raises:
        WorkerEnvError: ``environ`` lacks a variable or holds a bad one (checked first).
        TrainingStateError: the state is given both ways or neither, or an object lacks a method.
    """
    env = read_worker_env(environ)
    training = TrainingState(state, state_dict, load_state_dict, options.seed)
    commits = Commits()
    hooks = StateHooks(lambda: training.compose(commits.step),
                       lambda received: training.apply(received, "the state received in a heal"))
    reporter = Reporter(env.ready_fd, env.label)
    recoverer = Recoverer(env, environ, hooks, commits, reporter, options, on_formed, clock)
    control = GroupControl(recoverer.mailbox, recoverer.generation_watch, recoverer.in_use)
    return LiveParts(env, environ, training, commits, reporter, recoverer, control)
