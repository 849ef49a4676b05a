"""From the event records of every node to what the timeline draws: a pure function, no I/O.

`layout(records)` gives a `Timeline`: one `Lane` per machine (a host; a restarted agent, a new
node id, stays on its machine's lane: see :mod:`~elastic.timeline.machines`), `Bar` s for the
rendezvous waits, the training (a round's workers training), the stalls (the round stopped: its
workers failed, wait or are stopped) and exclusions, `Mark` s for worker exits, restarts, live
heals, lost members, waiting nodes and endings, each with its cause, the world size per round as
`WorldStep` s, and the job's downtime as `Interruption` s (:mod:`~elastic.timeline.downtime`).
Times are seconds from the first thing drawn (``origin``, wall-clock seconds since the epoch);
they are each agent's own wall clock.

What is inferred (:mod:`~elastic.timeline.rounds`) is said so in the labels:
* training stops on every member of a round at the round's first failure or leaving;
* an agent whose log ends without ``job_finished`` was killed or lost: it is drawn to the first
  sign of its loss its peers recorded, with an open (striped) end, or to the end without one;
* a restart is recorded once the next round closed; its mark sits where the group stopped (the
  start of that round's rendezvous); it is a **heal** when the node kept every worker
  (``--live-recovery``: ``workers_started`` with none started).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from elastic.agent.observe.events import Event
from elastic.timeline.downtime import Interruption, interruptions
from elastic.timeline.machines import Occupant, machine_lanes
from elastic.timeline.records import Record
from elastic.timeline.rounds import NodeLog, NodeRound, RoundSpan, Sign, noticed_lost, read_nodes, round_spans

__all__ = ["Agent", "Bar", "BarKind", "Interruption", "Lane", "Mark", "MarkKind", "Summary", "Timeline",
           "WorldStep", "layout"]

GONE = "gone"
"""An agent's ending when its log has no ``job_finished``."""


class BarKind(str, enum.Enum):
    """What a bar spans."""

    RENDEZVOUS = "rendezvous"
    ATTEMPT = "attempt"
    """The round's workers training."""
    RESUMING = "resuming"
    """The round closed, the workers not training yet (kept ones re-forming, new ones starting)."""
    STALLED = "stalled"
    """The round stopped (a failure, a member left or died): no training until the next round."""
    EXCLUDED = "excluded"


class MarkKind(str, enum.Enum):
    """What a mark marks; the value is the event's name (``gone``: no ``job_finished``; ``heal``:
    a restart in which the node kept its workers)."""

    WORKER_EXIT = "worker_exit"
    RESTART = "restart"
    HEAL = "heal"
    MEMBER_LOST = "member_lost"
    NODES_WAITING = "nodes_waiting"
    EXCLUDED = "node_excluded"
    FINISHED = "job_finished"
    GONE = "gone"


@dataclass(frozen=True)
class Lane:
    """One machine: its host, the node ids of its agents in order, its run, first and last time,
    rounds joined, and how its last agent ended (``job_finished``'s status, or `GONE`)."""

    host: str
    nodes: tuple[str, ...]
    run_id: str
    start: float
    end: float
    rounds: tuple[int, ...]
    ending: str


@dataclass(frozen=True)
class Agent:
    """One agent (node id) on lane ``lane``: its time, rounds and ending; ``lost``: how its loss
    was seen ("" when it finished)."""

    node: str
    host: str
    lane: int
    start: float
    end: float
    rounds: tuple[int, ...]
    ending: str
    lost: str = ""


@dataclass(frozen=True)
class Bar:
    """A span on lane ``lane`` of agent ``node``; ``ended`` is False when its end was not recorded."""

    lane: int
    kind: BarKind
    start: float
    end: float
    round: int | None
    label: str
    ended: bool = True
    node: str = ""


@dataclass(frozen=True)
class Mark:
    """A moment on lane ``lane`` (agent ``node``) with its cause (a restart cause, ``SIGKILL``,
    ``exit 1``, a status...)."""

    lane: int
    kind: MarkKind
    at: float
    cause: str
    label: str
    node: str = ""


@dataclass(frozen=True)
class WorldStep:
    """From ``at`` on, round ``round`` has ``size`` (workers or nodes: `Timeline.world_unit`)."""

    at: float
    size: int
    round: int


@dataclass(frozen=True)
class Summary:
    """The run in numbers: rounds, restarts by cause, live heals, worker exits by cause, agents
    (node ids) on how many machines and how many went without finishing, and the downtime."""

    rounds: int
    restarts: tuple[tuple[str, int], ...]
    worker_exits: tuple[tuple[str, int], ...]
    nodes: int
    gone: int
    machines: int = 0
    heals: int = 0
    downtime: float = 0.0
    interruptions: int = 0


