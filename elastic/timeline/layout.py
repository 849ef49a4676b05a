"""From the event records of every node to what the timeline draws: a pure function, no I/O.

`layout(records)` gives a `Timeline`: one `Lane` per node id (ordered by first appearance),
`Bar` s for the rendezvous waits, the attempts (a round's workers running) and exclusions,
`Mark` s for worker exits, restarts, lost members, waiting nodes and endings, each with its
cause, and the world size per round as `WorldStep` s. Times are seconds from the first thing
drawn (``origin``, wall-clock seconds since the epoch); they are each agent's own wall clock.

Two things are inferred, and said so in their labels:
* a restart is recorded once the next round closed; its mark sits where the group stopped
  (the start of that round's rendezvous), where a reader looks for it;
* an agent whose log ends without ``job_finished`` was killed or lost: its last attempt is drawn
  open (``ended=False``) to when a peer first acted on its loss (see `_noticed_lost`), or to the end.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from elastic.agent.observe.events import Event
from elastic.timeline.records import Record

__all__ = ["Bar", "BarKind", "Lane", "Mark", "MarkKind", "Summary", "Timeline", "WorldStep", "layout"]

GONE = "gone"
"""A lane's ending when its log has no ``job_finished``."""


class BarKind(str, enum.Enum):
    """What a bar spans."""

    RENDEZVOUS = "rendezvous"
    ATTEMPT = "attempt"
    EXCLUDED = "excluded"


class MarkKind(str, enum.Enum):
    """What a mark marks; the value is the event's name (``gone``: no ``job_finished``)."""

    WORKER_EXIT = "worker_exit"
    RESTART = "restart"
    MEMBER_LOST = "member_lost"
    NODES_WAITING = "nodes_waiting"
    EXCLUDED = "node_excluded"
    FINISHED = "job_finished"
    GONE = "gone"


@dataclass(frozen=True)
class Lane:
    """One node id: its host, run, first and last time, rounds joined, and how it ended
    (``job_finished``'s status, or `GONE`)."""

    node: str
    host: str
    run_id: str
    start: float
    end: float
    rounds: tuple[int, ...]
    ending: str


@dataclass(frozen=True)
class Bar:
    """A span on lane ``lane``; ``ended`` is False when its end was not recorded."""

    lane: int
    kind: BarKind
    start: float
    end: float
    round: int | None
    label: str
    ended: bool = True


@dataclass(frozen=True)
class Mark:
    """A moment on lane ``lane`` with its cause (a restart cause, ``SIGKILL``, ``exit 1``, a status...)."""

    lane: int
    kind: MarkKind
    at: float
    cause: str
    label: str


@dataclass(frozen=True)
class WorldStep:
    """From ``at`` on, round ``round`` has ``size`` (workers or nodes: `Timeline.world_unit`)."""

    at: float
    size: int
    round: int


@dataclass(frozen=True)
class Summary:
    """The run in numbers: rounds, restarts by cause, worker exits by cause, nodes that came
    and the ones that went without finishing."""

    rounds: int
    restarts: tuple[tuple[str, int], ...]
    worker_exits: tuple[tuple[str, int], ...]
    nodes: int
    gone: int


@dataclass(frozen=True)
class Timeline:
    """Everything the page draws; see the module docstring."""

    origin: float
    span: float
    run_ids: tuple[str, ...]
    lanes: tuple[Lane, ...]
    bars: tuple[Bar, ...]
    marks: tuple[Mark, ...]
    world: tuple[WorldStep, ...]
    world_unit: str
    summary: Summary


