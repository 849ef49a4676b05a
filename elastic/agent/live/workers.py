"""A node's live workers across rounds: the :class:`~elastic.agent.groups.Workers` the agent keeps
when a job runs with ``--live-recovery``.

Each local rank runs one worker process at a time, started with its round pipes
(:mod:`elastic.agent.live.pipes`) and followed by one :class:`LiveRank`. :meth:`LiveWorkers.look`
is the agent's one look per turn: the workers' state, and what they answered on their ready
pipes (:func:`~elastic.agent.live.decisions.decide_answer`,
:func:`~elastic.agent.live.decisions.group_broken`). When the agent joins a new round without
stopping them, :meth:`LiveWorkers.move_to` writes the round to every worker still running and
starts a new worker (a :class:`~elastic.agent.processes.workers.WorkerGroup` of just those ranks,
under the new attempt's log directory) for each local rank whose worker exited; the new one heals
from a live peer. :meth:`LiveWorkers.refill` starts such a worker before that, in the round in
use, as soon as its predecessor dies: the ranks re-form the round's next generation through its
store (:mod:`elastic.worker.refill`) while the rendezvous closes the next round. Torch-free.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from elastic.agent.live.decisions import AnswerView, RoundAnswer, decide_answer, group_broken
from elastic.agent.live.pipes import RoundPipes
from elastic.agent.processes.failures import WorkerFailure, root_cause_summary
from elastic.agent.processes.group_settings import GroupSettings
from elastic.agent.processes.group_state import GroupState, GroupStatus, WorkersView, group_status
from elastic.agent.processes.workers import WorkerGroup
from elastic.agent.worker_env import worker_ranks
from elastic.config import LaunchConfig
from elastic.rendezvous.api import RendezvousInfo
from elastic.worker.rounds import Held, ReadyEvent, Round, default_store_prefix

log = logging.getLogger(__name__)

__all__ = ["LiveRank", "LiveWorkers", "round_for"]


def round_for(config: LaunchConfig, info: RendezvousInfo, local_rank: int, restart_count: int) -> Round:
    """The round line of local rank ``local_rank`` in round ``info`` (what its worker reads)."""
    ranks = worker_ranks(config, info, local_rank)
    return Round(round=info.round, rank=ranks.rank, world_size=ranks.world_size, local_rank=local_rank,
                 local_world_size=config.nproc_per_node, group_rank=info.group_rank, master_addr=info.master_addr,
                 master_port=info.master_port, restart_count=restart_count,
                 store_prefix=default_store_prefix(info.run_id, info.round))


@dataclass
class LiveRank:
    """One local rank's current worker, as live recovery follows it.

    Attributes:
        group: the worker group its process belongs to.
        pipes: its round and ready pipes.
        formed, lost: the newest round it reported formed, and lost (-1: none).
        spoke: it wrote a line on its ready pipe (a replacement speaks as its predecessor did).
        refilled_in: the round this local rank was last replaced in (kept across its workers).
    """

    group: WorkerGroup
    pipes: RoundPipes
    formed: int = -1
    lost: int = -1
    spoke: bool = False
    refilled_in: int | None = None

    def read(self) -> None:
        """Take what the worker answered since the last read."""
        for answer in self.pipes.answers():
            self.spoke = True
            if answer.event is ReadyEvent.FORMED:
                self.formed = max(self.formed, answer.round)
            elif answer.event is ReadyEvent.LOST:
                self.lost = max(self.lost, answer.round)


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
        self._clock = clock
        self._ranks: dict[int, LiveRank] = {}
        self._groups: list[WorkerGroup] = []
        self._callbacks: list[Callable[[], None]] = []
        self._state = GroupState(GroupStatus.RUNNING)  # as of the last look
        self._published: int | None = None
        self._deadline = 0.0
        self._stopping = False
        self._held = 0.0  # the newest lease renewal's ``until``
        self._replaced: list[WorkerFailure] = []  # failures of workers refilled since the last round

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
        failures: list[WorkerFailure] = list(self._replaced)
        running: set[int] = set()
        for group in self._groups:
            state = group.poll()
            mine = {rank for rank, live in self._ranks.items() if live.group is group}
            failures.extend(failure for failure in state.failures if failure.local_rank in mine)
            running.update(state.running & mine)
        ordered = tuple(sorted(failures, key=lambda failure: failure.exit_monotonic))
        return GroupState(group_status(ordered, frozenset(running), self._stopping), ordered, frozenset(running))

    def look(self) -> WorkersView:
        """One look: the state, and what the running workers answered since the last look. That
        every one formed the round published last is said once (``formed``)."""
        self._state = state = self.poll()
        running = {rank: self._ranks[rank] for rank in state.running}
        for live in running.values():
            live.read()
        formed = {rank: live.formed for rank, live in running.items()}
        answer = decide_answer(AnswerView(self._published, formed, self._clock() >= self._deadline))
        answered = None
        if answer is RoundAnswer.ANSWERED:
            log.info("Run %s node %s: every live worker formed round %s", self.rdzv.run_id, self._settings.node_id,
                     self._published)
            answered, self._published = self._published, None
        return WorkersView(state, follows_rounds=True, unanswered=answer is RoundAnswer.OVERDUE,
                           broken=group_broken(self.rdzv.round, {rank: live.lost for rank, live in running.items()}),
                           silent=not all(live.spoke for live in running.values()), replaced=bool(self._replaced),
                           formed=answered)

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
        for live in self._ranks.values():
            live.pipes.close()
        return self.poll()

    def pids(self) -> dict[int, int]:
        return {rank: live.group.pids()[rank] for rank, live in sorted(self._ranks.items())
                if rank in live.group.pids()}

    def global_ranks(self) -> list[int]:
        return [worker_ranks(self.config, self.rdzv, rank).rank for rank in range(self.config.nproc_per_node)]

    def failure_report(self, host: str) -> str:
        tails = {rank: tail for group in self._groups for rank, tail in group.stderr_tails().items()
                 if rank in self._ranks and self._ranks[rank].group is group}
        return root_cause_summary(self.poll().failures, host, self.config.role, stderr_tails=tails)

    # -- live recovery ------------------------------------------------------------------------------
    def move_to(self, info: RendezvousInfo, *, attempt: int, restart_count: int,
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
                        info.run_id, self._settings.node_id, info.round, self.rdzv.round)
            for rank in running:
                self._ranks[rank].read()
            for live in self._ranks.values():
                live.formed, live.lost = -1, -1
        self.rdzv = info
        self._replaced.clear()  # the next round's join reported them (the agent's state said FAILED)
        for rank in sorted(running):
            if not self._ranks[rank].pipes.publish(round_for(self.config, info, rank, restart_count)):
                log.warning("Run %s node %s: could not publish round %d to local rank %d; waiting for its exit "
                            "or the answer deadline", info.run_id, self._settings.node_id, info.round, rank)
        self._published, self._deadline = info.round, self._clock() + self.config.live_recovery_timeout
        if dead:
            self._spawn(info, dead, attempt, restart_count, use_agent_store)
        self._forget_replaced()
        log.info("Run %s node %s: round %d published to local ranks %s, restarted %s", info.run_id,
                 self._settings.node_id, info.round, sorted(running) or "none", list(dead) or "none")
        return dead

    def refill(self, *, attempt: int, restart_count: int, use_agent_store: bool) -> tuple[int, ...]:
        """Start a replacement, in the round in use, for each local rank whose worker failed in it
        (as of the last look) after speaking the live protocol (once per rank and round); the
        ranks started.

        The failure stays in :meth:`poll` until the next round (:meth:`move_to`), so the agent
        reports and counts it as it would without a refill; the replacement is kept then.

        Raises:
            WorkerStartError: a replacement could not be started.
        """
        if self._stopping:
            return ()
        state = self._state
        failed = {failure.local_rank: failure for failure in state.failures
                  if not failure.during_stop and failure not in self._replaced}
        ranks = tuple(sorted(rank for rank in failed if rank not in state.running and self._ranks[rank].spoke
                             and self._ranks[rank].refilled_in != self.rdzv.round))
        if not ranks:
            return ()
        self._replaced.extend(failed[rank] for rank in ranks)
        self._spawn(self.rdzv, ranks, attempt, restart_count, use_agent_store, refill=True)
        for rank in ranks:
            self._ranks[rank].refilled_in = self.rdzv.round
        self._forget_replaced()
        log.info("Run %s node %s: local ranks %s replaced in round %d (a new generation of it)", self.rdzv.run_id,
                 self._settings.node_id, list(ranks), self.rdzv.round)
        return ranks

    def held(self, until: float | None) -> None:
        """Publish a renewal of the node's lease (``until``: see :class:`elastic.worker.rounds.Held`)
        to the workers running at the last look, once per renewal (a replacement gets the newest
        at its first look)."""
        if until is None or until <= self._held:
            return
        self._held = until
        for rank in sorted(self._state.running):
            self._ranks[rank].pipes.publish_held(Held(until))

    def _spawn(self, info: RendezvousInfo, ranks: tuple[int, ...], attempt: int, restart_count: int,
               use_agent_store: bool, refill: bool = False) -> None:
        label = f"Run {info.run_id} node {self._settings.node_id}"
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
            old = self._ranks.get(rank)
            if old is not None:
                old.pipes.close()
            # A replacement speaks as its predecessor did (it may still be starting).
            self._ranks[rank] = LiveRank(group, end, spoke=refill and old is not None and old.spoke,
                                         refilled_in=old.refilled_in if old is not None else None)
        self._groups.append(group)

    def _forget_replaced(self) -> None:
        """Reap the groups none of whose workers is current any more (their threads, leftovers)."""
        current = [live.group for live in self._ranks.values()]
        for group in [group for group in self._groups if not any(group is mine for mine in current)]:
            group.stop(0.0)
            self._groups.remove(group)