@dataclass(frozen=True)
class Timeline:
    """Everything the page draws; see the module docstring. ``downtime``: relative times."""

    origin: float
    span: float
    run_ids: tuple[str, ...]
    lanes: tuple[Lane, ...]
    bars: tuple[Bar, ...]
    marks: tuple[Mark, ...]
    world: tuple[WorldStep, ...]
    world_unit: str
    summary: Summary
    agents: tuple[Agent, ...] = ()
    downtime: tuple[Interruption, ...] = ()


def layout(records: Iterable[Record]) -> Timeline:
    """The timeline of ``records`` (any order, any number of nodes and files). O(n log n) in the
    records (members lists are bounded).

    Raises:
        ValueError: there is no record.
    """
    nodes = read_nodes(records)
    if not nodes:
        raise ValueError("There are no events to draw.")
    spans, deaths = round_spans(nodes, noticed_lost(nodes))
    origin = min(n.first for n in nodes)
    end = max(n.last for n in nodes)
    lane_of = machine_lanes([Occupant(n.host, n.source, n.first, n.last) for n in nodes])
    successor = _successors(nodes, lane_of)
    by_key = {(s.run_id, s.round): s for s in spans}
    bars: list[Bar] = []
    marks: list[Mark] = []
    agents: list[Agent] = []
    for index, log in enumerate(nodes):
        drawn = _Drawing(log, lane_of[index], origin, end, by_key, deaths.get(log.node), successor.get(index))
        agents.append(drawn.draw())
        bars += drawn.bars
        marks += drawn.marks
    downtime = tuple(_relative(i, origin) for i in interruptions(spans, end))
    world, unit = _world(nodes, origin)
    lanes = _lanes(agents, nodes)
    span = max([end - origin, *(b.end for b in bars), *(m.at for m in marks)])
    return Timeline(origin, span, tuple(dict.fromkeys(n.run_id for n in nodes)), lanes, tuple(bars), tuple(marks),
                    world, unit, _summary(nodes, agents, lanes, marks, world, downtime), tuple(agents), downtime)


def _successors(nodes: Sequence[NodeLog], lane_of: Sequence[int]) -> dict[int, float]:
    """Per agent, when the next agent on its lane began (it was gone by then)."""
    following: dict[int, float] = {}
    last_on: dict[int, int] = {}
    for index in sorted(range(len(nodes)), key=lambda i: nodes[i].first):
        before = last_on.get(lane_of[index])
        if before is not None:
            following[before] = nodes[index].first
        last_on[lane_of[index]] = index
    return following