def layout(records: Iterable[Record]) -> Timeline:
    """The timeline of ``records`` (any order, any number of nodes and files).

    Raises:
        ValueError: there is no record.
    """
    ordered = sorted(records, key=lambda r: r.at)
    if not ordered:
        raise ValueError("There are no events to draw.")
    origin = min(_began(r) for r in ordered)
    end = max(r.at for r in ordered) - origin
    by_node: dict[str, list[Record]] = {}
    for record in ordered:
        by_node.setdefault(record.node, []).append(record)
    lanes, bars, marks = [], [], []
    for index, (node, own) in enumerate(by_node.items()):
        noticed = _noticed_lost(node, own[-1].at, by_node)
        lane, lane_bars, lane_marks = _lane(index, own, origin, end, None if noticed is None else noticed - origin)
        lanes.append(lane)
        bars.extend(lane_bars)
        marks.extend(lane_marks)
    world, unit = _world(ordered, origin)
    span = max([end, *(b.end for b in bars)])
    return Timeline(origin, span, tuple(dict.fromkeys(r.run_id for r in ordered)), tuple(lanes), tuple(bars),
                    tuple(marks), world, unit, _summary(ordered, lanes, marks, world))


def _began(record: Record) -> float:
    """When what ``record`` draws begins: a round's rendezvous began ``duration_s`` before it closed."""
    if record.event is Event.ROUND_JOINED:
        return record.at - max(0.0, float(record.fields["duration_s"]))
    return record.at


def _lane(index: int, own: Sequence[Record], origin: float, end: float,
          noticed: float | None) -> tuple[Lane, list[Bar], list[Mark]]:
    bars: list[Bar] = []
    marks: list[Mark] = []
    attempt: tuple[float, int, str] | None = None  # start, round, label
    stopped_at: float | None = None  # where the last rendezvous began: the restart's mark goes there
    rounds: list[int] = []
    ending = GONE
    for record in own:
        t, f = record.at - origin, record.fields
        if record.event is Event.ROUND_JOINED:
            began = _began(record) - origin
            if attempt is not None:
                began = max(began, attempt[0])
                bars.append(Bar(index, BarKind.ATTEMPT, attempt[0], began, attempt[1], attempt[2]))
            bars.append(Bar(index, BarKind.RENDEZVOUS, began, t, f["round"],
                            f"rendezvous for round {f['round']}: {t - began:.2f} s"))
            attempt, stopped_at = (t, f["round"], _attempt_label(f)), began
            rounds.append(f["round"])
        elif record.event is Event.RESTART:
            at = stopped_at if stopped_at is not None else t
            left = f" ({f['remaining']} left)" if "remaining" in f else ""
            reason = f": {f['reason']}" if f.get("reason") else ""
            marks.append(Mark(index, MarkKind.RESTART, at, f["cause"],
                              f"restart ({f['cause']}){left}{reason}; recorded at {_clock(t)} once the next "
                              "round closed"))
        elif record.event is Event.WORKER_EXIT:
            cause = f.get("signal") or f"exit {f.get('exitcode')}"
            marks.append(Mark(index, MarkKind.WORKER_EXIT, t, cause,
                              f"worker rank {f.get('global_rank')} (local {f.get('local_rank')}) {cause} at {_clock(t)}"))
        elif record.event is Event.MEMBER_LOST:
            marks.append(Mark(index, MarkKind.MEMBER_LOST, t, "member_lost",
                              f"member lost at {_clock(t)}: {f.get('reason', '')}"))
        elif record.event is Event.NODES_WAITING:
            marks.append(Mark(index, MarkKind.NODES_WAITING, t, "nodes_waiting",
                              f"{f.get('count', '?')} node(s) waiting at {_clock(t)}: {f.get('reason', '')}"))
        elif record.event is Event.NODE_EXCLUDED:
            bars.append(Bar(index, BarKind.EXCLUDED, t, t + f["cooldown_s"], None,
                            f"excluded for {f['cooldown_s']:g} s: {f.get('reason', '')}"))
            marks.append(Mark(index, MarkKind.EXCLUDED, t, "excluded", f"excluded at {_clock(t)}: {f.get('reason', '')}"))
        elif record.event is Event.JOB_FINISHED:
            if attempt is not None:
                bars.append(Bar(index, BarKind.ATTEMPT, attempt[0], max(t, attempt[0]), attempt[1], attempt[2]))
                attempt = None
            ending = f["status"]
            marks.append(Mark(index, MarkKind.FINISHED, t, ending, f"finished at {_clock(t)}: {ending}"))
    last = own[-1].at - origin
    lane_end = last
    if ending == GONE:
        lane_end = noticed if noticed is not None and noticed >= last else max(end, last)
        seen = (f"a peer acted on its loss at {_clock(noticed)}" if noticed is not None and noticed >= last
                else "no peer acted on its loss")
        if attempt is not None:
            bars.append(Bar(index, BarKind.ATTEMPT, attempt[0], max(lane_end, attempt[0]), attempt[1],
                            f"{attempt[2]}; end not recorded", ended=False))
        marks.append(Mark(index, MarkKind.GONE, lane_end, GONE,
                          f"no job_finished: the agent's last event was at {_clock(last)} (killed or lost?); {seen}"))
    first = min([own[0].at - origin, *(b.start for b in bars)])
    lane = Lane(own[0].node, own[0].host, own[0].run_id, first, lane_end, tuple(rounds), ending)
    return lane, bars, marks


