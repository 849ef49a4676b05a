"""The recovery loop of one live worker: a loss or a newer round → a target → form → heal.

At each step boundary the worker looks (one attribute read) whether a newer round is pending or
its group was lost; if so it leaves the group, forms the new round's group
(:mod:`elastic.worker.group`), agrees on the step with the other ranks and sends or receives the
state (:mod:`elastic.worker.heal`). A group lost to a failure is first re-formed in the same
round, as its next generation, through the round's own store (:mod:`elastic.worker.refill`): a
replaced peer then costs no rendezvous round, and training goes on while etcd is slow; a newer
round, when one comes, supersedes it. What to do after a loss is
:func:`elastic.worker.decisions.decide_after_loss`.

A formation may close without ranks that are not there yet (a replacement still starting):
those join at a later step boundary, as a regroup of the round (:mod:`elastic.worker.regroup`),
which the members see in the store while they train. In a group of a subset the worker's rank
and world size are the group's (:attr:`Recoverer.rank`, :attr:`Recoverer.world_size`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, MutableMapping

from elastic.worker.channel import Arrival, RoundMailbox, RoundWatcher
from elastic.worker.collectives import GroupInUse
from elastic.worker.commits import Commits
from elastic.worker.decisions import LossAction, decide_after_loss
from elastic.worker.environment import WorkerEnv
from elastic.worker.errors import (
    AgentGoneError,
    CollectiveFailed,
    FailingRoundsError,
    GroupLost,
    NoRoundError,
    RecoveryFailed,
    Superseded,
)
from elastic.worker.formation import ArrivalRecord
from elastic.worker.group import form_group
from elastic.worker.heal import heal
from elastic.worker.leftover import wait_for_leftovers
from elastic.worker.leaving import FormedRound
from elastic.worker.options import LiveOptions
from elastic.worker.refill import GenerationState, GenerationStore, move_generation, read_generation
from elastic.worker.regroup import GenerationWatch
from elastic.worker.reporting import Cause, Recovery, Reporter
from elastic.worker.rounds import ROUND_FD_VAR, ReadyEvent, Round, export_round

log = logging.getLogger(__name__)

__all__ = ["Recoverer", "StateHooks"]

@dataclass(frozen=True)
class StateHooks:
    """How to read the training state (to send it to a rank that is behind) and apply one received."""

    state_dict: Callable[[], Any]
    load_state_dict: Callable[[Any], None]


@dataclass(frozen=True)
class _Target:
    """What to form next: a round, and which of its generations (``pick``, given its store)."""

    arrival: Arrival
    pick: Callable[[GenerationStore], GenerationState] = read_generation
    wait_until: float | None = None
    """A refill's deadline: the newer round the agent may publish instead is due by then."""


