"""What the agent tells about its run: events, metrics and console lines, one method per happening.

The agent's loop (:mod:`elastic.agent.agent`) calls these instead of writing to the event log,
the metrics and the console itself, so each happening is told the same way everywhere. The
meaningful changes (a world formed, a member lost or waiting, a restart's cause) are logged
for the default console (:data:`elastic.console.CONSOLE`); the rest only with ``-v``.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, IO

from elastic.console import CONSOLE
from elastic.agent.observe.events import Event, EventLog, RestartCause
from elastic.agent.processes.failures import WorkerFailure, first_failure, signal_name
from elastic.agent.processes.group_state import GroupState, WorkersView
from elastic.rendezvous.api import MembershipChange, MembershipStatus, RendezvousInfo

if TYPE_CHECKING:
    from elastic.agent.observe.metrics import AgentMetrics

log = logging.getLogger(__name__)


class AgentReport:
    """Tells the events, the metrics (optional) and the console what the agent of ``host`` does.

    Args:
        events: the event log.
        metrics: the Prometheus metrics (None: none).
        console: where notices and the root cause go (default ``sys.stderr``).
        run_id, host: name the run and the node in log lines.
    """

    def __init__(self, events: EventLog, metrics: AgentMetrics | None, console: IO | None, *, run_id: str,
                 host: str) -> None:
        self.events = events
        self.metrics = metrics
        self._console = console if console is not None else sys.stderr
        self._run_id = run_id
        self._host = host

    @property
    def host(self) -> str:
        """The node's host name, as reports name it."""
        return self._host

    def round_joined(self, info: RendezvousInfo, duration: float) -> None:
        # world_size (workers) only where the round record fixes it (not the static rendezvous).
        workers = {"world_size": info.layout.world_size} if info.layout is not None else {}
        self.events.emit(Event.ROUND_JOINED, round=info.round, group_rank=info.group_rank,
                         group_world_size=info.group_world_size, members=[m.node_id for m in info.members],
                         duration_s=round(duration, 4), master=f"{info.master_addr}:{info.master_port}", **workers)
        if self.metrics:
            self.metrics.round_joined(duration_s=duration, members=info.group_world_size)

    def started(self, info: RendezvousInfo, ranks: list[int], world_size: int) -> None:
        """This node's workers of round ``info`` started with global ``ranks`` of ``world_size``."""
        nodes = info.group_world_size
        log.info("run %s round %d: formed a world of %d worker%s on %d node%s; node %s runs %s",
                 info.run_id, info.round, world_size, "" if world_size == 1 else "s", nodes,
                 "" if nodes == 1 else "s", self.events.node, ranks_text(ranks), extra=CONSOLE)

    def workers_started(self, round_: int, started: list[int], kept: list[int], *, refill: bool = False) -> None:
        """The local ranks ``started`` anew in round ``round_`` and those ``kept`` running (live)."""
        extra = {"refill": True} if refill else {}
        self.events.emit(Event.WORKERS_STARTED, round=round_, started=started, kept=kept, **extra)

    def round_formed(self, round_: int) -> None:
        """Every live worker of this node formed round ``round_``."""
        self.events.emit(Event.ROUND_FORMED, round=round_)

    def looked(self, workers: WorkersView, membership: MembershipStatus) -> None:
        """One look at the workers and the membership: the gauges, and (live recovery) that every
        worker formed the round published to it."""
        if self.metrics:
            self.metrics.set_nodes_waiting(membership.waiting, membership.spares)
            self.metrics.set_workers(running=len(workers.running), succeeded=0, failed=len(workers.failures))
        if workers.formed is not None:
            self.round_formed(workers.formed)

    def worker_exits(self, state: GroupState, reported: int) -> int:
        """Tell the failures of ``state`` past the first ``reported``; returns how many are told."""
        for failure in state.failures[reported:]:
            self.events.emit(Event.WORKER_EXIT, local_rank=failure.local_rank, global_rank=failure.global_rank,
                             exitcode=failure.exitcode, signal=signal_name(failure.exitcode))
            if self.metrics:
                self.metrics.worker_exit(exitcode=failure.exitcode)
        return len(state.failures)

    def change(self, membership: MembershipStatus, *, restarting: bool = True, kept: bool = False,
               own_failure: WorkerFailure | None = None, replaced: bool = False) -> None:
        """A membership change the agent restarts for, or (``restarting`` False) ends or stops on:
        the console line says a restart only when one follows, and ``kept``: live recovery keeps
        the workers through it (they are not restarted).

        ``own_failure``: this node's worker failed first and the change is its peers rejoining
        because of it (their collectives broke): the line is about that failure, which the next
        round counts, not about the rejoin (see :func:`failure_rejoin_line`).
        """
        if membership.change is MembershipChange.NODES_WAITING:
            self.events.emit(Event.NODES_WAITING, count=membership.waiting, reason=membership.reason)
        elif membership.change is MembershipChange.MEMBER_LOST:
            self.events.emit(Event.MEMBER_LOST, reason=membership.reason)
        if restarting and own_failure is not None:
            log.info("run %s node %s: %s", self._run_id, self.events.node,
                     failure_rejoin_line(own_failure, kept=kept, replaced=replaced), extra=CONSOLE)
        elif restarting:
            then = "joining the next round with the workers kept" if kept else "restarting the workers"
            log.info("run %s node %s: %s; %s (does not count as a failure)", self._run_id, self.events.node,
                     membership.reason, then, extra=CONSOLE)
        else:
            log.info("run %s node %s: %s", self._run_id, self.events.node, membership.reason, extra=CONSOLE)

    def not_counted(self, reason: str) -> None:
        """This node's worker failure turned out a lost member's consequence."""
        self.events.emit(Event.MEMBER_LOST, reason=reason)
        log.info("run %s node %s: %s", self._run_id, self.events.node, reason, extra=CONSOLE)

    def restart(self, cause: RestartCause, restarts_used: int, max_restarts: int, reason: str = "") -> None:
        extra = {"reason": reason} if reason else {}
        # The agreed count may pass --max-restarts when a failure restarts for its peers' rejoin
        # (the rejoin decides, not the budget): none remain then, not a negative number.
        self.events.emit(Event.RESTART, cause=cause, restart_count=restarts_used,
                         remaining=max(max_restarts - restarts_used, 0), **extra)
        if self.metrics:
            self.metrics.restart(cause)

    def failure_notice(self, state: GroupState, restarts_used: int, max_restarts: int) -> None:
        """One line before a counted failure restart."""
        first = first_failure(state.failures)
        if first is not None:
            print(f"elasticrun: worker rank {first.global_rank} failed ({exit_text(first.exitcode)}); "
                  f"restart {restarts_used} of {max_restarts}", file=self._console)

    def root_cause(self, summary: str) -> str:
        """Print the final root-cause ``summary``; returns its title ("" when empty)."""
        if not summary:
            return ""
        print(summary, file=self._console)
        # The title, not the report's top rule (printed last as "elasticrun: ====...").
        return next((line for line in summary.splitlines() if line.strip("=-")), "")

    def excluded(self, node_id: str, reason: str, cooldown: float, failures_in_a_row: int) -> None:
        self.events.emit(Event.NODE_EXCLUDED, reason=reason, cooldown_s=cooldown, failures_in_a_row=failures_in_a_row)
        if self.metrics:
            self.metrics.set_excluded(True)
        print(f"elasticrun: node {node_id} is excluded for {cooldown:g}s: {reason}; the others go on without it",
              file=self._console)

    def readmitted(self) -> None:
        if self.metrics:
            self.metrics.set_excluded(False)
        log.info("run %s node %s: the exclusion cooldown ended; rejoining", self._run_id, self.events.node,
                 extra=CONSOLE)

    def print(self, line: str) -> None:
        print(line, file=self._console)


def failure_rejoin_line(failure: WorkerFailure, *, kept: bool, replaced: bool) -> str:
    """The console line for a restart that this node's own worker failure caused: its peers'
    collectives broke, they rejoined, and this node joins them. ``kept``: ``--live-recovery``
    keeps the other workers; ``replaced``: the failed worker was already replaced in its round."""
    failed = f"worker rank {failure.global_rank} failed ({exit_text(failure.exitcode)})"
    if replaced:
        return f"{failed} and was replaced in its round; its peers rejoined: joining the next round with every worker"
    if kept:
        return f"{failed}; its peers rejoined: replacing it in the next round, the other workers kept"
    return f"{failed}; its peers rejoined: restarting the workers in the next round"


def ranks_text(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0-3`` (consecutive, as every layout gives them), else ``ranks 0,2,5``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def exit_text(exitcode: int) -> str:
    """``killed by SIGKILL`` or ``exit code 1``."""
    name = signal_name(exitcode)
    return f"killed by {name}" if name else f"exit code {exitcode}"