def _attempt_label(fields: dict) -> str:
    workers = f", {fields['world_size']} workers" if "world_size" in fields else ""
    rank = f"group rank {fields['group_rank']} of " if "group_rank" in fields else ""
    return f"round {fields['round']}: {rank}{fields['group_world_size']} nodes{workers}"


def _noticed_lost(node: str, last: float, by_node: dict[str, list[Record]]) -> float | None:
    """When a peer first acted on ``node``'s loss after ``node``'s last record; None if no peer
    did (or ``node`` finished).

    A peer acted when it began the rendezvous of a round without ``node`` right after one with
    it (whether it first saw the loss or its workers' failure), or reported a member lost while
    its latest round had ``node``.
    """
    if by_node[node][-1].event is Event.JOB_FINISHED:
        return None
    times = []
    for peer, own in by_node.items():
        if peer == node:
            continue
        members: list[str] | None = None
        for record in own:
            if record.event is Event.ROUND_JOINED:
                had = members is not None and node in members
                members = record.fields.get("members")
                if had and members is not None and node not in members and record.at >= last:
                    times.append(max(_began(record), last))
                    break
            elif record.event is Event.MEMBER_LOST and record.at >= last and members is not None and node in members:
                times.append(record.at)
                break
    return min(times, default=None)


def _world(ordered: Sequence[Record], origin: float) -> tuple[tuple[WorldStep, ...], str]:
    """The size of each round from when it first closed: workers when every round says, else nodes."""
    joins = [r for r in ordered if r.event is Event.ROUND_JOINED]
    unit = "workers" if joins and all("world_size" in r.fields for r in joins) else "nodes"
    key = "world_size" if unit == "workers" else "group_world_size"
    first: dict[tuple[str, int], Record] = {}
    for record in joins:
        first.setdefault((record.run_id, record.fields["round"]), record)
    steps = [WorldStep(r.at - origin, r.fields[key], r.fields["round"]) for r in first.values()]
    return tuple(sorted(steps, key=lambda s: s.at)), unit


def _summary(ordered: Sequence[Record], lanes: Sequence[Lane], marks: Sequence[Mark],
             world: Sequence[WorldStep]) -> Summary:
    """Restarts count once per round they led to and cause (every member records the same one);
    a restart before any round of its node (a log cut at the start) counts on its own."""
    current: dict[str, int] = {}
    restarts: set[tuple[str, int | str, str]] = set()
    for record in ordered:
        if record.event is Event.ROUND_JOINED:
            current[record.node] = record.fields["round"]
        elif record.event is Event.RESTART:
            restarts.add((record.run_id, current.get(record.node, record.node), record.fields["cause"]))
    by_cause = Counter(cause for _, _, cause in restarts)
    exits = Counter(m.cause for m in marks if m.kind is MarkKind.WORKER_EXIT)
    return Summary(len(world), tuple(sorted(by_cause.items())), tuple(sorted(exits.items())), len(lanes),
                   sum(1 for lane in lanes if lane.ending == GONE))


def _clock(seconds: float) -> str:
    """``+12.34 s``: a time on the timeline."""
    return f"+{seconds:.2f} s"
