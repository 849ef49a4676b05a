"""The training loop's side of live recovery: :class:`LiveTraining`.

A worker started by an agent that publishes rounds (``ELASTIC_ROUND_FD``) keeps its process and
its state across membership changes and peer failures: at each step boundary it looks (one
attribute read) whether a newer round is pending or its group was lost; if so it leaves the
group, forms the new round's group (:mod:`elastic.worker.group`), agrees on the step with the
other ranks and sends or receives the state (:mod:`elastic.worker.heal`), then runs the step.
A group lost to a failure is first re-formed in the same round, as its next generation, through
the round's own store (:mod:`elastic.worker.refill`): a replaced peer then costs no rendezvous
round, and training goes on while etcd is slow; a newer round, when one comes, supersedes it.

A step is committed (``step`` += 1) when its body returns; a body that raises because the
group was lost is not committed and runs again on the next group, at the same step. The body
must therefore change the training state only after its last collective (the optimizer step
last), as with TorchFT's ``should_commit``.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable, Mapping, MutableMapping

import torch
import torch.distributed as dist

from elastic.worker.backend import choose_backend
from elastic.worker.channel import Arrival, RoundMailbox, RoundWatcher
from elastic.worker.codec import check_state
from elastic.worker.decisions import LossAction, Mark, decide_after_loss
from elastic.worker.errors import (
    AgentGoneError,
    FailingRoundsError,
    GroupLost,
    LiveRecoveryError,
    NoRoundError,
    RecoveryFailed,
    Superseded,
    WorkerEnvError,
)
from elastic.worker.group import FormedGroup, form_group, leave_group
from elastic.worker.guard import Graveyard, OpRegistry, failed_future
from elastic.worker.heal import heal
from elastic.worker.options import LiveOptions
from elastic.worker.refill import GenerationStore, current_generation, move_generation, refill_from_env
from elastic.worker.reporting import Cause, ReadyWriter, Recovery
from elastic.worker.rounds import READY_FD_VAR, ROUND_FD_VAR, Round, export_round, round_from_env

log = logging.getLogger(__name__)

__all__ = ["LiveTraining"]

_KEPT_RECOVERIES = 1000
_MAX_FD = 2**31 - 1
"""The largest descriptor number an ``int`` of C holds (``os.fstat`` overflows past it)."""


@dataclass(frozen=True)
class _Target:
    """What to form next: a round, and which of its generations (``pick``, given its store)."""

    arrival: Arrival
    pick: Callable[[GenerationStore], int] = current_generation
    wait_until: float | None = None
    """A refill's deadline: the newer round the agent may publish instead is due by then."""


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
        self._state_dict = state_dict
        self._load_state_dict = load_state_dict
        self._on_reform = on_reform
        self._environ = os.environ if environ is None else environ
        self._clock = clock
        self._round: Round = round_from_env(self._environ)
        self._run_id = self._environ.get("TORCHELASTIC_RUN_ID") or "none"
        self._label = f"run {self._run_id} pid {os.getpid()}"
        self._mailbox = RoundMailbox(self._round.round, (self._round.master_addr, self._round.master_port))
        round_fd = _fd_var(self._environ, ROUND_FD_VAR)
        ready_fd = _fd_var(self._environ, READY_FD_VAR)
        self._has_pipe = round_fd is not None
        self._replaces = self._has_pipe and refill_from_env(self._environ)
        self._watcher = None
        if round_fd is None:
            self._mailbox.close()  # no pipe: no round will ever come
        else:
            self._watcher = RoundWatcher(round_fd, self._mailbox, self._registry, self.options.interrupt_grace, self._label, clock)
        self._ready = ReadyWriter(ready_fd, self._label) if ready_fd is not None else None
        self._graveyard = Graveyard(clock)
        self._formed: FormedGroup | None = None
        self._lost: GroupLost | None = None
        self._generation = 0  # the generation of the round last formed (or being formed)
        self._refilled: tuple[int, int] | None = None  # the (round, generation) last moved past
        self._step = 0
        self._commit_round = -1  # the round this worker committed its last step in (see decisions.Mark)
        self._failed_in_a_row = 0  # groups that failed since the last committed step (max_failed_rounds)
        self._started = False
        self._closed = False
        self._gave_up = False
        self.recoveries: collections.deque[Recovery] = collections.deque(maxlen=_KEPT_RECOVERIES)
        """The last groups this worker formed, oldest first."""

    # -- what the loop reads ------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Steps committed so far (by every rank of the group, after a heal)."""
        return self._step

    @property
    def rank(self) -> int:
        return self._round.rank

    @property
    def world_size(self) -> int:
        return self._round.world_size

    @property
    def local_rank(self) -> int:
        return self._round.local_rank

    @property
    def round(self) -> Round:
        """The round in use (or being formed)."""
        return self._round

    @property
    def group(self) -> dist.ProcessGroup:
        """The current default process group; it changes with every round.

        Raises:
            LiveRecoveryError: no group is formed (before :meth:`start`, or after :meth:`close`).
        """
        return self._require().group

    @property
    def abandoned_works(self) -> int:
        """Collectives of abandoned groups still running (hung on a frozen peer); each ends by
        the collective timeout, and its group's threads and sockets with it."""
        return self._graveyard.reap()

    @property
    def new_round_pending(self) -> bool:
        """Whether a newer round is waiting to be formed at the next step boundary (cheap)."""
        return self._mailbox.pending is not None

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
        self.options = choose_backend(self.options, self._environ, self._label, live=self._has_pipe)
        if dist.is_initialized():
            raise LiveRecoveryError(f"{self._label}: the default process group is already initialized; "
                                    "LiveTraining forms it itself (remove the init_process_group call).")
        check_state(self._state_dict())
        self._started = True
        atexit.register(self.close)
        if self._watcher is not None:
            self._watcher.start()
        if self._ready is not None:  # the agent may now tell the survivors: they wait in the barrier no longer
            self._ready.write("joining", self._round.round, self._round.rank, self._step)
        first = _Target(Arrival(self._round, self._clock()), _past_current if self._replaces else current_generation)
        self._recover(Cause.START, first)
        return self

    def close(self) -> None:
        """Leave the group, stop watching the pipe, and wait (bounded) for abandoned collectives."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._watcher is not None:
            self._watcher.stop()
        if self._formed is not None:
            leave_group(self._formed, self._graveyard, "closed")
            self._formed = None
        # A worker that gave up exits non-zero anyway: it does not wait for hung works first.
        left = self._graveyard.drain(0.0 if self._gave_up else self.options.drain_timeout)
        if left:
            log.warning("%s: %d abandoned collective(s) still run after %gs; gloo may abort this process at exit",
                        self._label, left, self.options.drain_timeout)
        if self._ready is not None:
            self._ready.close()

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
        return _StepScope(self)

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """All-reduce ``tensor`` in place over the current group; returns it.

        Raises:
            GroupLost: the collective failed, or a newer round abandoned it.
        """
        formed = self._require()
        if formed.registry.failure is not None:
            raise formed.registry.failure
        work = dist.all_reduce(tensor, op=op, group=formed.group, async_op=True)
        return formed.registry.launch([work], lambda: tensor).wait()

    def ddp(self, module: torch.nn.Module, **kwargs: Any) -> torch.nn.parallel.DistributedDataParallel:
        """A DDP of ``module`` whose gradients are averaged over the live group; it survives
        every re-forming (see :func:`elastic.worker.ddp.live_ddp`)."""
        from elastic.worker.ddp import live_ddp

        return live_ddp(self, module, **kwargs)

    def bucket_allreduce(self, buffer: torch.Tensor) -> torch.futures.Future:
        """Average ``buffer`` over the current group: the future a DDP comm hook returns."""
        formed = self._formed
        if formed is None:
            return failed_future(LiveRecoveryError(f"{self._label}: no group is formed"))
        if formed.registry.failure is not None:
            return failed_future(formed.registry.failure)
        world = formed.round.world_size
        work = dist.all_reduce(buffer, group=formed.group, async_op=True)
        return formed.registry.launch([work], lambda: buffer.div_(world)).future

    def _before_step(self) -> None:
        if not self._started or self._closed:
            raise LiveRecoveryError(f"{self._label}: train_step() needs start() first and close() not yet.")
        if self._lost is not None:
            self._recover(Cause.LOST, None)
        elif self._mailbox.pending is not None:
            self._recover(Cause.ROUND, None)

    def _after_step(self, error: BaseException | None) -> bool:
        formed = self._formed
        failure = None if formed is None else formed.registry.failure
        if error is None:
            if failure is None:
                self._step += 1
                self._commit_round = self._round.round
                self._failed_in_a_row = 0
                return False
            log.warning("%s: step %d is not committed: a collective of it failed (%s) but its body went on",
                        self._where(), self._step, failure)
            self._lose(failure)
            return False
        lost = error if isinstance(error, GroupLost) else failure if isinstance(error, RuntimeError) else None
        if lost is None:
            return False
        log.warning("%s: step %d is not committed and runs again: %s", self._where(), self._step, lost)
        self._lose(lost)
        return True

    def _lose(self, lost: GroupLost) -> None:
        self._lost = lost
        if not isinstance(lost, Superseded):  # a newer round is not a failure of this one
            self._failed_in_a_row += 1
        if self._ready is not None:
            self._ready.write("lost", self._round.round, self._round.rank, self._step)

    # -- recovery -----------------------------------------------------------------------------
    def _recover(self, cause: Cause, first: _Target | None) -> None:
        try:
            self._recover_once(cause, first)
        except RecoveryFailed:
            self._gave_up = True
            raise

    def _recover_once(self, cause: Cause, first: _Target | None) -> None:
        began = self._clock()
        if self._formed is not None:
            leave_group(self._formed, self._graveyard, f"{cause.value} at step {self._step}")
            self._formed = None
        deadline = began + self.options.round_wait_timeout
        attempts = 0
        target = first
        while True:
            if target is None:
                target = self._next_target(deadline)
            attempts += 1
            try:
                self._form(cause, target, began, attempts)
                return
            except NoRoundError as error:
                if target.wait_until is None:
                    raise
                raise NoRoundError(f"{self._where()}: the group was lost ({self._lost}) and neither its replaced "
                                   f"ranks nor a newer round came within {self.options.round_wait_timeout:g}s.") from error
            except GroupLost as lost:
                log.warning("%s: round %d did not form: %s", self._where(), target.arrival.record.round, lost)
                if self._formed is not None:
                    leave_group(self._formed, self._graveyard, "failed while forming")
                    self._formed = None
                self._lose(lost)
                deadline = self._clock() + self.options.round_wait_timeout
                target = None

    def _next_target(self, deadline: float) -> _Target:
        while True:
            if self._lost is None:  # a healthy group and a pending round
                arrival = self._mailbox.take()
                if arrival is not None:
                    return _Target(arrival)
            lost_at = (self._round.round, self._generation)
            refill = self._has_pipe and not isinstance(self._lost, Superseded) and self._refilled != lost_at
            action = decide_after_loss(self._mailbox.pending is not None, self._mailbox.eof, self._clock() >= deadline,
                                       self._failed_in_a_row > self.options.max_failed_rounds, refill)
            if action is LossAction.TAKE_PENDING:
                arrival = self._mailbox.take()
                if arrival is not None:
                    return _Target(arrival)
            elif action is LossAction.REFILL:
                self._refilled = lost_at
                past = self._generation
                return _Target(Arrival(self._round, self._clock()), lambda store: move_generation(store, past), deadline)
            elif action is LossAction.GIVE_UP_AGENT_GONE:
                why = "the round pipe is closed (the agent is gone)" if self._has_pipe else f"there is no round pipe ({ROUND_FD_VAR})"
                raise AgentGoneError(f"{self._where()}: the group was lost ({self._lost}) and {why}: no round can come.") from self._lost
            elif action is LossAction.GIVE_UP_FAILING:
                raise FailingRoundsError(f"{self._where()}: {self._failed_in_a_row} groups failed in a row without a "
                                         f"committed step (max_failed_rounds={self.options.max_failed_rounds}), the "
                                         f"last: {self._lost}.") from self._lost
            elif action is LossAction.GIVE_UP_DEADLINE:
                raise NoRoundError(f"{self._where()}: the group was lost ({self._lost}) and no newer round came within "
                                   f"{self.options.round_wait_timeout:g}s.") from self._lost
            else:
                self._mailbox.wait(max(0.0, deadline - self._clock()))

    def _form(self, cause: Cause, plan: _Target, began: float, attempts: int) -> None:
        arrival = plan.arrival
        target = arrival.record
        if target.local_rank != self._round.local_rank:
            log.warning("%s: round %d moves this worker from local rank %d to %d (its device does not change)",
                        self._where(), target.round, self._round.local_rank, target.local_rank)
        if target is not self._round:  # not the first round, nor a generation of the round in use
            self._generation = 0  # a newer round starts at its generation 0
            if target.round <= self._round.round:
                # Renumbered rounds (the job's keys were deleted): commit rounds of the old numbering
                # say nothing against the new one; every rank that lived through it forgets them.
                self._commit_round = -1
        self._round = target
        if isinstance(self._environ, MutableMapping):
            export_round(target, self._environ)
        self._formed = form_group(target, self.options, self._mailbox, self._label, self._clock, fenced=self._has_pipe,
                                  pick=plan.pick, wait_until=plan.wait_until)
        self._generation = self._formed.generation
        formed_at = self._clock()
        healed = heal(self._formed, Mark(self._step, self._commit_round), self.options, self._state_dict,
                      self._load_state_dict, self._clock)
        self._step, self._commit_round = healed.mark.step, healed.mark.round
        self._lost = None
        recovery = Recovery(
            round=target.round, cause=cause, step=healed.step, steps_before=healed.steps, role=healed.role,
            nbytes=healed.nbytes, began=began, round_arrived=None if cause is Cause.START and attempts == 1 else arrival.at,
            formed=formed_at, healed=healed.done_at, attempts=attempts, hung_works=self._graveyard.reap(),
            generation=self._generation,
        )
        self.recoveries.append(recovery)
        log.info("%s: formed round %d generation %d (%s) at step %d in %.3fs; heal: %s, %d bytes; %d abandoned "
                 "work(s) still run", self._where(), target.round, self._generation, cause.value, healed.step,
                 healed.done_at - began, healed.role.value, healed.nbytes, recovery.hung_works)
        if self._ready is not None:
            self._ready.write("formed", target.round, target.rank, healed.step)
        if self._on_reform is not None:
            self._on_reform(self)

    def _registry(self) -> OpRegistry | None:
        formed = self._formed
        return None if formed is None else formed.registry

    def _require(self) -> FormedGroup:
        if self._formed is None:
            raise LiveRecoveryError(f"{self._label}: no group is formed (call start(); not after close()).")
        return self._formed

    def _where(self) -> str:
        return f"run {self._run_id} round {self._round.round} rank {self._round.rank}"


class _StepScope:
    def __init__(self, live: LiveTraining) -> None:
        self._live = live

    def __enter__(self) -> LiveTraining:
        self._live._before_step()
        return self._live

    def __exit__(self, exc_type: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> bool:
        return self._live._after_step(error)


def _past_current(store: GenerationStore) -> int:
    """A replacement's generation: one past the current, which its predecessor may have formed."""
    return move_generation(store, current_generation(store))


def _fd_var(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name)
    if not text:
        return None
    try:
        fd = int(text)
    except ValueError:
        raise WorkerEnvError(f"{name}={text[:40]!r} is not a file descriptor number.") from None
    if not 0 <= fd <= _MAX_FD:
        raise WorkerEnvError(f"{name}={text[:40]!r} is out of range for a file descriptor.")
    try:
        os.fstat(fd)
    except OSError as error:
        raise WorkerEnvError(f"{name}={fd} is not an open file descriptor of this process ({error.strerror}).") from None
    return fd
