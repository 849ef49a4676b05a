"""The elastic agent: one worker group per node, restarted on failure or membership change.

The loop: rendezvous → settle the last restart → start the worker group → watch it and the
membership → :func:`elastic.agent.decisions.decide` → act: restart (a
:class:`~elastic.agent.restarts.PendingRestart`), finish (exit barrier) or give up. The
membership signal comes from the rendezvous watch, so survivors blocked in a collective are
stopped within the lease TTL of a peer's death, not after a collective timeout. A worker
failure restarts the group at once; this node's next join reports it, and the round's closer
counts it against ``--max-restarts`` only if the next round still has every member of the last
one (:mod:`elastic.agent.restarts`). With ``--live-recovery`` those restarts keep the running
workers and publish the next round to them (:mod:`elastic.agent.live`).

Every wait is on one :class:`~elastic.agent.waking.Waker`: worker exits and membership changes
wake it, and a handled signal is only recorded there and acted on at the next wait point (the
workers get the signal, stop, and the agent exits 128 + its number). The agent never imports torch.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, IO, Callable, TypeVar

from elastic.agent.attempts import Attempts
from elastic.agent.decisions import REJOIN_GRACE_S, AgentAction, AgentView, decide, should_exclude
from elastic.agent.exclusion import ExclusionPolicy, exclusion_reason
from elastic.agent.groups import GroupFactory, Workers, worker_groups
from elastic.agent.live.decisions import keeps_workers, refills
from elastic.agent.lifeline.keeper import Lifeline
from elastic.agent.observe.events import Event, EventLog
from elastic.agent.observe.report import AgentReport
from elastic.agent.prewarm.pool import TemplatePool
from elastic.agent.processes.failures import WorkerFailure, first_failure
from elastic.agent.processes.logs_specs import LogsSpecsHost
from elastic.agent.processes.store_host import StoreHost
from elastic.agent.processes.group_state import GroupState, GroupStatus
from elastic.agent.restarts import PendingCause, PendingRestart, settle
from elastic.agent.waking import Interrupted, Waker
from elastic.config import LaunchConfig
from elastic.rendezvous.api import MembershipChange, MembershipStatus, Rendezvous, RendezvousInfo
from elastic.rendezvous.errors import JobFinishedError, RendezvousClosedError, RendezvousError
from elastic.rendezvous.job import arrival_outcome

if TYPE_CHECKING:
    from elastic.agent.observe.metrics import AgentMetrics

log = logging.getLogger(__name__)
_RESTARTS = frozenset({AgentAction.RESTART_AFTER_FAILURE, AgentAction.RESTART_FOR_MEMBERSHIP,
                       AgentAction.RESTART_FOR_OUTAGE, AgentAction.RESTART_UNANSWERED})
"""The actions after which the workers start again (the console's "restarting" line)."""

T = TypeVar("T")

# How long a node joining a running job waits for its worker templates (they import torch);
# past it, it joins and its workers start normally.
TEMPLATE_WARM_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class AgentResult:
    """How the agent ended: its exit code and a one-line reason."""

    exit_code: int
    reason: str


@dataclass(frozen=True)
class Verdict:
    """What one watch of the workers decided, with what it saw."""

    action: AgentAction
    state: GroupState
    membership: MembershipStatus


Step = AgentResult | PendingRestart | None
"""What acting on a verdict gives: the end, a restart to settle, or (None) a rejoin with none."""


class ElasticAgent:
    """Runs the worker group of one node until the job finishes, fails for good, or is signalled.

    Args:
        config: the launch configuration.
        rendezvous: ours or the static one.
        host: this node's name, for reports.
        events, metrics: observability sinks (metrics may be None).
        lease_ttl: how long a dead peer takes to be noticed (the failure grace period).
        console: where notices and the root cause go (default ``sys.stderr``).
        clock: monotonic seconds (deadlines: the failure grace, the outage memory, the cooldown).
        store_host: hosts the master's store for the workers (None: rank 0's worker does).
        exclusion: the exclusion policy (None: off).
        lifeline: keeps the PID file of live workers its watchdog and a restarted agent read
            (see :mod:`elastic.agent.lifeline.keeper`); None: no PID file.
        templates: pre-warmed worker templates (``--prewarm``); None: workers start normally.
        logs_specs: the helper of the ``--logs-specs`` plugin (None: none named); the caller
            starts and closes it.
        groups: makes each attempt's worker group (default: real :class:`WorkerGroup` s).
        waker: what the agent waits on; signals it catches (:meth:`Waker.catching`) stop the agent.
    """

    def __init__(
        self,
        config: LaunchConfig,
        rendezvous: Rendezvous,
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
        logs_specs: LogsSpecsHost | None = None,
        groups: GroupFactory | None = None,
        waker: Waker | None = None,
    ) -> None:
        self.config = config
        self.rendezvous = rendezvous
        self.host = host
        self.events = events
        self.lease_ttl = lease_ttl
        self.node_id: str = rendezvous.node_id
        self._report = AgentReport(events, metrics, console, run_id=rendezvous.run_id, host=host)
        self._clock = clock
        self._exclusion = exclusion
        self._templates = templates
        self._waker = waker or Waker()
        groups = groups or worker_groups(config, self.node_id, templates, logs_specs)
        self._attempts = Attempts(groups, self._waker, self._report,
                                  run_id=rendezvous.run_id, host=host, shutdown_timeout=config.shutdown_timeout, store_host=store_host,
                                  lifeline=lifeline, templates=templates)
        self.restarts_used = 0
        self._failures_in_a_row = 0  # failure restarts this node's own workers caused, in a row
        self._outage_seen: float | None = None  # when the store was last seen not answering
        self.attempt = 0
        self.round: RendezvousInfo | None = None
        """The round this node joined last (None before the first)."""
        self.healthy = True
        rendezvous.on_change(self._waker.wake)
        self._actions: dict[AgentAction, Callable[[Verdict], Step]] = {
            AgentAction.RESTART_AFTER_FAILURE: self._restart_after_failure,
            AgentAction.RESTART_FOR_MEMBERSHIP: self._restart_for_membership,
            AgentAction.RESTART_FOR_OUTAGE: self._restart_for_outage,
            AgentAction.RESTART_UNANSWERED: lambda verdict: self._pending(PendingCause.MEMBERSHIP, verdict, (
                f"a live worker did not form the new round within {config.live_recovery_timeout:g}s")),
            AgentAction.REJOIN_BROKEN: self._rejoin_broken,
            AgentAction.EXCLUDE: self._sit_out,
            AgentAction.FINISH: self._finish,
            AgentAction.GIVE_UP: self._give_up,
            AgentAction.STOP_CLOSED: lambda _: self._end(1, "closed_by_peer", "the rendezvous was closed by "
                                                         "another node (the job failed there or was stopped)"),
            AgentAction.STOP_BLIND: lambda verdict: self._end(1, "store_unreachable", verdict.membership.reason
                                                              or "the store does not answer"),
            AgentAction.STOP_FINISHED: self._stop_finished,
        }

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> AgentResult:
        """Run until done; never raises for job outcomes (they become the result)."""
        try:
            return self._run()
        except Interrupted as interrupted:
            return self._signalled(interrupted.signum)
        except RendezvousError as error:
            return self._rendezvous_failed(error)
        finally:
            self.healthy = False
            self._attempts.close()

    def _run(self) -> AgentResult:
        self._warm_before_joining_a_running_job()
        pending: PendingRestart | None = None
        while True:
            try:
                info = self._rendezvous()
            except JobFinishedError as finished:
                return self._finished_before_joining(finished, pending)
            self._settle(pending, info)
            # TORCHELASTIC_RESTART_COUNT: the round record's count, or (static) the node's own.
            group = self._attempts.start(info, self.attempt, self.restarts_used)
            if group is None:
                step = self._act(Verdict(AgentAction.GIVE_UP, GroupState(GroupStatus.FAILED), MembershipStatus()))
            else:
                step = self._act(self._watch(group))
            if isinstance(step, AgentResult):
                return step
            pending = step
            self.attempt += 1

    def _blocking(self, call: Callable[[], T], what: str) -> T:
        """A rendezvous call that cannot wait on the waker: a signal meanwhile shuts the rendezvous
        down (which ends the call) and raises Interrupted."""
        return self._waker.call(call, what=what, interrupt=self.rendezvous.shutdown)

    def _warm_before_joining_a_running_job(self) -> None:
        """With ``--prewarm``, a node that joins a running job waits for its templates first.

        Its join stops the running workers; joining while the templates still import torch
        would leave the whole job idle for that import (the others' workers fork in
        milliseconds, this node's cannot start before its import ends). Waiting first keeps
        the job training meanwhile. A first start does not wait: every node imports at once,
        overlapped with the rendezvous.
        """
        if self._templates is not None and self._blocking(self.rendezvous.job_running, "job-running"):
            self._attempts.await_templates(TEMPLATE_WARM_TIMEOUT_S, "joins the running job")

    def _rendezvous(self) -> RendezvousInfo:
        started = self._clock()
        info = self._blocking(self.rendezvous.next_rendezvous, "rendezvous")
        self.round = info
        self._report.round_joined(info, self._clock() - started)
        return info

    def _settle(self, pending: PendingRestart | None, info: RendezvousInfo) -> None:
        """Account for the restart that led to round ``info`` (see :func:`settle`)."""
        settled = settle(pending, info, self.restarts_used, self._failures_in_a_row, self.node_id)
        self.restarts_used, self._failures_in_a_row = settled.restarts_used, settled.failures_in_a_row
        if pending is None or settled.recorded is None:
            return
        if settled.not_counted:
            self._report.not_counted(settled.not_counted)
        if settled.counted:
            self._report.failure_notice(pending.state, self.restarts_used, self.config.max_restarts)
        self._report.restart(settled.recorded, self.restarts_used, self.config.max_restarts, pending.reason)

    def _watch(self, group: Workers) -> Verdict:
        """Wait on the waker (worker exits, membership changes, signals) until something must be done."""
        grace_deadline: float | None = None
        rejoin_deadline: float | None = None
        reported_exits = 0
        refilled = False  # a failed worker was replaced in this round (live recovery)
        live = self.config.live_recovery  # live workers wait for a round, they neither end nor are stopped
        while True:
            self._waker.check()
            state = group.poll()
            # Asked only after a failure: its checks read the workers' pipes.
            if live and state.status is GroupStatus.FAILED and self._refill(group, state):
                refilled = True
                state = group.poll()
            reported_exits = self._report.worker_exits(state, reported_exits)
            membership = self.rendezvous.membership()
            self._report.looked(state, membership)
            if live:
                self._attempts.held(membership.held_until)
            rejoin_pending = False
            if (membership.change is MembershipChange.NODES_WAITING and state.status is GroupStatus.RUNNING
                    and 0 < membership.waiting <= membership.rejoining and not live):
                rejoin_deadline = rejoin_deadline or self._clock() + REJOIN_GRACE_S
                rejoin_pending = self._clock() < rejoin_deadline
            grace_over = True
            if state.status is GroupStatus.FAILED and membership.change is None:
                if grace_deadline is None:
                    # Only a peer's death can be a membership change in disguise; alone, there is no peer.
                    grace_deadline = self._clock() + (self.lease_ttl + 1.0 if group.rdzv.group_world_size > 1 else 0.0)
                    if not live:
                        group.stop()
                grace_over = self._clock() >= grace_deadline
            view = AgentView(state.status, membership.change, self.restarts_used, self.config.max_restarts, grace_over,
                             self._would_exclude(group), self._in_store_outage(membership), rejoin_pending,
                             live and self._attempts.unanswered(), live and self._attempts.broken())
            action = decide(view)
            if action is AgentAction.KEEP_RUNNING:
                self._waker.wait(self.config.monitor_interval)
            elif action is AgentAction.AWAIT_MEMBERSHIP:  # only while a failure's or a rejoin's grace runs
                deadline = rejoin_deadline if rejoin_pending else grace_deadline
                self._waker.wait(min((deadline or 0.0) - self._clock(), self.config.monitor_interval))
            else:
                if membership.change is not None and action is not AgentAction.STOP_FINISHED:
                    kept = keeps_workers(live, action, self._attempts.unanswered(), self._attempts.silent())
                    self._report.change(membership, restarting=action in _RESTARTS, kept=kept,
                                        own_failure=own_failure_rejoined(action, membership, state),
                                        replaced=refilled)
                return Verdict(action, group.poll(), membership)

    def _refill(self, group: Workers, state: GroupState) -> bool:
        """Replace live workers that failed, at once, in the round in use (their ranks re-form it
        through its own store while the rendezvous closes the next round; see
        :mod:`elastic.worker.refill`); whether any was started. Not when the failure will end or
        stop the group anyway (no restart left, a worker outside the live protocol), nor without
        pre-warmed replacements."""
        if not refills(state.status is GroupStatus.FAILED, self.restarts_used < self.config.max_restarts,
                       self._attempts.unanswered(), self._attempts.silent(), self._attempts.prewarmed):
            return False
        if not self._attempts.refill(self.attempt + 1, self.restarts_used):
            return False
        self.attempt += 1  # the replacements' log directory; the next round's workers get the one after
        return True

    def _in_store_outage(self, membership: MembershipStatus) -> bool:
        """Whether the store does not answer now, or did not within the last lease TTL + 1 s (the
        grace a failure gets to show its cause)."""
        now = self._clock()
        if membership.store_outage > 0:
            self._outage_seen = now
        return self._outage_seen is not None and now - self._outage_seen <= self.lease_ttl + 1.0

    def _would_exclude(self, group: Workers) -> bool:
        policy = self._exclusion
        if policy is None or not self.rendezvous.supports_exclusion:
            return False
        return should_exclude(self._failures_in_a_row, policy.max_node_failures, group.rdzv.group_world_size,
                              policy.min_nodes)

    # -- acting on a verdict: the group is stopped once, then one handler runs -----------------------
    def _act(self, verdict: Verdict) -> Step:
        """Stop the workers (unless live recovery keeps them for the next round), then apply the
        verdict; returns the result, a restart, or None (rejoin)."""
        if not keeps_workers(self.config.live_recovery, verdict.action, self._attempts.unanswered(),
                             self._attempts.silent()):
            self._attempts.stop()
        return self._actions[verdict.action](verdict)

    def _restart_after_failure(self, verdict: Verdict) -> PendingRestart:
        # Restart at once, but count the failure only once the next round shows every member
        # survived: a peer's death breaks our collectives before its lease expires. Our join
        # reports the failure; the closer decides the count for every member.
        self._report_failure(verdict.state)
        return self._pending(PendingCause.FAILURE, verdict, "")

    def _restart_for_membership(self, verdict: Verdict) -> PendingRestart:
        if verdict.membership.change is MembershipChange.NODES_WAITING:
            # Our workers may have failed first, and the change is our peers' rejoin: report it
            # (the closer decides). A failure beside a lost member or our own lost lease is that
            # loss's consequence (collectives broken by a peer that moved on) and is not reported.
            self._report_failure(verdict.state)
        return self._pending(PendingCause.MEMBERSHIP, verdict, verdict.membership.reason)

    def _rejoin_broken(self, verdict: Verdict) -> PendingRestart:
        # Not reported as a failure: this node's workers did not fail, a peer's did (that node
        # reports its own) or a whole node died (its lease tells, later; the last call leaves it out).
        reason = "a live worker's collective failed (a peer's worker or node died)"
        log.warning("Run %s node %s: %s; joining the next round with the workers kept", self.rendezvous.run_id,
                    self.host, reason)
        return self._pending(PendingCause.MEMBERSHIP, verdict, reason)

    def _restart_for_outage(self, verdict: Verdict) -> PendingRestart:
        reason = "workers failed while the store did not answer"
        log.warning("Run %s node %s: %s; restarting them without charging --max-restarts (the rejoin waits for "
                    "the store)", self.rendezvous.run_id, self.host, reason)
        return self._pending(PendingCause.OUTAGE, verdict, reason)

    def _pending(self, cause: PendingCause, verdict: Verdict, reason: str) -> PendingRestart:
        group = self._attempts.last
        members = tuple(member.node_id for member in group.rdzv.members) if group is not None else ()
        return PendingRestart(cause, verdict.state, members, reason)

    def _sit_out(self, verdict: Verdict) -> AgentResult | None:
        """Leave the rendezvous for the exclusion cooldown; None to rejoin after it, or the result
        when the job ended meanwhile."""
        policy = self._exclusion
        assert policy is not None  # decide() excludes only under a policy
        failures = self._failures_in_a_row + 1
        reason = exclusion_reason(policy, failures, verdict.state)
        self._blocking(lambda: self.rendezvous.exclude(policy.cooldown, reason), "exclude")
        self._report.excluded(self.node_id, reason, policy.cooldown, failures)
        deadline = self._clock() + policy.cooldown
        while (remaining := deadline - self._clock()) > 0:
            self._waker.wait(min(remaining, 2.0))
            if self._blocking(self.rendezvous.is_closed, "is-closed"):
                return self._end(0, "closed_while_excluded", "the job ended while this node was excluded")
        self._report.readmitted()
        self._failures_in_a_row = 0
        return None

    def _finish(self, verdict: Verdict) -> AgentResult:
        """Record the job's end, then the exit barrier: wait for the other members' workers.

        The job is finished for everyone as soon as one node's workers all succeeded (torchrun's
        rule), so that is recorded first: no round forms after it, and a member whose workers
        fail now (their peers left) ends instead of training again. There is nothing to close
        after the barrier: the record already stops every join. Best effort, as torchrun's: our
        workers have succeeded, so a backend that goes away now (a c10d host that finished first
        stops its store) is logged, not turned into a failure, and is not retried for long.
        """
        try:
            self._blocking(self.rendezvous.declare_finished, "declare-finished")
        except RendezvousError as error:
            log.warning("Run %s node %s: could not record the job's end (%s); the workers had finished",
                        self.rendezvous.run_id, self.host, error)
        try:
            self._blocking(lambda: self.rendezvous.finish(self.config.exit_barrier_timeout), "exit-barrier")
        except RendezvousError as error:
            log.warning("Run %s node %s: the exit barrier failed (%s); the workers had finished, so exiting 0",
                        self.rendezvous.run_id, self.host, error)
        return self._end(0, "succeeded", "workers finished")

    def _stop_finished(self, verdict: Verdict) -> AgentResult:
        """The job finished on another node while this node's workers ran: exit 0, say why, train no more."""
        if verdict.membership.change is MembershipChange.JOB_FINISHED_ELSEWHERE:
            after = "this node's workers ran in a round without it: stopped them, not training again"
        else:
            after = (f"this node's workers {'failed' if verdict.state.status is GroupStatus.FAILED else 'stopped'} "
                     "after that, most likely because their peers left: not training again")
        return self._end_finished(f"{verdict.membership.reason}; {after}")

    def _finished_before_joining(self, finished: JobFinishedError, pending: PendingRestart | None) -> AgentResult:
        """The job finished while this node was (re)joining: a member exits 0 without training
        again; a node in no round yet ends as :func:`arrival_outcome` says (exit 3 when it
        arrived after the end)."""
        ended = f"the job finished on node {finished.node_id} in round {finished.round}"
        if self._attempts.last is None:
            outcome = arrival_outcome(finished.node_id, finished.round, finished.joined,
                                      self.config.rendezvous.already_finished_ok)
            if outcome.exit_code == 0:  # a non-zero exit's reason is printed by the launcher
                log.warning("Run %s node %s: %s", self.rendezvous.run_id, self.host, outcome.line)
            return self._end(outcome.exit_code, outcome.status, outcome.line)
        if pending is not None and pending.cause is PendingCause.FAILURE:
            after = "this node's workers failed after that, most likely because their peers left"
        else:
            after = f"this node's workers were stopped after that ({pending.reason if pending else 'a restart'})"
        return self._end_finished(f"{ended}; {after}: not training again")

    def _end_finished(self, reason: str) -> AgentResult:
        log.warning("Run %s node %s: %s", self.rendezvous.run_id, self.host, reason)
        return self._end(0, "finished_elsewhere", reason)

    def _give_up(self, verdict: Verdict) -> AgentResult:
        first = first_failure(verdict.state.failures)
        last = self._attempts.last
        summary = last.failure_report(self.host) if first and last else ""
        title = self._report.root_cause(summary)
        reason = f"node {self.host} gave up after {self.restarts_used} restarts"
        self._blocking(lambda: self.rendezvous.set_closed(reason), "close")
        return self._end(1, "failed", title or "workers failed")

    def _end(self, exit_code: int, status: str, reason: str) -> AgentResult:
        self.rendezvous.shutdown()
        self.events.emit(Event.JOB_FINISHED, status=status)
        return AgentResult(exit_code, reason)

    # -- the ways out of the loop -------------------------------------------------------------------
    def _signalled(self, signum: int) -> AgentResult:
        name = signal.Signals(signum).name
        log.warning("Run %s node %s: received %s; stopping the workers", self.rendezvous.run_id, self.host, name)
        self._attempts.stop(forward=signum)
        return self._end(128 + signum, f"signalled:{name}", f"the agent received {name}; workers stopped")

    def _rendezvous_failed(self, error: RendezvousError) -> AgentResult:
        self._attempts.stop()
        if isinstance(error, JobFinishedError):
            return self._finished_before_joining(error, None)
        if isinstance(error, RendezvousClosedError) and error.job_finished and self._attempts.last is None:
            # A late (or restarted) agent of a job that already succeeded: nothing to do.
            reason = f"{error}; nothing to do (use a new --rdzv-id to run the job again)"
            log.warning("Run %s node %s: %s", self.rendezvous.run_id, self.host, reason)
            return self._end(0, "already_finished", reason)
        status = "rendezvous_closed" if isinstance(error, RendezvousClosedError) else "rendezvous_error"
        return self._end(1, status, str(error))

    # -- helpers --------------------------------------------------------------------------------
    def _report_failure(self, state: GroupState) -> None:
        """Tell the rendezvous this node's workers failed on their own (not stopped by us), with the
        first exit's wall time: the next round's closer counts it and names the culprit."""
        first = first_failure([failure for failure in state.failures if not failure.during_stop])
        if first is not None:
            self.rendezvous.report_failure(first.exit_time)


def own_failure_rejoined(action: AgentAction, membership: MembershipStatus, state: GroupState) -> WorkerFailure | None:
    """This node's first own worker failure when it is what a membership restart is about: only
    members rejoin (their collectives broke on it), so no node waits to join; else None. Pure."""
    if action is not AgentAction.RESTART_FOR_MEMBERSHIP or membership.change is not MembershipChange.NODES_WAITING:
        return None
    if membership.waiting > membership.rejoining:
        return None  # a newcomer waits too: the line about it is true
    return first_failure([failure for failure in state.failures if not failure.during_stop])
