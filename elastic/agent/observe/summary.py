"""The run's summary at exit: one to three lines from the events this node's agent emitted.

:class:`RunTally` listens to the event log (:meth:`EventLog.listen`) and keeps what a person
asks at the end of a run: how many attempts, how many restarts and why, which nodes came and
went, how it ended. :func:`summary_lines` (pure) words it, e.g.::

    run 44d0b54c node host-a-1234-5f6e7d: succeeded after 4.1s; 1 attempt, no restarts
    run job-42 node host-a-1234-5f6e7d: failed after 3m 05s; 4 attempts, 3 restarts (2 worker failures, 1 membership change)
    run job-42 nodes: 3 took part (a, b, c); came later: c; went: b
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from elastic.agent.observe.events import Event, RestartCause

MAX_NAMED = 6
"""At most this many node ids are named in a list; the rest are counted."""

_CAUSES = {RestartCause.WORKER_FAILURE.value: "worker failure", RestartCause.MEMBERSHIP_CHANGE.value: "membership change",
           RestartCause.STORE_OUTAGE.value: "store outage"}
_OUTCOMES = {
    "succeeded": "succeeded",
    "failed": "failed",
    "finished_elsewhere": "finished (the job ended on another node)",
    "already_finished": "did nothing (the job had already finished)",
    "finished_while_waiting": "did nothing (the job finished while this node waited to join)",
    "closed_by_peer": "stopped (another node closed the rendezvous)",
    "store_unreachable": "stopped (the store did not answer)",
    "closed_while_excluded": "ended while this node was excluded",
    "rendezvous_closed": "stopped (the rendezvous was closed)",
    "rendezvous_error": "failed in the rendezvous",
}


@dataclass(frozen=True)
class RunFacts:
    """What the summary says, as counted from the events.

    Attributes:
        rounds: the members of each round this node joined, in order (one round per attempt).
        restarts: restarts by cause (``RestartCause`` values).
        status: the ``job_finished`` status (None: no such event).
    """

    rounds: tuple[tuple[str, ...], ...] = ()
    restarts: Mapping[str, int] = field(default_factory=dict)
    status: str | None = None


class RunTally:
    """Counts event records (give it to :meth:`EventLog.listen`); :meth:`facts` says what it saw."""

    def __init__(self) -> None:
        self._rounds: list[tuple[str, ...]] = []
        self._restarts: Counter[str] = Counter()
        self._status: str | None = None

    def __call__(self, record: Mapping[str, Any]) -> None:
        event = record.get("event")
        if event == Event.ROUND_JOINED:
            self._rounds.append(tuple(str(member) for member in record.get("members", ())))
        elif event == Event.RESTART:
            self._restarts[_text(record.get("cause"))] += 1
        elif event == Event.JOB_FINISHED:
            self._status = _text(record.get("status"))

    def facts(self) -> RunFacts:
        return RunFacts(tuple(self._rounds), dict(self._restarts), self._status)


def summary_lines(facts: RunFacts, *, run_id: str, node: str, wall_s: float, exit_code: int) -> list[str]:
    """The summary: outcome, wall time, attempts and restarts by cause; then, when more than
    one node took part, which nodes did and which came later or went."""
    attempts = len(facts.rounds)
    lines = [f"run {run_id} node {node}: {outcome_text(facts.status, exit_code)} after {duration_text(wall_s)}; "
             f"{_count(attempts, 'attempt')}, {restarts_text(facts.restarts)}"]
    nodes = _ordered(member for members in facts.rounds for member in members)
    came, went = comings_and_goings(facts.rounds)
    if len(nodes) > 1 or came or went:
        parts = [f"{_count(len(nodes), 'node')} took part ({names_text(nodes)})"]
        if came:
            parts.append(f"came later: {names_text(came)}")
        if went:
            parts.append(f"went: {names_text(went)}")
        lines.append(f"run {run_id} nodes: " + "; ".join(parts))
    return lines


def outcome_text(status: str | None, exit_code: int) -> str:
    """How the run ended, in words, from the ``job_finished`` status (or the exit code)."""
    if status is None:
        return f"ended with exit code {exit_code}"
    if status.startswith("signalled:"):
        return f"stopped by {status.partition(':')[2]}"
    return _OUTCOMES.get(status, status.replace("_", " "))


def restarts_text(restarts: Mapping[str, int]) -> str:
    """``no restarts``, or ``3 restarts (2 worker failures, 1 membership change)``."""
    total = sum(restarts.values())
    if not total:
        return "no restarts"
    causes = ", ".join(_count(count, _CAUSES.get(cause, cause.replace("_", " ")))
                       for cause, count in sorted(restarts.items(), key=lambda item: (-item[1], item[0])) if count)
    return f"{_count(total, 'restart')} ({causes})"


def comings_and_goings(rounds: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The nodes that joined after the first round, and those that left a round, each once, in order."""
    came: list[str] = []
    went: list[str] = []
    for before, after in zip(rounds, rounds[1:]):
        came += [node for node in after if node not in before]
        went += [node for node in before if node not in after]
    return _ordered(came), _ordered(went)


def duration_text(seconds: float) -> str:
    """``4.1s``, ``3m 05s``, ``2h 07m``."""
    if seconds < 60:
        return f"{max(seconds, 0.0):.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def names_text(nodes: tuple[str, ...]) -> str:
    named = ", ".join(nodes[:MAX_NAMED])
    return named + (f" and {len(nodes) - MAX_NAMED} more" if len(nodes) > MAX_NAMED else "")


def _text(value: Any) -> str:
    """An event field as written to the log (an enum's value, not its name)."""
    return str(value.value if isinstance(value, enum.Enum) else value)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _ordered(items: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))
