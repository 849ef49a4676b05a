"""A node's live workers across rounds: the :class:`~elastic.agent.groups.Workers` the agent keeps
when a job runs with ``--live-recovery``.

Each local rank runs one worker process at a time, started with its round pipes
(:mod:`elastic.agent.live.pipes`). When the agent joins a new round without stopping them,
:meth:`LiveWorkers.advance` writes the round to every worker still running and starts a new
worker (a :class:`~elastic.agent.processes.workers.WorkerGroup` of just those ranks, under the
new attempt's log directory) for each local rank whose worker exited; the new one heals from a
live peer. :meth:`LiveWorkers.refill` starts such a worker before that, in the round in use, as
soon as its predecessor dies: the ranks re-form the round's next generation through its store
(:mod:`elastic.worker.refill`) while the rendezvous closes the next round. :meth:`LiveWorkers.answer` tells whether every live worker formed the published
round in time (:func:`elastic.agent.live.decisions.decide_answer`). Torch-free.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from elastic.agent.live.decisions import AnswerView, RoundAnswer, decide_answer, group_broken
from elastic.agent.live.pipes import RoundPipes
from elastic.agent.processes.failures import root_cause_summary
from elastic.agent.worker_env import worker_ranks
from elastic.agent.processes.failures import WorkerFailure
from elastic.agent.processes.group_settings import GroupSettings
from elastic.agent.processes.group_state import GroupState, GroupStatus
from elastic.agent.processes.workers import WorkerGroup
from elastic.config import LaunchConfig
from elastic.rendezvous.api import RendezvousInfo
from elastic.worker.rounds import Held, Round, default_store_prefix

log = logging.getLogger(__name__)

__all__ = ["LiveWorkers", "round_for"]


def round_for(config: LaunchConfig, info: RendezvousInfo, local_rank: int, restart_count: int) -> Round:
    """The round line of local rank ``local_rank`` in round ``info`` (what its worker reads)."""
    ranks = worker_ranks(config, info, local_rank)
    return Round(round=info.round, rank=ranks.rank, world_size=ranks.world_size, local_rank=local_rank,
                 local_world_size=config.nproc_per_node, group_rank=info.group_rank, master_addr=info.master_addr,
                 master_port=info.master_port, restart_count=restart_count,
                 store_prefix=default_store_prefix(info.run_id, info.round))


class LiveWorkers:
    """The ``nproc_per_node`` workers of this node, kept across rounds.

    Args:
        config: the launch configuration (``live_recovery_timeout`` is the answer deadline).
        info: the round they start in.
        attempt, restart_count, use_agent_store, settings: as for :class:`WorkerGroup` (each group
            of some local ranks is one).
        clock: monotonic seconds (the answer deadline).
    """

    def __init__(self, config: LaunchConfig, info: RendezvousInfo, *, attempt: int, restart_count: int,
                 use_agent_store: bool, settings: GroupSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.rdzv = info
        self._first = (attempt, restart_count, use_agent_store)
        self._settings = settings
        self._node_id = settings.node_id
        self._clock = clock
        self._groups: list[WorkerGroup] = []
        self._current: dict[int, WorkerGroup] = {}
        self._pipes: dict[int, RoundPipes] = {}
        self._formed: dict[int, int] = {}
        self._lost: dict[int, int] = {}  # per local rank, the newest round its worker reported lost
        self._spoke: set[int] = set()  # local ranks whose current worker wrote a ready line
        self._callbacks: list[Callable[[], None]] = []
        self._published: int | None = None
        self._deadline = 0.0
        self._stopping = False
        self._held = 0.0  # the newest lease renewal's ``until``
        self._replaced: list[WorkerFailure] = []  # failures of workers refilled since the last round
        self._refilled: dict[int, int] = {}  # per local rank, the round it was last refilled in

    # -- the Workers protocol ----------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return worker_ranks(self.config, self.rdzv, 0).world_size

    def start(self) -> None:
        """Start every local rank's worker in the first round.

        Raises:
            WorkerStartError: a worker could not be started; those already started are stopped.
        """
        attempt, restart_count, use_agent_store = self._first
        self._spawn(self.rdzv, tuple(range(self.config.nproc_per_node)), attempt, restart_count, use_agent_store)

    def poll(self) -> GroupState:
        """The state of the current worker of every local rank (replaced workers are forgotten)."""
        failures, running = list(self._replaced), set()
        for group in self._groups:
            state = group.poll()
            mine = {rank for rank, current in self._current.items() if current is group}
            failures.extend(failure for failure in state.failures if failure.local_rank in mine)
            running.update(state.running & mine)
        failures.sort(key=lambda failure: failure.exit_monotonic)
        if any(not failure.during_stop for failure in failures):
            status = GroupStatus.FAILED
        elif not running and not failures:
            status = GroupStatus.SUCCEEDED
        elif self._stopping:
            status = GroupStatus.STOPPED
        else:
            status = GroupStatus.RUNNING
        return GroupState(status, tuple(failures), frozenset(running))

    def on_exit(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)
        for group in self._groups:
            group.on_exit(callback)

    def send_signal(self, sig: int) -> None:
        for group in self._groups:
            group.send_signal(sig)

    def stop(self, timeout: float | None = None) -> GroupState:
        """Stop every worker (SIGTERM, ``timeout``, SIGKILL) and close the pipes; idempotent."""
        self._stopping = True
        for group in self._groups:
            group.stop(timeout)
        for pipes in self._pipes.values():
            pipes.close()
        return self.poll()

    def pids(self) -> dict[int, int]:
        return {rank: group.pids()[rank] for rank, group in sorted(self._current.items()) if rank in group.pids()}

    def global_ranks(self) -> list[int]:
        return [worker_ranks(self.config, self.rdzv, rank).rank for rank in range(self.config.nproc_per_node)]

    def failure_report(self, host: str) -> str:
        tails = {rank: tail for group in self._groups for rank, tail in group.stderr_tails().items()
                 if self._current.get(rank) is group}
        return root_cause_summary(self.poll().failures, host, self.config.role, stderr_tails=tails)

    # -- live recovery ------------------------------------------------------------------------------
    def advance(self, info: RendezvousInfo, *, attempt: int, restart_count: int,
                use_agent_store: bool) -> tuple[int, ...]:
        """Move to round ``info``: publish it to the running workers, restart the exited ones in it;
        returns the local ranks restarted.

        Raises:
            WorkerStartError: a replacement could not be started (the caller stops the group).
        """
        running = self.poll().running
        dead = tuple(rank for rank in range(self.config.nproc_per_node) if rank not in running)
        if info.round <= self.rdzv.round:
            # The rendezvous numbered its rounds anew (the job's keys were deleted): what the
            # workers answered for the old numbering says nothing about the new one.
            log.warning("Run %s node %s: round %d follows round %d: the rendezvous numbers its rounds anew",
                        info.run_id, self._node_id, info.round, self.rdzv.round)
            self._read_answers(running)
            for rank in self._formed:
                self._formed[rank], self._lost[rank] = -1, -1
        self.rdzv = info
        self._replaced.clear()  # the next round's join reported them (the agent's state said FAILED)
        for rank in sorted(running):
            if not self._pipes[rank].publish(round_for(self.config, info, rank, restart_count)):
                log.warning("Run %s node %s: could not publish round %d to local rank %d; waiting for its exit "
                            "or the answer deadline", info.run_id, self._node_id, info.round, rank)
        self._published, self._deadline = info.round, self._clock() + self.config.live_recovery_timeout
        if dead:
            self._spawn(info, dead, attempt, restart_count, use_agent_store)
        self._forget_replaced()
        log.info("Run %s node %s: round %d published to local ranks %s, restarted %s", info.run_id, self._node_id,
                 info.round, sorted(running) or "none", list(dead) or "none")
        return dead

    def refill(self, *, attempt: int, restart_count: int, use_agent_store: bool) -> tuple[int, ...]:
        """Start a replacement, in the round in use, for each local rank whose worker failed in it
        after speaking the live protocol (once per rank and round); the ranks started.

        The failure stays in :meth:`poll` until the next round (:meth:`advance`), so the agent
        reports and counts it as it would without a refill; the replacement is kept then.

        Raises:
            WorkerStartError: a replacement could not be started.
        """
        if self._stopping:
            return ()
        state = self.poll()
        failed = {failure.local_rank: failure for failure in state.failures
                  if not failure.during_stop and failure not in self._replaced}
        ranks = tuple(sorted(rank for rank in failed if rank not in state.running and rank in self._spoke
                             and self._refilled.get(rank) != self.rdzv.round))
        if not ranks:
            return ()
        self._replaced.extend(failed[rank] for rank in ranks)
        self._spawn(self.rdzv, ranks, attempt, restart_count, use_agent_store, refill=True)
        for rank in ranks:
            self._refilled[rank] = self.rdzv.round
        self._forget_replaced()
        log.info("Run %s node %s: local ranks %s replaced in round %d (a new generation of it)", self.rdzv.run_id,
                 self._node_id, list(ranks), self.rdzv.round)
        return ranks

    def held(self, until: float) -> None:
        """Publish a renewal of the node's lease (``until``: see :class:`elastic.worker.rounds.Held`)
        to the running workers, once per renewal (a replacement gets the newest at its first look)."""
        if until <= self._held:
            return
        self._held = until
        for rank in sorted(self.poll().running):
            self._pipes[rank].publish_held(Held(until))

    def silent(self) -> bool:
        """Whether a running worker has never written a line on its ready pipe (it does not
        speak the live protocol, or has not started it yet)."""
        running = self.poll().running
        self._read_answers(running)
        return not running <= self._spoke

    def broken(self) -> bool:
        """Whether a running worker reported the group of the current round as lost (a collective
        failed: a peer died or left), so the node should join the next round now."""
        running = self.poll().running
        self._read_answers(running)
        return group_broken(self.rdzv.round, {rank: self._lost[rank] for rank in running})

    def answer(self) -> RoundAnswer:
        """Whether every running worker formed the round published last (see :class:`RoundAnswer`)."""
        running = self.poll().running
        self._read_answers(running)
        view = AnswerView(self._published, {rank: self._formed[rank] for rank in running},
                          self._clock() >= self._deadline)
        result = decide_answer(view)
        if result is RoundAnswer.ANSWERED:
            log.info("Run %s node %s: every live worker formed round %s", self.rdzv.run_id, self._node_id,
                     self._published)
            self._published = None
        return result

    def _read_answers(self, running: frozenset[int]) -> None:
        for rank in running:
            for answer in self._pipes[rank].answers():
                self._spoke.add(rank)
                if answer.event == "formed":
                    self._formed[rank] = max(self._formed[rank], answer.round)
                elif answer.event == "lost":
                    self._lost[rank] = max(self._lost[rank], answer.round)

    def _spawn(self, info: RendezvousInfo, ranks: tuple[int, ...], attempt: int, restart_count: int,
               use_agent_store: bool, refill: bool = False) -> None:
        label = f"Run {info.run_id} node {self._node_id}"
        pipes = {rank: RoundPipes(label) for rank in ranks}
        first = {rank: round_for(self.config, info, rank, restart_count) for rank in ranks}
        group = WorkerGroup(self.config, info, attempt=attempt, restart_count=restart_count,
                            use_agent_store=use_agent_store, settings=self._settings, local_ranks=ranks,
                            extras=lambda rank: pipes[rank].extras(first[rank], refill))
        for callback in self._callbacks:
            group.on_exit(callback)
        try:
            group.start()
        except BaseException:
            for end in pipes.values():
                end.close()
            raise
        for rank, end in pipes.items():
            end.started()
            if self._held:
                end.publish_held(Held(self._held))  # read after its first round, from the environment
            old = self._pipes.get(rank)
            if old is not None:
                old.close()
            self._pipes[rank], self._current[rank], self._formed[rank], self._lost[rank] = end, group, -1, -1
            if not refill:  # a replacement speaks as its predecessor did (it may still be starting)
                self._spoke.discard(rank)
        self._groups.append(group)

    def _forget_replaced(self) -> None:
        """Reap the groups none of whose workers is current any more (their threads, leftovers)."""
        for group in [group for group in self._groups if group not in self._current.values()]:
            group.stop(0.0)
            self._groups.remove(group)