class Recoverer:
    """The round pipe's watcher, the group in use, and the loop that replaces a lost or outdated
    group. Nothing runs before :meth:`start`.

    Args:
        env: the worker's start (its first round, its pipes).
        environ: updated with each round's ranks when mutable (:func:`elastic.worker.rounds.export_round`).
        state: what a heal sends and applies. commits: counted at each step's end, moved by each heal.
        reporter: keeps and logs each recovery, and tells the agent.
        options: the timeouts and limits.
        on_formed: called after every group formed and healed.
    """

    def __init__(self, env: WorkerEnv, environ: Mapping[str, str], state: StateHooks, commits: Commits,
                 reporter: Reporter, options: LiveOptions, on_formed: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._env = env
        self._environ = environ
        self._state = state
        self._commits = commits
        self._reporter = reporter
        self._options = options
        self._on_formed = on_formed
        self._clock = clock
        self.round: Round = env.first
        """The round in use (or being formed)."""
        self.in_use = GroupInUse(env.label, clock)
        self.mailbox = RoundMailbox(env.first.round, (env.first.master_addr, env.first.master_port))
        self._watcher: RoundWatcher | None = None
        if env.round_fd is None:
            self.mailbox.close()  # no pipe: no round will ever come
        else:
            self._watcher = RoundWatcher(env.round_fd, self.mailbox, self.in_use.registry, options.interrupt_grace,
                                         env.label, clock)
        self._lost: GroupLost | None = None
        self._generation = 0  # the generation of the round last formed (or being formed)
        self._refilled: tuple[int, int] | None = None  # the (round, generation) last moved past
        self.generation_watch = GenerationWatch(env.label) if env.round_fd is not None else None
        self._formed = FormedRound(self.generation_watch)  # its store, and this worker's standing for its arrivals
        self.gave_up = False
        """A recovery failed (:class:`RecoveryFailed`): the worker exits non-zero."""

    @property
    def rank(self) -> int:
        """This worker's rank in the group in use (the round's rank while none is)."""
        formed = self.in_use.current
        return self.round.rank if formed is None else formed.rank

    @property
    def world_size(self) -> int:
        """The size of the group in use: the round's, or fewer while ranks join later."""
        formed = self.in_use.current
        return self.round.world_size if formed is None else formed.world_size

    def use_options(self, options: LiveOptions) -> None:
        """Form every group from now on with ``options`` (the backend decided at start)."""
        self._options = options

    def start(self) -> None:
        """Watch the round pipe, tell the agent this worker is joining, form the first round and heal.

        Raises:
            StateTransferError: a state cannot be sent or a received one is malformed.
            RecoveryFailed: the first round could not be formed and no newer one came.
        """
        if self._watcher is not None:
            self._watcher.start()
        if self.generation_watch is not None:
            self.generation_watch.start()
        # The agent may now tell the survivors: they wait in the barrier no longer.
        self._reporter.tell(ReadyEvent.JOINING, self.round, self._commits.step)
        first = Arrival(self.round, self._clock())
        self._recover(Cause.START, _Target(first, _past_current if self._env.replaces else read_generation))

    def close(self) -> None:
        """Stop watching the pipe, leave the group, and wait (bounded) for abandoned collectives."""
        if self._watcher is not None:
            self._watcher.stop()
        if self.generation_watch is not None:
            self.generation_watch.stop()
        self.in_use.leave("closed")
        _drain(self.in_use, self._options, self.gave_up, self._env.label)
        self._reporter.close()

    # -- step boundaries ----------------------------------------------------------------------
    def before_step(self) -> None:
        """Re-form the group if it was lost or a newer round is pending.

        Raises:
            RecoveryFailed: no group can be formed.
        """
        if self._lost is not None:
            self._recover(Cause.LOST, None)
        elif self.mailbox.pending is not None:
            self._recover(Cause.ROUND, None)
        elif self.generation_watch is not None and self.generation_watch.moved is not None:
            self._recover(Cause.REGROUP, _Target(Arrival(self.round, self._clock())))

    def after_step(self, error: BaseException | None) -> bool:
        """Commit the step that ended with ``error`` (``None``: its body returned) unless its
        group was lost; whether to swallow ``error`` (the group was lost: the step runs again)."""
        failure = self.in_use.failure
        if error is None:
            if failure is None:
                self._commits.commit(self.round.round)
                return False
            log.warning("%s: step %d is not committed: a collective of it failed (%s) but its body went on",
                        self.where(), self._commits.step, failure)
            self._lose(failure)
            return False
        lost = error if isinstance(error, GroupLost) else failure if isinstance(error, RuntimeError) else None
        if lost is None:
            return False
        log.warning("%s: step %d is not committed and runs again: %s", self.where(), self._commits.step, lost)
        self._lose(lost)
        return True

    def where(self) -> str:
        return f"run {self._env.run_id} round {self.round.round} rank {self.round.rank}"

    def _lose(self, lost: GroupLost) -> None:
        """The group in use was lost: told to the agent and counted by :meth:`_settle_loss`."""
        self._lost = lost
        self._formed.standing.lost(isinstance(lost, CollectiveFailed) and lost.stalled)

    def _tell_loss(self) -> None:
        assert self._lost is not None
        self._commits.lose(self._lost)
        self._reporter.tell(ReadyEvent.LOST, self.round, self._commits.step)

    def _settle_loss(self) -> tuple[bool, bool]:
        """Whether the lost group's round moved to a newer generation, and whether it was left for
        a newer round (:meth:`FormedRound.settle`); if neither, the loss is told and counted."""
        settled = self._formed.settle(self.round, isinstance(self._lost, Superseded), self.where())
        if settled.moved or settled.left:
            log.info("%s: step %d runs again in %s", self.where(), self._commits.step,
                     "a newer generation of the round" if settled.moved else "the newer round a peer left for")
        else:
            self._tell_loss()
        return settled.moved, settled.left

    def _depart(self) -> None:
        pending = self.mailbox.pending
        self._formed.depart(self.round, None if pending is None else pending.record.round, self.where())

    # -- the loop -----------------------------------------------------------------------------
    def _recover(self, cause: Cause, first: _Target | None) -> None:
        try:
            self._recover_once(cause, first)
        except RecoveryFailed:
            self.gave_up = True
            raise

    def _recover_once(self, cause: Cause, first: _Target | None) -> None:
        began = self._clock()
        if cause is Cause.ROUND:
            self._depart()  # before the peers see this rank leave
        self.in_use.leave(f"{cause.value} at step {self._commits.step}")
        if self.generation_watch is not None:
            self.generation_watch.clear()
        moved, left = self._settle_loss() if cause is Cause.LOST else (False, False)
        deadline = began + self._options.round_wait_timeout
        attempts = 0
        target = first
        while True:
            if target is None:
                target = self._next_target(deadline, moved, left)
                moved = False
            attempts += 1
            try:
                self._form(cause, target, began, attempts)
                return
            except NoRoundError as error:
                if target.wait_until is None:
                    raise
                raise NoRoundError(f"{self.where()}: the group was lost ({self._lost}) and neither its replaced "
                                   f"ranks nor a newer round came within {self._options.round_wait_timeout:g}s.") from error
            except GroupLost as lost:
                log.warning("%s: round %d did not form: %s", self.where(), target.arrival.record.round, lost)
                self.in_use.leave("failed while forming")
                self._lose(lost)
                self._tell_loss()
                deadline = self._clock() + self._options.round_wait_timeout
                target = None

    def _next_target(self, deadline: float, moved: bool = False, left: bool = False) -> _Target:
        while True:
            if self._lost is None:  # a healthy group and a pending round
                arrival = self.mailbox.take()
                if arrival is not None:
                    return _Target(arrival)
            lost_at = (self.round.round, self._generation)
            refill = (self._env.has_pipe and not isinstance(self._lost, Superseded) and self._refilled != lost_at
                      and not left)
            failing = self._commits.failed_in_a_row > self._options.max_failed_rounds
            action = decide_after_loss(self.mailbox.pending is not None, self.mailbox.eof, self._clock() >= deadline,
                                       failing, refill, moved)
            moved = False
            if action is LossAction.TAKE_PENDING:
                self._depart()
                arrival = self.mailbox.take()
                if arrival is not None:
                    return _Target(arrival)
            elif action is LossAction.REGROUP:
                return _Target(Arrival(self.round, self._clock()), wait_until=deadline)
            elif action is LossAction.REFILL:
                self._refilled = lost_at
                past = self._generation
                return _Target(Arrival(self.round, self._clock()), lambda store: move_generation(store, past), deadline)
            elif action is LossAction.WAIT:
                self.mailbox.wait(max(0.0, deadline - self._clock()))
            else:
                raise _give_up(action, self.where(), self._lost, self._env.has_pipe, self._commits.failed_in_a_row,
                                 self._options) from self._lost

    def _form(self, cause: Cause, plan: _Target, began: float, attempts: int) -> None:
        arrival = plan.arrival
        target = arrival.record
        _export(target, self.round, self._environ, self.where())
        if target is not self.round:  # not the first round, nor a generation of the round in use
            self._generation = 0  # a newer round starts at its generation 0
            if target.round <= self.round.round:
                self._commits.renumbered()
                self._formed.standing.renumbered()
        self.round = target
        mark = self._commits.mark
        joining = ArrivalRecord(target.rank, self._formed.standing.holds(target.round), mark.step, mark.round)
        formed = form_group(target, self._options, self.mailbox, self._env.label, self._clock,
                            fenced=self._env.has_pipe, pick=plan.pick, wait_until=plan.wait_until, arrival=joining,
                            on_left_out=self._formed.standing.left_out)
        self.in_use.use(formed)
        self._generation = formed.generation
        if isinstance(self._environ, MutableMapping) and formed.world_size != target.world_size:
            # RANK and WORLD_SIZE say what torch.distributed.get_rank() and get_world_size() return
            export_round(dataclasses.replace(target, rank=formed.rank, world_size=formed.world_size), self._environ)
        formed_at = self._clock()
        healed = heal(formed, self._commits.mark, self._options, self._state.state_dict, self._state.load_state_dict,
                      self._clock)
        self._commits.adopt(healed.mark)
        self._lost = None
        self._formed.formed(target.round, formed.generation, formed.store)
        recovery = Recovery(
            round=target.round, cause=cause, step=healed.step, steps_before=healed.steps, role=healed.role,
            nbytes=healed.nbytes, began=began, round_arrived=None if cause is Cause.START and attempts == 1 else arrival.at,
            formed=formed_at, healed=healed.done_at, attempts=attempts, hung_works=self.in_use.abandoned_works(),
            generation=self._generation, members=formed.members,
        )
        self._reporter.formed(recovery, target, self.where())
        if self._on_formed is not None:
            self._on_formed()


def _past_current(store: GenerationStore) -> GenerationState:
    """A replacement's generation: one past the current, which its predecessor may have formed."""
    return move_generation(store, read_generation(store).number)


def _give_up(action: LossAction, where: str, lost: GroupLost | None, has_pipe: bool, failed_in_a_row: int,
             options: LiveOptions) -> RecoveryFailed:
    """The terminal error for a :func:`~elastic.worker.decisions.decide_after_loss` that gives up."""
    if action is LossAction.GIVE_UP_AGENT_GONE:
        why = "the round pipe is closed (the agent is gone)" if has_pipe else f"there is no round pipe ({ROUND_FD_VAR})"
        return AgentGoneError(f"{where}: the group was lost ({lost}) and {why}: no round can come.")
    if action is LossAction.GIVE_UP_FAILING:
        return FailingRoundsError(f"{where}: {failed_in_a_row} groups failed in a row without a committed step "
                                  f"(max_failed_rounds={options.max_failed_rounds}), the last: {lost}.")
    return NoRoundError(f"{where}: the group was lost ({lost}) and no newer round came within "
                        f"{options.round_wait_timeout:g}s.")


def _drain(in_use: GroupInUse, options: LiveOptions, gave_up: bool, label: str) -> None:
    """Wait (bounded) for the abandoned collectives and the store calls left behind (connects,
    looks: :mod:`elastic.worker.leftover`); a worker that gave up exits non-zero anyway and does
    not wait."""
    left = in_use.drain(0.0 if gave_up else options.drain_timeout)
    if left:
        log.warning("%s: %d abandoned collective(s) still run after %gs; gloo may abort this process at exit",
                    label, left, options.drain_timeout)
    running = wait_for_leftovers(0.0 if gave_up else options.store_timeout + 1.0)
    if running:
        log.warning("%s: %d call(s) to a round's store left behind still run (its store is frozen?)", label, running)


def _export(target: Round, previous: Round, environ: Mapping[str, str], where: str) -> None:
    """Put ``target``'s ranks in ``environ`` when it is mutable; say when the local rank moves."""
    if target.local_rank != previous.local_rank:
        log.warning("%s: round %d moves this worker from local rank %d to %d (its device does not change)",
                    where, target.round, previous.local_rank, target.local_rank)
    if isinstance(environ, MutableMapping):
        export_round(target, environ)
