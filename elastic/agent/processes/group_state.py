"""What a worker group reports and what one of its workers gets: plain values, no processes.

:class:`GroupStatus` and :class:`GroupState` are what :class:`~elastic.agent.processes.workers.WorkerGroup`
answers with (and what the agent's decisions read); :class:`WorkerExtras` is what a worker gets
beyond torchrun's environment.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping

from elastic.agent.processes.failures import WorkerFailure

__all__ = ["GroupState", "GroupStatus", "WorkerExtras"]


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
