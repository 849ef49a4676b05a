"""What a worker group reports and what one of its workers gets: plain values, no processes.

:class:`GroupStatus` and :class:`GroupState` are what :class:`~elastic.agent.processes.workers.WorkerGroup`
answers with; :class:`WorkersView` is one look at any group, what the agent's decisions read;
:class:`WorkerExtras` is what a worker gets beyond torchrun's environment.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping

from elastic.agent.processes.failures import WorkerFailure

__all__ = ["GroupState", "GroupStatus", "WorkerExtras", "WorkersView", "group_status"]


@dataclass(frozen=True)
class WorkerExtras:
    """What one worker gets beyond torchrun's environment (live recovery's round pipes): more
    variables, and descriptors it inherits, each named by the variable that carries its number
    (a forked worker gets them under other numbers, and the variables say which)."""

    env: Mapping[str, str] = field(default_factory=dict)
    fds: Mapping[str, int] = field(default_factory=dict)


class GroupStatus(enum.Enum):
    """Where a worker group stands.

    ``RUNNING`` → ``SUCCEEDED`` (every worker exited 0), ``FAILED`` (a worker exited non-zero or
    was killed before the agent began stopping the group) or ``STOPPED`` (the agent stopped the
    group first). The last three are final.
    """

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class GroupState:
    """A snapshot of a worker group.

    Attributes:
        status: see :class:`GroupStatus`.
        failures: every worker that exited non-zero so far, in exit order; a later snapshot's
            tuple extends an earlier one's. Those killed by :meth:`WorkerGroup.stop` carry
            ``during_stop=True``.
        running: local ranks still running.
    """

    status: GroupStatus
    failures: tuple[WorkerFailure, ...] = ()
    running: frozenset[int] = frozenset()


def group_status(failures: tuple[WorkerFailure, ...], running: frozenset[int], stopping: bool) -> GroupStatus:
    """The status of a group whose workers left ``failures`` and of which ``running`` run, the
    agent having begun to stop it or not (``stopping``). Pure."""
    if any(not failure.during_stop for failure in failures):
        return GroupStatus.FAILED
    if not running and not failures:
        return GroupStatus.SUCCEEDED
    return GroupStatus.STOPPED if stopping else GroupStatus.RUNNING


@dataclass(frozen=True)
class WorkersView:
    """One look at a node's workers, of whatever kind: all the agent decides on in one turn.

    Attributes:
        state: the status, the failures and the running local ranks.
        follows_rounds: the workers outlive their round (live recovery): they wait for the next
            one when their group breaks, so neither a failure nor a peer's rejoin ends the others,
            and a restart may keep them (:func:`~elastic.agent.live.decisions.keeps_workers`).
        unanswered: a worker left the round published to it unanswered past its deadline.
        broken: a worker reported the group of the round its node joined last as lost.
        silent: a running worker never spoke the live protocol (always, for workers that do not
            follow rounds).
        replaced: a failed worker was already replaced in the round in use.
        formed: the round every worker just formed (said once), else None.
    """

    state: GroupState
    follows_rounds: bool = False
    unanswered: bool = False
    broken: bool = False
    silent: bool = True
    replaced: bool = False
    formed: int | None = None

    @property
    def status(self) -> GroupStatus:
        return self.state.status

    @property
    def failures(self) -> tuple[WorkerFailure, ...]:
        return self.state.failures

    @property
    def running(self) -> frozenset[int]:
        return self.state.running
