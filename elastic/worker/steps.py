"""A training loop's steps under live recovery: the iterator of committed steps
(:meth:`LiveTraining.run`, the way to write a loop) and the scope of one step's body
(:meth:`LiveTraining.train_step`).

``run(fn)`` calls ``fn`` for each attempt of a step and yields once per *committed* step; the
``for`` body is where per-step work goes (an LR scheduler's step, logging, a checkpoint): it
runs exactly once per committed step on every rank, and never for an attempt that was not
committed (its group was lost, or a collective failed while ``fn`` went on). ``fn`` may run
again for the same step, on another group: it must change the training state only after its
last collective (the optimizer step last). The heal for the next step comes in the next
``next()``, after the ``for`` body ran, so what the body changed travels to a joiner.

Each attempt starts with the generators seeded from ``(LiveOptions.seed, step, live rank)``
(:mod:`elastic.worker.rng`) and, with ``data``, the loader set to the live world: an attempt in
the same world gets the same micro-batches and draws the same random numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Iterator

from elastic.worker.errors import LiveRecoveryError
from elastic.worker.rng import seed_generators, step_seed

if TYPE_CHECKING:
    from elastic.worker.data import ElasticLoader, Step
    from elastic.worker.live import LiveTraining
    from elastic.worker.recoverer import Recoverer
    from elastic.worker.state import TrainingState

__all__ = ["CommittedStep", "StepAttempt", "StepScope", "Steps"]


@dataclass(frozen=True)
class StepAttempt:
    """What ``fn`` is given for one attempt of a step."""

    step: int
    """The step attempted: the number of steps committed before it."""
    attempt: int
    """1 for this worker's first attempt of the step, then 2, 3... (a heal that moves the step starts again at 1)."""
    rank: int
    world_size: int
    seed: int | None
    """What the generators were seeded from (``None``: ``LiveOptions.seed`` is ``None``); seed
    a generator of your own from it."""
    batches: Step | tuple[()]
    """This rank's micro-batches (``ElasticLoader.next_step()``); empty without ``data``."""


@dataclass(frozen=True)
class CommittedStep:
    """A step every rank of the group committed; ``live.step`` is ``step + 1``."""

    step: int
    result: Any
    """What ``fn`` returned."""
    rank: int
    world_size: int
    samples: int
    """The samples the step used on every rank together (0 without ``data``)."""
    attempts: int


class Steps:
    """The step boundaries of one worker, for :meth:`run` and :meth:`scope` alike.

    Args:
        live: read for the step, the live rank and the world size.
        recoverer: re-forms and heals before a step, commits or loses it after.
        training: the seed, and the loader whose position travels.
        is_open: whether the worker is started and not closed.
    """

    def __init__(self, live: LiveTraining, recoverer: Recoverer, training: TrainingState,
                 is_open: Callable[[], bool]) -> None:
        self._live = live
        self._recoverer = recoverer
        self._training = training
        self._is_open = is_open

    def begin(self, what: str) -> int:
        """Re-form and heal if needed; the step about to be attempted.

        Raises:
            LiveRecoveryError: the worker is not started, or closed.
            RecoveryFailed: no group can be formed.
        """
        if not self._is_open():
            raise LiveRecoveryError(f"{self._recoverer.where()}: {what} needs start() first and close() not yet.")
        if self._live.control.boundary_hook is not None:
            self._live.control.boundary_hook()
        self._recoverer.before_step()
        return self._live.step

    def seed(self, step: int, rank: int) -> int | None:
        """Seed the generators for an attempt of ``step`` on live rank ``rank``; the seed used."""
        if self._training.seed is None:
            return None
        seed = step_seed(self._training.seed, step, rank)
        seed_generators(seed)
        return seed

    def run(self, fn: Callable[[StepAttempt], Any], data: ElasticLoader | None,
            until: int | None) -> Iterator[CommittedStep]:
        """See :meth:`LiveTraining.run`.

        Raises:
            ValueError: ``until`` is not ``None`` nor a step number.
        """
        if until is not None and (type(until) is not int or until < 0):
            raise ValueError(f"until ({until!r:.40}) must be None or a step number (an integer, at least 0).")
        if data is not None:
            self._training.attach(data)
        return self._committed(fn, data, until)

    def _committed(self, fn: Callable[[StepAttempt], Any], data: ElasticLoader | None,
                   until: int | None) -> Iterator[CommittedStep]:
        last, attempts = -1, 0
        while until is None or self._live.step < until:
            step = self.begin("run()")
            if until is not None and step >= until:  # a heal brought this worker there
                return
            attempts = attempts + 1 if step == last else 1
            last = step
            rank, world_size = self._live.rank, self._live.world_size
            batches: Step | tuple[()] = ()
            if data is not None:
                data.set_world(rank, world_size)
                batches = data.next_step()
            attempt = StepAttempt(step, attempts, rank, world_size, self.seed(step, rank), batches)
            try:
                result = fn(attempt)
            except BaseException as error:
                if self._recoverer.after_step(error):
                    continue  # the group was lost: the step runs again on the next
                raise
            self._recoverer.after_step(None)
            if self._live.step == step:  # a collective failed while fn went on
                continue
            if data is not None:
                data.commit()
            yield CommittedStep(step, result, rank, world_size, batches.plan.size if data is not None else 0, attempts)

    def scope(self) -> StepScope:
        return StepScope(self, self._recoverer, self._live)


class StepScope:
    """One step's body (``with live.train_step() as scope:``): a step boundary on entry; the
    commit, or the loss of the group, on exit.

    Code after the block runs for every attempt, committed or not: check :attr:`committed`.
    """

    def __init__(self, steps: Steps, recoverer: Recoverer, live: LiveTraining) -> None:
        self._steps = steps
        self._recoverer = recoverer
        self._live = live
        self.step = -1
        """The step attempted (set on entry)."""
        self.seed: int | None = None
        self.committed = False
        """Whether the step was committed (set on exit): only then run per-step work."""

    def __enter__(self) -> StepScope:
        self.step = self._steps.begin("train_step()")
        self.seed = self._steps.seed(self.step, self._live.rank)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> bool:
        swallow = self._recoverer.after_step(error)
        self.committed = self._live.step > self.step
        return swallow
