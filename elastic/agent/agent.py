"""The elastic agent: one worker group per node, restarted on failure or membership change.

The loop: rendezvous → settle the last restart → start the worker group → watch it and the
membership → :func:`elastic.agent.decisions.decide` → act: restart (a
:class:`~elastic.agent.restarts.PendingRestart`), finish (exit barrier) or give up
(:mod:`elastic.agent.endings`). The membership signal comes from the rendezvous watch, so
survivors blocked in a collective are stopped within the lease TTL of a peer's death, not after
a collective timeout. A worker failure restarts the group at once; this node's next join reports
it, and the round's closer counts it against ``--max-restarts`` only if the next round still has
every member of the last one (:mod:`elastic.agent.restarts`).

Each turn of the watch takes one look at the workers (a
:class:`~elastic.agent.processes.group_state.WorkersView`) and one at the membership, and decides
on those. The agent never asks which kind of group it holds: with ``--live-recovery`` the group
(:mod:`elastic.agent.live`) says that its workers follow rounds, and the decisions keep them
across restarts and publish the next round to them.

Every wait is on one :class:`~elastic.agent.waking.Waker`: worker exits and membership changes
wake it, and a handled signal is only recorded there and acted on at the next wait point (the
workers get the signal, stop, and the agent exits 128 + its number). The agent never imports torch.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

from elastic.agent.attempts import Attempts, NodeHelpers
from elastic.agent.decisions import AgentAction, AgentView, Verdict, decide, should_exclude
from elastic.agent.endings import AgentResult, Endings
from elastic.agent.exclusion import ExclusionPolicy, exclusion_reason
from elastic.agent.graces import Graces
from elastic.agent.groups import GroupFactory, Workers, worker_groups
from elastic.agent.live.decisions import keeps_workers
from elastic.agent.observe.report import AgentReport
from elastic.agent.processes.failures import WorkerFailure, first_failure
from elastic.agent.processes.group_state import GroupState, GroupStatus, WorkersView
from elastic.agent.restarts import PendingCause, PendingRestart, settle
from elastic.agent.waking import Interrupted, Waker
from elastic.config import LaunchConfig
from elastic.rendezvous.api import MembershipChange, MembershipStatus, Rendezvous, RendezvousInfo
from elastic.rendezvous.errors import JobFinishedError, RendezvousError

__all__ = ["AgentResult", "ElasticAgent", "own_failure_rejoined"]

log = logging.getLogger(__name__)
_RESTARTS = frozenset({AgentAction.RESTART_AFTER_FAILURE, AgentAction.RESTART_FOR_MEMBERSHIP,
                       AgentAction.RESTART_FOR_OUTAGE, AgentAction.RESTART_UNANSWERED})
"""The actions after which the workers start again (the console's "restarting" line)."""

T = TypeVar("T")

# How long a node joining a running job waits for its worker templates (they import torch);
# past it, it joins and its workers start normally.
TEMPLATE_WARM_TIMEOUT_S = 120.0

Step = AgentResult | PendingRestart | None
"""What acting on a verdict gives: the end, a restart to settle, or (None) a rejoin with none."""


class ElasticAgent:
    """Runs the worker group of one node until the job finishes, fails for good, or is signalled.

    Args:
        config: the launch configuration (its ``rendezvous.lease_ttl`` is how long a dead peer
            takes to be noticed: the failure grace).
        rendezvous: ours or the static one.
        report: tells the events, the metrics and the console (names the run and this host).
        helpers: the store helper, the lifeline, the templates and the ``--logs-specs`` helper;
            the caller starts and closes them.
        exclusion: the exclusion policy (None: off).
        groups: makes each attempt's worker group (default: this node's kind, :func:`worker_groups`).
        waker: what the agent waits on; signals it catches (:meth:`Waker.catching`) stop the agent.
        clock: monotonic seconds (deadlines: the failure grace, the outage memory, the cooldown).
    """

    def __init__(self, config: LaunchConfig, rendezvous: Rendezvous, report: AgentReport, *,
                 helpers: NodeHelpers = NodeHelpers(), exclusion: ExclusionPolicy | None = None,
                 groups: GroupFactory | None = None, waker: Waker | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.rendezvous = rendezvous
        self.node_id: str = rendezvous.node_id
        self._report = report
        self._lease_ttl = config.rendezvous.lease_ttl
        self._clock = clock
        self._exclusion = exclusion
        self._templates = helpers.templates
        self._waker = waker or Waker()
        groups = groups or worker_groups(config, self.node_id, helpers.templates, helpers.logs_specs)
        self._attempts = Attempts(groups, self._waker, report, helpers, run_id=rendezvous.run_id, host=report.host,
                                  shutdown_timeout=config.shutdown_timeout)
        self._endings = Endings(config, rendezvous, report, self._attempts, self._blocking)
        self.restarts_used = 0
        self._failures_in_a_row = 0  # failure restarts this node's own workers caused, in a row
        self._outage_seen: float | None = None  # when the store was last seen not answering
        self.round: RendezvousInfo | None = None
        """The round this node joined last (None before the first)."""
        self.healthy = True
        rendezvous.on_change(self._waker.wake)
        endings = self._endings
        self._actions: dict[AgentAction, Callable[[Verdict], Step]] = {
            AgentAction.RESTART_AFTER_FAILURE: self._restart_after_failure,
            AgentAction.RESTART_FOR_MEMBERSHIP: self._restart_for_membership,
            AgentAction.RESTART_FOR_OUTAGE: self._restart_for_outage,
            AgentAction.RESTART_UNANSWERED: lambda verdict: self._pending(PendingCause.MEMBERSHIP, verdict, (
                f"a live worker did not form the new round within {config.live_recovery_timeout:g}s")),
            AgentAction.REJOIN_BROKEN: self._rejoin_broken,
            AgentAction.EXCLUDE: self._sit_out,
            AgentAction.FINISH: lambda _: endings.finish(),
            AgentAction.GIVE_UP: lambda verdict: endings.give_up(verdict, self.restarts_used),
            AgentAction.STOP_CLOSED: lambda _: endings.end(1, "closed_by_peer", "the rendezvous was closed by "
                                                           "another node (the job failed there or was stopped)"),
            AgentAction.STOP_BLIND: lambda verdict: endings.end(1, "store_unreachable", verdict.membership.reason
                                                                or "the store does not answer"),
            AgentAction.STOP_FINISHED: endings.stop_finished,
        }

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> AgentResult:
        """Run until done; never raises for job outcomes (they become the result)."""
        try:
            return self._run()
        except Interrupted as interrupted:
            return self._endings.signalled(interrupted.signum)
        except RendezvousError as error:
            return self._endings.rendezvous_failed(error)
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
                return self._endings.finished_before_joining(finished, pending)
            self._settle(pending, info)
            # TORCHELASTIC_RESTART_COUNT: the round record's count, or (static) the node's own.
            group = self._attempts.start(info, self.restarts_used)
            if group is None:
                failed = WorkersView(GroupState(GroupStatus.FAILED))
                step = self._act(Verdict(AgentAction.GIVE_UP, failed, MembershipStatus()))
            else:
                step = self._act(self._watch(group))
            if isinstance(step, AgentResult):
                return step
            pending = step

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
        """Wait on the waker (worker exits, membership changes, signals) until something must be
        done; each turn decides on one look at the workers and one at the membership."""
        # Only a peer's death can be a membership change in disguise; alone, there is no peer.
        graces = Graces(self._clock, self._lease_ttl + 1.0 if group.rdzv.group_world_size > 1 else 0.0)
        reported_exits = 0
        while True:
            self._waker.check()
            workers = self._attempts.look(self.restarts_used, self.restarts_used < self.config.max_restarts)
            reported_exits = self._report.worker_exits(workers.state, reported_exits)
            membership = self.rendezvous.membership()
            self._report.looked(workers, membership)
            group.held(membership.held_until)
            grace = graces.look(workers, membership)
            if grace.stop_now:
                group.stop()
            view = AgentView(workers, membership.change, self.restarts_used, self.config.max_restarts, grace.over,
                             self._would_exclude(group), self._in_store_outage(membership), grace.rejoin_pending)
            action = decide(view)
            if action is AgentAction.KEEP_RUNNING:
                self._waker.wait(self.config.monitor_interval)
            elif action is AgentAction.AWAIT_MEMBERSHIP:  # only while a failure's or a rejoin's grace runs
                self._waker.wait(min((grace.deadline or 0.0) - self._clock(), self.config.monitor_interval))
            else:
                if membership.change is not None and action is not AgentAction.STOP_FINISHED:
                    self._report.change(membership, restarting=action in _RESTARTS,
                                        kept=keeps_workers(action, workers),
                                        own_failure=own_failure_rejoined(action, membership, workers.state),
                                        replaced=workers.replaced)
                return Verdict(action, workers, membership)

    def _in_store_outage(self, membership: MembershipStatus) -> bool:
        """Whether the store does not answer now, or did not within the last lease TTL + 1 s (the
        grace a failure gets to show its cause)."""
        now = self._clock()
        if membership.store_outage > 0:
            self._outage_seen = now
        return self._outage_seen is not None and now - self._outage_seen <= self._lease_ttl + 1.0

    def _would_exclude(self, group: Workers) -> bool:
        policy = self._exclusion
        if policy is None or not self.rendezvous.supports_exclusion:
            return False
        return should_exclude(self._failures_in_a_row, policy.max_node_failures, group.rdzv.group_world_size,
                              policy.min_nodes)

    # -- acting on a verdict: the group is stopped once, then one handler runs -----------------------
    def _act(self, verdict: Verdict) -> Step:
        """Stop the workers (unless the verdict keeps them for the next round), then apply the
        verdict; returns the result, a restart, or None (rejoin)."""
        if not keeps_workers(verdict.action, verdict.workers):
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
                    self._report.host, reason)
        return self._pending(PendingCause.MEMBERSHIP, verdict, reason)

    def _restart_for_outage(self, verdict: Verdict) -> PendingRestart:
        reason = "workers failed while the store did not answer"
        log.warning("Run %s node %s: %s; restarting them without charging --max-restarts (the rejoin waits for "
                    "the store)", self.rendezvous.run_id, self._report.host, reason)
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
                return self._endings.end(0, "closed_while_excluded", "the job ended while this node was excluded")
        self._report.readmitted()
        self._failures_in_a_row = 0
        return None

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
