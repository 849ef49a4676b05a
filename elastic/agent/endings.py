"""How the agent's run ends: each way out shuts the rendezvous down, records the job's end and
gives the :class:`AgentResult`.

The job finished here (the exit barrier), on another node (before or after this node joined),
the restarts ran out (the root cause, the rendezvous closed), a signal stopped the workers, or
the rendezvous failed. The agent (:mod:`elastic.agent.agent`) decides which; this module says
it, once, the same way every time.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from typing import Callable, TypeVar

from elastic.agent.attempts import Attempts
from elastic.agent.decisions import Verdict
from elastic.agent.observe.events import Event
from elastic.agent.observe.report import AgentReport
from elastic.agent.processes.failures import first_failure
from elastic.agent.processes.group_state import GroupStatus
from elastic.agent.restarts import PendingCause, PendingRestart
from elastic.config import LaunchConfig
from elastic.rendezvous.api import MembershipChange, Rendezvous
from elastic.rendezvous.errors import JobFinishedError, RendezvousClosedError, RendezvousError
from elastic.rendezvous.job import arrival_outcome

__all__ = ["AgentResult", "Endings"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class AgentResult:
    """How the agent ended: its exit code and a one-line reason."""

    exit_code: int
    reason: str


class Endings:
    """The ways out of one agent's run (see the module docstring).

    Args:
        config: the launch configuration (the exit barrier's timeout, ``already_finished_ok``).
        rendezvous: shut down at every end.
        report: where the root cause and the job's end are told.
        attempts: the workers (stopped on a signal or a rendezvous error; the last group's report).
        blocking: runs a rendezvous call a signal may interrupt (:meth:`Waker.call`).
    """

    def __init__(self, config: LaunchConfig, rendezvous: Rendezvous, report: AgentReport, attempts: Attempts,
                 blocking: Callable[[Callable[[], T], str], T]) -> None:
        self._config = config
        self._rendezvous = rendezvous
        self._report = report
        self._attempts = attempts
        self._blocking = blocking

    def finish(self) -> AgentResult:
        """Record the job's end, then the exit barrier: wait for the other members' workers.

        The job is finished for everyone as soon as one node's workers all succeeded (torchrun's
        rule), so that is recorded first: no round forms after it, and a member whose workers
        fail now (their peers left) ends instead of training again. There is nothing to close
        after the barrier: the record already stops every join. Best effort, as torchrun's: our
        workers have succeeded, so a backend that goes away now (a c10d host that finished first
        stops its store) is logged, not turned into a failure, and is not retried for long.
        """
        try:
            self._blocking(self._rendezvous.declare_finished, "declare-finished")
        except RendezvousError as error:
            self._warn("could not record the job's end (%s); the workers had finished", error)
        try:
            self._blocking(lambda: self._rendezvous.finish(self._config.exit_barrier_timeout), "exit-barrier")
        except RendezvousError as error:
            self._warn("the exit barrier failed (%s); the workers had finished, so exiting 0", error)
        return self.end(0, "succeeded", "workers finished")

    def stop_finished(self, verdict: Verdict) -> AgentResult:
        """The job finished on another node while this node's workers ran: exit 0, say why, train no more."""
        if verdict.membership.change is MembershipChange.JOB_FINISHED_ELSEWHERE:
            after = "this node's workers ran in a round without it: stopped them, not training again"
        else:
            after = (f"this node's workers {'failed' if verdict.state.status is GroupStatus.FAILED else 'stopped'} "
                     "after that, most likely because their peers left: not training again")
        return self._finished(f"{verdict.membership.reason}; {after}")

    def finished_before_joining(self, finished: JobFinishedError, pending: PendingRestart | None) -> AgentResult:
        """The job finished while this node was (re)joining: a member exits 0 without training
        again; a node in no round yet ends as :func:`arrival_outcome` says (exit 3 when it
        arrived after the end)."""
        ended = f"the job finished on node {finished.node_id} in round {finished.round}"
        if self._attempts.last is None:
            outcome = arrival_outcome(finished.node_id, finished.round, finished.joined,
                                      self._config.rendezvous.already_finished_ok)
            if outcome.exit_code == 0:  # a non-zero exit's reason is printed by the launcher
                self._warn("%s", outcome.line)
            return self.end(outcome.exit_code, outcome.status, outcome.line)
        if pending is not None and pending.cause is PendingCause.FAILURE:
            after = "this node's workers failed after that, most likely because their peers left"
        else:
            after = f"this node's workers were stopped after that ({pending.reason if pending else 'a restart'})"
        return self._finished(f"{ended}; {after}: not training again")

    def give_up(self, verdict: Verdict, restarts_used: int) -> AgentResult:
        """No restart left: print the root cause, close the rendezvous for everyone, exit 1."""
        first = first_failure(verdict.state.failures)
        last = self._attempts.last
        summary = last.failure_report(self._report.host) if first and last else ""
        title = self._report.root_cause(summary)
        reason = f"node {self._report.host} gave up after {restarts_used} restarts"
        self._blocking(lambda: self._rendezvous.set_closed(reason), "close")
        return self.end(1, "failed", title or "workers failed")

    def signalled(self, signum: int) -> AgentResult:
        """A signal arrived: the workers get it and stop; exit 128 + its number."""
        name = signal.Signals(signum).name
        self._warn("received %s; stopping the workers", name)
        self._attempts.stop(forward=signum)
        return self.end(128 + signum, f"signalled:{name}", f"the agent received {name}; workers stopped")

    def rendezvous_failed(self, error: RendezvousError) -> AgentResult:
        """The rendezvous failed for good: stop the workers and say why."""
        self._attempts.stop()
        if isinstance(error, JobFinishedError):
            return self.finished_before_joining(error, None)
        if isinstance(error, RendezvousClosedError) and error.job_finished and self._attempts.last is None:
            # A late (or restarted) agent of a job that already succeeded: nothing to do.
            reason = f"{error}; nothing to do (use a new --rdzv-id to run the job again)"
            self._warn("%s", reason)
            return self.end(0, "already_finished", reason)
        status = "rendezvous_closed" if isinstance(error, RendezvousClosedError) else "rendezvous_error"
        return self.end(1, status, str(error))

    def end(self, exit_code: int, status: str, reason: str) -> AgentResult:
        """Shut the rendezvous down and record the job's end on this node."""
        self._rendezvous.shutdown()
        self._report.events.emit(Event.JOB_FINISHED, status=status)
        return AgentResult(exit_code, reason)

    def _finished(self, reason: str) -> AgentResult:
        self._warn("%s", reason)
        return self.end(0, "finished_elsewhere", reason)

    def _warn(self, message: str, *args: object) -> None:
        log.warning("Run %s node %s: " + message, self._rendezvous.run_id, self._report.host, *args)