class _Drawing:
    """The bars, marks and `Agent` of one agent's log."""

    def __init__(self, log: NodeLog, lane: int, origin: float, end: float, spans: Mapping[tuple[str, int], RoundSpan],
                 death: Sign | None, successor: float | None) -> None:
        self.log, self.lane, self.origin, self.spans = log, lane, origin, spans
        self.bars: list[Bar] = []
        self.marks: list[Mark] = []
        cap = successor if successor is not None else float("inf")
        if log.status is None:
            self.death = None if death is None else replace(death, at=min(death.at, cap))
            self.gone_at = self.death.at if self.death is not None else min(max(end, log.last), cap)
        else:
            self.death, self.gone_at = None, log.last

    def t(self, at: float) -> float:
        return at - self.origin

    def draw(self) -> Agent:
        log = self.log
        for node_round in log.rounds:
            self._round(node_round)
        self._events()
        lost = ""
        if log.status is None:
            last = self.t(log.last)
            seen = (f"drawn to the first sign of its loss its peers recorded, at {_clock(self.t(self.death.at))}: "
                    f"{self.death.first_sign}" if self.death is not None else "no peer recorded a sign of its loss")
            lost = f"no job_finished: the agent's last event was at {_clock(last)} (killed or lost?); {seen}"
            self.marks.append(Mark(self.lane, MarkKind.GONE, self.t(self.gone_at), GONE, lost))
        self.bars = [replace(bar, node=log.node) for bar in self.bars]
        self.marks = [replace(mark, node=log.node) for mark in self.marks]
        first = min([self.t(log.first), *(b.start for b in self.bars)])
        ending = log.status if log.status is not None else GONE
        return Agent(log.node, log.host, self.lane, first, self.t(self.gone_at), tuple(r.round for r in log.rounds),
                     ending, lost)

    def _round(self, mine: NodeRound) -> None:
        """The rendezvous, then resuming, training and stalled bars of this node in round ``mine``."""
        lane, t, label = self.lane, self.t, _round_label(mine)
        self.bars.append(Bar(lane, BarKind.RENDEZVOUS, t(mine.began), t(mine.joined), mine.round,
                             f"rendezvous for round {mine.round}: {mine.joined - mine.began:.2f} s"))
        span = self.spans[(mine.run_id, mine.round)]
        # Where this node's part of the round ends: it left, or (gone) died or the timeline ends.
        until, ended = (mine.left.at, True) if mine.left is not None else (self.gone_at, self.log.status is not None)
        # The round stops for every member at its first stop, unless that was the job finishing.
        stop = min(span.stop.at if span.stop is not None and span.stop.kind != "finished" else until, until)
        trains = mine.trains
        if trains is None or trains >= stop:
            self._never_trained(mine, span, stop, until, ended)
            return
        if trains > mine.joined:
            doing = "kept workers re-forming the group" if mine.kept else "workers starting"
            self.bars.append(Bar(lane, BarKind.RESUMING, t(mine.joined), t(trains), mine.round,
                                 f"{label}; {doing} until {_clock(t(trains))}"))
        open_end = not ended and stop >= until
        self.bars.append(Bar(lane, BarKind.ATTEMPT, t(trains), t(stop), mine.round,
                             f"{label}; training {_clock(t(trains))} to {_clock(t(stop))}"
                             + ("; end not recorded (the agent was lost)" if open_end else ""), not open_end))
        if stop < until:
            self._stalled(mine, span, stop, until, ended)

    def _never_trained(self, mine: NodeRound, span: RoundSpan, stop: float, until: float, ended: bool) -> None:
        """Round ``mine`` in which this node's workers did not train: resuming until the round
        stopped (or this node's part of it ended), stalled after."""
        waited = until if mine.trains is None else stop
        if mine.trains is None:
            why = "its kept workers did not form the round" if mine.kept else "its workers did not start"
        else:
            why = f"the round stopped first ({span.stop.what if span.stop else 'its end'})"
        if waited > mine.joined:
            self.bars.append(Bar(self.lane, BarKind.RESUMING, self.t(mine.joined), self.t(waited), mine.round,
                                 f"{_round_label(mine)}; not training: {why}", ended or waited < until))
        if waited < until:
            self._stalled(mine, span, waited, until, ended)

    def _stalled(self, mine: NodeRound, span: RoundSpan, stop: float, until: float, ended: bool) -> None:
        why = span.stop.what if span.stop is not None else "?"
        leaving = mine.left.what if mine.left is not None else "the agent's end"
        self.bars.append(Bar(self.lane, BarKind.STALLED, self.t(stop), self.t(until), mine.round,
                             f"round {mine.round} stopped at {_clock(self.t(stop))}: {why}; not training until "
                             f"{_clock(self.t(until))} ({leaving})", ended))

    def _events(self) -> None:
        lane, t = self.lane, self.t
        rounds = {r.round: r for r in self.log.rounds}
        current: NodeRound | None = None
        for record in self.log.records:
            at, f = t(record.at), record.fields
            if record.event is Event.ROUND_JOINED:
                current = rounds.get(f["round"], current)
            elif record.event is Event.RESTART:
                self.marks.append(_restart_mark(lane, record, current, self.origin))
            elif record.event is Event.WORKER_EXIT:
                cause = f.get("signal") or f"exit {f.get('exitcode')}"
                self.marks.append(Mark(lane, MarkKind.WORKER_EXIT, at, cause,
                                       f"worker rank {f.get('global_rank')} (local {f.get('local_rank')}) {cause} "
                                       f"at {_clock(at)}"))
            elif record.event is Event.MEMBER_LOST:
                self.marks.append(Mark(lane, MarkKind.MEMBER_LOST, at, "member_lost",
                                       f"member lost at {_clock(at)}: {f.get('reason', '')}"))
            elif record.event is Event.NODES_WAITING:
                self.marks.append(Mark(lane, MarkKind.NODES_WAITING, at, "nodes_waiting",
                                       f"{f.get('count', '?')} node(s) waiting at {_clock(at)}: {f.get('reason', '')}"))
            elif record.event is Event.NODE_EXCLUDED:
                self.bars.append(Bar(lane, BarKind.EXCLUDED, at, at + f["cooldown_s"], None,
                                     f"excluded for {f['cooldown_s']:g} s: {f.get('reason', '')}"))
                self.marks.append(Mark(lane, MarkKind.EXCLUDED, at, "excluded",
                                       f"excluded at {_clock(at)}: {f.get('reason', '')}"))
            elif record.event is Event.JOB_FINISHED:
                self.marks.append(Mark(lane, MarkKind.FINISHED, at, f["status"], f"finished at {_clock(at)}: "
                                       f"{f['status']}"))


