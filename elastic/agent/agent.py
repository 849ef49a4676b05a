"""The elastic agent: one worker group per node, restarted on failure or membership change.

The loop: rendezvous → start the worker group → watch it and the membership signal →
:func:`elastic.agent.decisions.decide` → restart, finish (exit barrier) or give up. The
membership signal comes from the rendezvous watch, so survivors blocked in a collective are
stopped within the lease TTL of a peer's death, not after a collective timeout. A worker
failure restarts the group at once; this node's next join reports it, and the round's closer
counts it against ``--max-restarts`` only if the next round still has every member of the
last one (else it was a dead peer's consequence). Every member reads the count from the round
record, so all agree on it (:func:`elastic.rendezvous.decisions.agreed_restart_count`). The
agent never imports torch.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Callable

from elastic.agent.decisions import AgentAction, AgentView, decide, should_exclude
from elastic.agent.errors import StoreHostError, WorkerStartError
from elastic.agent.observe.events import Event, EventLog, RestartCause
from elastic.agent.processes.failures import first_failure, signal_name
from elastic.agent.lifeline.keeper import Lifeline
from elastic.agent.observe.metrics import AgentMetrics
from elastic.agent.processes.store_host import StoreHost
from elastic.agent.prewarm.pool import TemplatePool
from elastic.agent.processes.workers import GroupState, GroupStatus, WorkerGroup
from elastic.config import LaunchConfig
from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.errors import RendezvousClosedError, RendezvousError
from elastic.rendezvous.api import Rendezvous, RendezvousInfo

log = logging.getLogger(__name__)

# How long a node joining a running job waits for its worker templates (they import torch);
# past it, it joins and its workers start normally.
TEMPLATE_WARM_TIMEOUT_S = 120.0


class SignalReceived(Exception):
    """Raised in the agent's main thread when a handled signal arrives."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


@dataclass(frozen=True)
class ExclusionPolicy:
    """``--rdzv-conf max_node_failures=N,exclusion_cooldown=S``: a node whose own workers caused
    N failure restarts in a row leaves for S seconds while ``min_nodes`` others remain."""

    max_node_failures: int
    cooldown: float
    min_nodes: int


@dataclass(frozen=True)
class AgentResult:
    """How the agent ended: its exit code and a one-line reason."""

    exit_code: int
    reason: str


