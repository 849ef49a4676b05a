"""Live recovery's pure decisions: keep the workers or stop them, replace a failed one at once,
and whether they answered a round. The first two read one :class:`WorkersView` of any group.

Tested with case tables in ``tests/agent/test_live_decisions.py``; no processes, no clocks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from elastic.agent.decisions import AgentAction
from elastic.agent.processes.group_state import GroupStatus, WorkersView

KEPT_ACTIONS = frozenset({AgentAction.RESTART_AFTER_FAILURE, AgentAction.RESTART_FOR_MEMBERSHIP,
                          AgentAction.REJOIN_BROKEN})
"""The restarts live recovery turns into a rejoin with the workers kept: a peer's failure, a lost
or a new node, this node's own dead workers (the others keep training, the dead restart), a
group a live worker reported broken."""


def keeps_workers(action: AgentAction, workers: WorkersView) -> bool:
    """Whether the agent rejoins without stopping its workers.

    Only for workers that follow rounds (a job that opted in), only for a failure or membership
    restart, and never when a worker left the last published round unanswered (a worker stuck
    outside the live protocol cannot be trusted to follow the next round either) or has never
    written a line on its ready pipe (``silent``: a script without LiveTraining, or one still
    importing): those get today's whole-group restart. Publishing to a worker that never answers
    would only wait out the deadline, and its restart would make the peers publish to theirs,
    round after round.
    """
    return workers.follows_rounds and action in KEPT_ACTIONS and not workers.unanswered and not workers.silent


def refills(workers: WorkersView, restart_left: bool, prewarmed: bool) -> bool:
    """Whether the agent replaces its failed live workers in the round in use, before the
    rendezvous (:mod:`elastic.worker.refill`).

    Only for a failed group of workers that follow rounds, with a restart left (without one the
    failure ends the job), not when :func:`keeps_workers` would stop the group anyway (a worker
    left a round unanswered or never spoke the live protocol), and only with pre-warmed
    replacements: a fresh process imports torch for seconds, by which time the next round has
    usually closed and the master node's store has moved on, so it would only connect to a round
    that is gone (and, in torch 2.13, a store connect left behind that way was seen to abort the
    worker).
    """
    return (workers.status is GroupStatus.FAILED and workers.follows_rounds and restart_left
            and not workers.unanswered and not workers.silent and prewarmed)


class RoundAnswer(enum.Enum):
    """Where the workers stand on the round the agent published last.

    NONE_DUE: nothing published since the workers started (or every answer came) → nothing to
    wait for. WAITING: a live worker has not yet formed the round, the deadline runs. ANSWERED:
    every live worker formed it (or a newer one). OVERDUE: the deadline passed first → restart the
    group as without live recovery.
    """

    NONE_DUE = "none_due"
    WAITING = "waiting"
    ANSWERED = "answered"
    OVERDUE = "overdue"


@dataclass(frozen=True)
class AnswerView:
    """The published round, and per live local rank the newest round it formed (-1: none)."""

    published: int | None
    formed: dict[int, int]
    deadline_over: bool


def decide_answer(view: AnswerView) -> RoundAnswer:
    """Whether the live workers answered the round published last.

    A worker that exited is not waited for (its exit is the agent's to handle); a worker that
    formed a newer round than the published one answered it (the rounds raced on the pipe).
    """
    if view.published is None:
        return RoundAnswer.NONE_DUE
    if all(formed >= view.published for formed in view.formed.values()):
        return RoundAnswer.ANSWERED
    return RoundAnswer.OVERDUE if view.deadline_over else RoundAnswer.WAITING


def group_broken(current_round: int, lost: dict[int, int]) -> bool:
    """Whether a live worker reported the group of ``current_round`` (the round this node joined
    last) as lost; ``lost``: per running local rank, the newest round it reported lost (-1: none).

    A report for an older round raced with a round the agent already joined and published: that
    round is being formed, there is nothing to rejoin for.
    """
    return any(round_ >= current_round for round_ in lost.values())