def _restart_mark(lane: int, record: Record, current: NodeRound | None, origin: float) -> Mark:
    """A restart's mark where the group stopped (its round's rendezvous began); a heal when the
    node kept every worker into that round."""
    f, at = record.fields, record.at - origin
    where = current.began - origin if current is not None else at
    left = f" ({f['remaining']} left)" if "remaining" in f else ""
    reason = f": {f['reason']}" if f.get("reason") else ""
    recorded = f"; recorded at {_clock(at)} once the next round closed"
    if current is not None and current.started == () and current.kept:
        return Mark(lane, MarkKind.HEAL, where, f["cause"],
                    f"live heal ({f['cause']}){left}{reason}: workers kept (local ranks {_ranks(current.kept)}), "
                    f"no process restarted on this node; they formed round {current.round}{recorded}")
    kept = (f"; local ranks {_ranks(current.started or ())} restarted, {_ranks(current.kept)} kept"
            if current is not None and current.kept else "")
    return Mark(lane, MarkKind.RESTART, where, f["cause"], f"restart ({f['cause']}){left}{reason}{kept}{recorded}")


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks)) or "none"


def _round_label(mine: NodeRound) -> str:
    fields = mine.fields
    workers = f", {fields['world_size']} workers" if "world_size" in fields else ""
    rank = f"group rank {fields['group_rank']} of " if "group_rank" in fields else ""
    return f"round {mine.round}: {rank}{fields['group_world_size']} nodes{workers}"


def _relative(interruption: Interruption, origin: float) -> Interruption:
    return replace(interruption, start=interruption.start - origin, end=interruption.end - origin,
                   cause=replace(interruption.cause, at=interruption.cause.at - origin))


def _lanes(agents: Sequence[Agent], nodes: Sequence[NodeLog]) -> tuple[Lane, ...]:
    grouped: dict[int, list[tuple[Agent, NodeLog]]] = {}
    for agent, log in zip(agents, nodes):
        grouped.setdefault(agent.lane, []).append((agent, log))
    lanes = []
    for number in sorted(grouped):
        own = sorted(grouped[number], key=lambda pair: pair[0].start)
        lanes.append(Lane(own[0][0].host, tuple(a.node for a, _ in own), own[0][1].run_id,
                          min(a.start for a, _ in own), max(a.end for a, _ in own),
                          tuple(r for a, _ in own for r in a.rounds), own[-1][0].ending))
    return tuple(lanes)


def _world(nodes: Sequence[NodeLog], origin: float) -> tuple[tuple[WorldStep, ...], str]:
    """The size of each round from when it first closed: workers when every round says, else nodes."""
    joins = [r for n in nodes for r in n.rounds]
    unit = "workers" if joins and all("world_size" in r.fields for r in joins) else "nodes"
    key = "world_size" if unit == "workers" else "group_world_size"
    first: dict[tuple[str, int], NodeRound] = {}
    for node_round in sorted(joins, key=lambda r: r.joined):
        first.setdefault((node_round.run_id, node_round.round), node_round)
    steps = [WorldStep(r.joined - origin, r.fields[key], r.round) for r in first.values()]
    return tuple(sorted(steps, key=lambda s: s.at)), unit


def _summary(nodes: Sequence[NodeLog], agents: Sequence[Agent], lanes: Sequence[Lane], marks: Sequence[Mark],
             world: Sequence[WorldStep], downtime: Sequence[Interruption]) -> Summary:
    """Restarts count once per round they led to and cause (every member records the same one);
    a restart before any round of its node (a log cut at the start) counts on its own."""
    restarts: set[tuple[str, int | str, str]] = set()
    for log in nodes:
        current: int | str = log.node
        for record in log.records:
            if record.event is Event.ROUND_JOINED:
                current = record.fields["round"]
            elif record.event is Event.RESTART:
                restarts.add((record.run_id, current, record.fields["cause"]))
    by_cause = Counter(cause for _, _, cause in restarts)
    exits = Counter(m.cause for m in marks if m.kind is MarkKind.WORKER_EXIT)
    return Summary(len(world), tuple(sorted(by_cause.items())), tuple(sorted(exits.items())), len(agents),
                   sum(1 for agent in agents if agent.ending == GONE), len(lanes),
                   sum(1 for m in marks if m.kind is MarkKind.HEAL), sum(i.seconds for i in downtime), len(downtime))


def _clock(seconds: float) -> str:
    """``+12.34 s``: a time on the timeline."""
    return f"+{seconds:.2f} s"