class ElasticAgent:
    """Runs the worker group of one node until the job finishes, fails for good, or is signalled.

    Args:
        config: the launch configuration.
        handler: a rendezvous handler (ours or the static one).
        host: this node's name, for reports.
        events, metrics: observability sinks (metrics may be None).
        lease_ttl: how long a dead peer takes to be noticed (the failure grace period).
        lifeline: keeps the PID file of live workers its watchdog and a restarted agent read
            (see :mod:`elastic.agent.lifeline.keeper`); None: no PID file.
        templates: pre-warmed worker templates (``--prewarm``); None: workers start normally.
    """

    def __init__(
        self,
        config: LaunchConfig,
        handler: Rendezvous,
        *,
        host: str,
        events: EventLog,
        metrics: AgentMetrics | None = None,
        lease_ttl: float = 0.0,
        console: IO | None = None,
        clock: Callable[[], float] = time.monotonic,
        store_host: StoreHost | None = None,
        exclusion: ExclusionPolicy | None = None,
        lifeline: Lifeline | None = None,
        templates: TemplatePool | None = None,
    ) -> None:
        self.config = config
        self.handler = handler
        self.host = host
        self.events = events
        self.metrics = metrics
        self.lease_ttl = lease_ttl
        self._console = console if console is not None else sys.stderr
        self._clock = clock
        self._lifeline = lifeline
        self._templates = templates
        self._group: WorkerGroup | None = None
        self._last_group: WorkerGroup | None = None
        self.restarts_used = 0
        self._unsettled: _UnsettledFailure | None = None
        self._membership_restart = False
        self._outage_seen: float | None = None  # when the store was last seen not answering
        self.attempt = 0
        self.healthy = True
        self.node_id: str = handler.node_id
        self._membership_seen = threading.Event()
        handler.on_change(self._membership_seen.set)
        self._store_host = store_host
        self._store_host_failed = False
        self._exclusion = exclusion
        self._failures_in_a_row = 0  # failure restarts this node's own workers caused, in a row

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> AgentResult:
        """Run until done; never raises for job outcomes (they become the result)."""
        try:
            return self._run()
        except SignalReceived as received:
            log.warning("Run %s node %s: received %s; stopping the workers", self.handler.run_id, self.host,
                        signal.Signals(received.signum).name)
            self._stop_group(forward=received.signum)
            self.handler.shutdown()
            name = signal.Signals(received.signum).name
            self.events.emit(Event.JOB_FINISHED, status=f"signalled:{name}")
            return AgentResult(128 + received.signum, f"the agent received {name}; workers stopped")
        except RendezvousError as error:
            self._stop_group()
            self.handler.shutdown()
            if isinstance(error, RendezvousClosedError) and error.job_finished and self._last_group is None:
                # A late (or restarted) agent of a job that already succeeded: nothing to do.
                self.events.emit(Event.JOB_FINISHED, status="already_finished")
                reason = f"{error}; nothing to do (use a new --rdzv-id to run the job again)"
                log.warning("Run %s node %s: %s", self.handler.run_id, self.host, reason)
                return AgentResult(0, reason)
            closed = isinstance(error, RendezvousClosedError)
            self.events.emit(Event.JOB_FINISHED, status="rendezvous_closed" if closed else "rendezvous_error")
            return AgentResult(1, str(error))
        finally:
            self.healthy = False
            if self._store_host is not None:
                self._store_host.close()

    def _run(self) -> AgentResult:
        self._warm_before_joining_a_running_job()
        while True:
            info = self._rendezvous()
            self._settle_failure(info)
            group = self._start_group(info)
            if group is None:
                action, state = AgentAction.GIVE_UP, GroupState(GroupStatus.FAILED)
            else:
                action, state = self._watch(group)
            result = self._act(action, state)
            if result is not None:
                return result

    def _warm_before_joining_a_running_job(self) -> None:
        """With ``--prewarm``, a node that joins a running job waits for its templates first.

        Its join stops the running workers; joining while the templates still import torch
        would leave the whole job idle for that import (the others' workers fork in
        milliseconds, this node's cannot start before its import ends). Waiting first keeps
        the job training meanwhile. A first start does not wait: every node imports at once,
        overlapped with the rendezvous.
        """
        if self._templates is None or not self.handler.job_running():
            return
        started = self._clock()
        ready = self._templates.wait_ready(TEMPLATE_WARM_TIMEOUT_S)
        log.info("Run %s node %s: joins the running job after its worker templates %s (%.1fs)",
                 self.handler.run_id, self.host, "are ready" if ready else "are not all ready (those ranks start normally)",
                 self._clock() - started)

    def _rendezvous(self) -> RendezvousInfo:
        started = self._clock()
        info = self.handler.next_rendezvous()
        duration = self._clock() - started
        self.events.emit(Event.ROUND_JOINED, round=info.round, group_rank=info.group_rank,
                         group_world_size=info.group_world_size, members=[m.node_id for m in info.members],
                         duration_s=round(duration, 4), master=f"{info.master_addr}:{info.master_port}")
        if self.metrics:
            self.metrics.round_joined(duration_s=duration, members=info.group_world_size)
        return info

    def _start_group(self, info: RendezvousInfo) -> WorkerGroup | None:
        use_agent_store = self._serve_store(info)
        group = WorkerGroup(self.config, info, attempt=self.attempt, restart_count=self._restart_count(info),
                            use_agent_store=use_agent_store, node_id=self.node_id, templates=self._templates)
        try:
            # Called from run(), in the agent's main thread, which lives as long as the agent: the
            # workers' parent-death signal follows the thread that forked them (lifeline.py).
            group.start()
        except WorkerStartError as error:
            print(f"elasticrun: cannot start the workers: {error}", file=self._console)
            return None
        if self._lifeline is not None:
            self._lifeline.track(group.pids().values())
        self._group = self._last_group = group
        ranks = group.global_ranks()
        log.info("Run %s node %s: attempt %d started %d workers (ranks %d..%d of %d)",
                 info.run_id, self.host, self.attempt, self.config.nproc_per_node,
                 ranks[0], ranks[-1], group.world_size)
        return group

    def spares(self) -> int:
        """Nodes waiting as spares beyond this node's full round (0 for handlers without spares)."""
        return self.handler.membership().spares

    def _restart_count(self, info: RendezvousInfo) -> int:
        """``TORCHELASTIC_RESTART_COUNT``: the round record's agreed count, or (static
        rendezvous, no record) this node's own."""
        return info.restart_count if info.layout is not None else self.restarts_used

    def _serve_store(self, info: RendezvousInfo) -> bool:
        """Whether workers use an agent-hosted store (``TORCHELASTIC_USE_AGENT_STORE``).

        On the master node the store helper serves the master port the round record names,
        on the socket that has listened since the join; workers everywhere connect as clients.
        Without a helper (static rendezvous, or no torch for it) rank 0's worker hosts the store.
        """
        listener = info.master_listener
        if listener is None:  # another node hosts (or nobody can: then rank 0's worker does)
            return info.group_rank != 0 and info.layout is not None and self._store_host is not None
        if self._store_host is None or self._store_host_failed:
            listener.close()
            return False
        try:
            self._store_host.serve(listener, info.master_addr)
            return True
        except StoreHostError as error:
            self._store_host_failed = True
            log.warning("Run %s node %s: %s; rank 0's worker hosts the store instead", info.run_id, self.host, error)
            return False

    def _watch(self, group: WorkerGroup) -> tuple[AgentAction, GroupState]:
        """Wait on worker exits and the membership signal until something must be done."""
        grace_deadline: float | None = None
        reported_exits = 0
        self._membership_seen.clear()
        while True:
            state = group.wait(timeout=self.config.monitor_interval)
            reported_exits = self._report_exits(state, reported_exits)
            membership = self.handler.membership()
            change, reason = membership.change, membership.reason
            if self.metrics:
                self.metrics.set_nodes_waiting(membership.waiting, membership.spares)
                self.metrics.set_workers(running=len(state.running), succeeded=0,
                                         failed=len(state.failures))
            in_outage = self._in_store_outage()
            grace_over = True
            if state.status is GroupStatus.FAILED and change is None:
                if grace_deadline is None:
                    # Only a peer's death can be a membership change in disguise; alone, there is no peer.
                    grace = self.lease_ttl + 1.0 if group.rdzv.group_world_size > 1 else 0.0
                    grace_deadline = self._clock() + grace
                    group.stop()
                grace_over = self._clock() >= grace_deadline
            view = AgentView(state.status, change, self.restarts_used, self.config.max_restarts, grace_over,
                             self._would_exclude(group), in_outage)
            action = decide(view)
            if action is AgentAction.KEEP_RUNNING:
                continue
            if action is AgentAction.AWAIT_MEMBERSHIP:
                remaining = max(grace_deadline - self._clock(), 0.0)
                if change is None:
                    self._membership_seen.wait(remaining)
                else:  # a change already seen that does not settle it (peers rejoining): look again soon
                    time.sleep(min(remaining, self.config.monitor_interval))
                continue
            if change is not None:
                self._report_change(change, reason)
            return action, group.poll()

    def _in_store_outage(self) -> bool:
        """Whether the store does not answer now, or did not within the last lease TTL + 1 s (the
        grace a failure gets to show its cause)."""
        outage = self.handler.membership().store_outage
        now = self._clock()
        if outage > 0:
            self._outage_seen = now
        return self._outage_seen is not None and now - self._outage_seen <= self.lease_ttl + 1.0

    def _would_exclude(self, group: WorkerGroup) -> bool:
        policy = self._exclusion
        if policy is None or not self.handler.supports_exclusion:
            return False
        return should_exclude(self._failures_in_a_row, policy.max_node_failures, group.rdzv.group_world_size,
                              policy.min_nodes)

    def _sit_out(self, state: GroupState) -> AgentResult | None:
        """Leave the rendezvous for the exclusion cooldown; None to rejoin after it, or the result
        when the job ended meanwhile."""
        policy = self._exclusion
        assert policy is not None
        failures = self._failures_in_a_row + 1
        first = first_failure(state.failures)
        cause = f"rank {first.global_rank} {_exit_text(first.exitcode)}" if first else "its workers failed"
        reason = (f"its own workers failed {failures} times in a row (max_node_failures={policy.max_node_failures}; "
                  f"last: {cause})")
        self.handler.exclude(policy.cooldown, reason)
        self.events.emit(Event.NODE_EXCLUDED, reason=reason, cooldown_s=policy.cooldown, failures_in_a_row=failures)
        if self.metrics:
            self.metrics.set_excluded(True)
        print(f"elasticrun: node {self.node_id} is excluded for {policy.cooldown:g}s: {reason}; the others go on "
              f"without it", file=self._console)
        deadline = self._clock() + policy.cooldown
        while (remaining := deadline - self._clock()) > 0:
            time.sleep(min(remaining, 2.0))
            if self.handler.is_closed():
                self.events.emit(Event.JOB_FINISHED, status="closed_while_excluded")
                self.handler.shutdown()
                return AgentResult(0, "the job ended while this node was excluded")
        if self.metrics:
            self.metrics.set_excluded(False)
        log.info("Run %s node %s: the exclusion cooldown ended; rejoining", self.handler.run_id, self.host)
        self._failures_in_a_row = 0
        self.attempt += 1
        return None

    def _act(self, action: AgentAction, state: GroupState) -> AgentResult | None:
        """Apply ``action``; returns the final result, or None to go round again."""
        if action is AgentAction.EXCLUDE:
            self._stop_group()
            return self._sit_out(state)
        if action is AgentAction.FINISH:
            self._stop_group()
            self._exit_barrier()
            self.handler.shutdown()
            self.events.emit(Event.JOB_FINISHED, status="succeeded")
            return AgentResult(0, "workers finished")
        if action is AgentAction.RESTART_AFTER_FAILURE:
            self._stop_group()
            # Restart at once, but count the failure only once the next round shows every member
            # survived: a peer's death breaks our collectives before its lease expires. Our join
            # reports the failure; the closer decides the count for every member.
            self._report_failure(state)
            self._unsettled = _UnsettledFailure(state, self._last_members())
            self.attempt += 1
            return None
        if action is AgentAction.RESTART_FOR_MEMBERSHIP:
            self._stop_group()
            if self.handler.membership().change is MembershipChange.NODES_WAITING:
                # Our workers may have failed first, and the change is our peers' rejoin: report it
                # (the closer decides). A failure beside a lost member or our own lost lease is that
                # loss's consequence (collectives broken by a peer that moved on) and is not reported.
                self._report_failure(state)
            self._membership_restart = True  # its cause is recorded once the next round says it
            self.attempt += 1
            return None
        if action is AgentAction.RESTART_FOR_OUTAGE:
            self._stop_group()
            log.warning("Run %s node %s: workers failed while the store did not answer; restarting them without "
                        "charging --max-restarts (the rejoin waits for the store)", self.handler.run_id, self.host)
            self._membership_restart = True
            self.attempt += 1
            return None
        if action is AgentAction.STOP_BLIND:
            self._stop_group()
            reason = self.handler.membership().reason
            self.events.emit(Event.JOB_FINISHED, status="store_unreachable")
            self.handler.shutdown()
            return AgentResult(1, reason or "the store does not answer")
        if action is AgentAction.STOP_CLOSED:
            self._stop_group()
            self.handler.shutdown()
            self.events.emit(Event.JOB_FINISHED, status="closed_by_peer")
            return AgentResult(1, "the rendezvous was closed by another node (the job failed there or was stopped)")
        # GIVE_UP
        self._stop_group()
        summary = self._print_failure(state, final=True)
        self.handler.set_closed(f"node {self.host} gave up after {self.restarts_used} restarts")
        self.handler.shutdown()
        self.events.emit(Event.JOB_FINISHED, status="failed")
        # The reason is the report's title, not its top rule (printed last as "elasticrun: ====...").
        title = next((line for line in summary.splitlines() if line.strip("=-")), "")
        return AgentResult(1, title or "workers failed")

    # -- helpers --------------------------------------------------------------------------------
    def _report_failure(self, state: GroupState) -> None:
        """Tell the rendezvous this node's workers failed on their own (not stopped by us), with the
        first exit's wall time: the next round's closer counts it and names the culprit."""
        first = first_failure([failure for failure in state.failures if not failure.during_stop])
        if first is not None:
            self.handler.report_failure(first.exit_time)

    def _settle_failure(self, info: RendezvousInfo) -> None:
        """Count the failure that caused this round, unless a member of the previous one is gone.

        Its restart is then a membership change (DESIGN §4: those are free): the peer died, and
        our workers failed on the connections it reset, before its lease expired. With a round
        record the closer decided that for every member; the static rendezvous decides locally.
        """
        unsettled, self._unsettled = self._unsettled, None
        membership_restart, self._membership_restart = self._membership_restart, False
        if info.layout is not None:
            self._settle_agreed(info, unsettled, membership_restart)
            return
        if membership_restart:
            self._record_restart(RestartCause.MEMBERSHIP_CHANGE)
        if unsettled is None:
            return
        lost = sorted(set(unsettled.members) - {member.node_id for member in info.members})
        if lost:
            reason = f"worker failure after the loss of {', '.join(lost)} (absent from round {info.round})"
            self.events.emit(Event.MEMBER_LOST, reason=reason)
            log.info("Run %s node %s: %s; not counted as a failure", info.run_id, self.host, reason)
            self._record_restart(RestartCause.MEMBERSHIP_CHANGE)
            return
        self.restarts_used += 1
        self._print_failure(unsettled.state, final=False)
        self._record_restart(RestartCause.WORKER_FAILURE)

    def _settle_agreed(self, info: RendezvousInfo, unsettled: _UnsettledFailure | None,
                       membership_restart: bool) -> None:
        """Take the round record's restart count; record this node's restart under the cause it
        agreed on (a failure restart when the count went up)."""
        counted = info.restart_count > self.restarts_used
        self.restarts_used = info.restart_count
        # Exclusion counts only the failures this node was charged with, in a row.
        self._failures_in_a_row = self._failures_in_a_row + 1 if info.culprit == self.node_id else 0
        if unsettled is None and not membership_restart:
            return
        if counted:
            if unsettled is not None:
                self._print_failure(unsettled.state, final=False)
            self._record_restart(RestartCause.WORKER_FAILURE)
            return
        if unsettled is not None:
            reason = f"worker failure not counted: a member of the previous round is absent from round {info.round}"
            self.events.emit(Event.MEMBER_LOST, reason=reason)
            log.info("Run %s node %s: %s", info.run_id, self.host, reason)
        self._record_restart(RestartCause.MEMBERSHIP_CHANGE)

    def _record_restart(self, cause: RestartCause) -> None:
        self.events.emit(Event.RESTART, cause=cause, restart_count=self.restarts_used,
                         remaining=self.config.max_restarts - self.restarts_used)
        if self.metrics:
            self.metrics.restart(cause)

    def _last_members(self) -> tuple[str, ...]:
        group = self._last_group
        return tuple(member.node_id for member in group.rdzv.members) if group is not None else ()

    def _exit_barrier(self) -> None:
        """Wait for the other members' workers, then close the rendezvous.

        Best effort, as torchrun's: our workers have succeeded, so a backend that goes away now
        (a c10d host that finished first stops its store) is logged, not turned into a failure.
        """
        try:
            finished = self.handler.finish(self.config.exit_barrier_timeout)
            if finished:
                self.handler.set_closed("the job finished")
        except RendezvousError as error:
            log.warning("Run %s node %s: the exit barrier failed (%s); the workers had finished, so exiting 0",
                        self.handler.run_id, self.host, error)

    def _stop_group(self, forward: int | None = None) -> None:
        group, self._group = self._group, None
        if group is None:
            return
        if forward is not None:
            group.send_signal(forward)
        group.stop(self.config.shutdown_timeout)
        if self._store_host is not None:
            self._store_host.release()
        if self._lifeline is not None:
            self._lifeline.untrack(group.pids().values())

    def _report_exits(self, state: GroupState, reported: int) -> int:
        for failure in state.failures[reported:]:
            self.events.emit(Event.WORKER_EXIT, local_rank=failure.local_rank, global_rank=failure.global_rank,
                             exitcode=failure.exitcode, signal=signal_name(failure.exitcode))
            if self.metrics:
                self.metrics.worker_exit(exitcode=failure.exitcode)
        return len(state.failures)

    def _report_change(self, change: MembershipChange, reason: str) -> None:
        if change is MembershipChange.NODES_WAITING:
            self.events.emit(Event.NODES_WAITING, count=self.handler.membership().waiting, reason=reason)
        elif change is MembershipChange.MEMBER_LOST:
            self.events.emit(Event.MEMBER_LOST, reason=reason)
        log.info("Run %s node %s: %s; restarting the workers (does not count as a failure)",
                 self.handler.run_id, self.host, reason)

    def _print_failure(self, state: GroupState, final: bool) -> str:
        """Print the root-cause summary (final) or a one-line notice (before a restart)."""
        first = first_failure(state.failures)
        if first is None or self._last_group is None:
            return ""
        if not final:
            print(f"elasticrun: worker rank {first.global_rank} failed ({_exit_text(first.exitcode)}); "
                  f"restart {self.restarts_used} of {self.config.max_restarts}", file=self._console)
            return ""
        summary = self._last_group.failure_report(self.host)
        print(summary, file=self._console)
        return summary


@dataclass(frozen=True)
class _UnsettledFailure:
    """A worker failure restarted at once, counted or not after the next round (see _settle_failure)."""

    state: GroupState
    members: tuple[str, ...]


def _exit_text(exitcode: int) -> str:
    name = signal_name(exitcode)
    return f"killed by {name}" if name else f"exit code {exitcode}"
