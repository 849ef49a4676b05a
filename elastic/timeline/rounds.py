"""When each node's workers trained in each round, and when the job did: a pure function, no I/O.

`read_nodes(records)` walks every node's records once and gives its `NodeRound` s: when the
rendezvous began and the round closed, when its workers started or (``--live-recovery``) formed
the round, the first failure of a worker in it, and when the node left it. From those,
`round_spans` gives each round of the run (`RoundSpan`) and the deaths of killed nodes:

* a node **trains** in a round from when its workers ran in it (``workers_started``; with
  ``--live-recovery``, from ``round_formed``: kept workers and their new peers formed the group;
  in logs of agents before those events, from the round's close) until the round **stopped**;
* a round stops for everyone at the first stop of any member: a worker's failure, a member's
  leaving (its rendezvous for the next round; with its workers kept, the next round's close:
  they trained meanwhile), its end (``job_finished``) or its death. Collectives span every
  member, so no worker trains once one member's stopped;
* a node without ``job_finished`` was killed or lost. Nothing records its death, so it is taken
  as the first sign of it its peers recorded after its last event: a failure of their workers
  in that round (their connections to it break), their leaving the round, or (`noticed_lost`)
  their next round without it or a ``member_lost`` while their round had it.

The job trains in a round from when its last member started training (with kept live workers:
from when the first node with kept workers formed it) until the round stopped;
`downtime` turns the gaps between those spans into interruptions with their causes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from elastic.agent.observe.events import Event
from elastic.timeline.records import Record

__all__ = ["Sign", "NodeLog", "NodeRound", "RoundSpan", "began", "first_cause", "noticed_lost", "read_nodes",
           "round_spans"]

_MAX_PEERS = 300
"""The peers looked at for a round that does not list its members (as many as a list is cut to)."""


@dataclass(frozen=True)
class Sign:
    """Something recorded at ``at`` on ``node`` that stopped training, in words (``what``);
    ``kind``: ``worker_exit``, ``left``, ``finished``, ``lost`` (a node's death; ``first_sign``:
    what its peers recorded that told it)."""

    at: float
    node: str
    kind: str
    what: str
    first_sign: str = ""


def first_cause(sign: Sign) -> tuple[float, int]:
    """The order of signs: by time; at one time a death first (its peers' failures are its
    doing), then a failure, then a leaving."""
    return sign.at, {"lost": 0, "worker_exit": 1}.get(sign.kind, 2)


@dataclass(frozen=True)
class NodeRound:
    """One node in one round it joined. Times are wall-clock seconds; None: not recorded."""

    node: str
    run_id: str
    round: int
    began: float
    """When its rendezvous for this round began."""
    joined: float
    """When the round closed for it."""
    fields: Mapping
    """The ``round_joined`` fields (sizes, ranks, members)."""
    started: tuple[int, ...] | None
    """The local ranks started anew in the round (None: the log does not say)."""
    kept: tuple[int, ...]
    """The local ranks kept running into the round (``--live-recovery``)."""
    trains: float | None
    """When its workers trained in the round (None: never: they did not start, or, kept, did not
    form it)."""
    failure: Sign | None
    """The first failure of one of its workers in the round."""
    left: Sign | None
    """When and why it stopped training in the round by its own doing: the next rendezvous began
    (or, its workers kept, the next round closed), or the job finished; None: its log ends in it."""

    @property
    def own_stop(self) -> Sign | None:
        """The first of its failure and its leaving."""
        signs = [s for s in (self.failure, self.left) if s is not None]
        return min(signs, key=first_cause) if signs else None

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(self.fields.get("members", ()))


@dataclass(frozen=True)
class NodeLog:
    """One agent (node id): its records, rounds and ending."""

    node: str
    host: str
    run_id: str
    source: str
    records: tuple[Record, ...]
    rounds: tuple[NodeRound, ...]
    status: str | None
    """``job_finished``'s status; None: killed or lost."""

    @property
    def first(self) -> float:
        return min([self.records[0].at, *(r.began for r in self.rounds[:1])])

    @property
    def last(self) -> float:
        return self.records[-1].at


@dataclass(frozen=True)
class RoundSpan:
    """A round of a run: its members' rounds, when the job trained in it (``start`` to ``stop``;
    ``start`` >= ``stop``: never) and what stopped it."""

    run_id: str
    round: int
    members: tuple[NodeRound, ...]
    start: float | None
    stop: Sign | None

    @property
    def trained(self) -> bool:
        return self.start is not None and self.stop is not None and self.stop.at > self.start


def began(record: Record) -> float:
    """When what ``record`` draws begins: a round's rendezvous began ``duration_s`` before it closed."""
    if record.event is Event.ROUND_JOINED:
        return record.at - float(record.fields["duration_s"])
    return record.at


def read_nodes(records: Iterable[Record]) -> list[NodeLog]:
    """Every node's log, in the order of their first record (``records`` in any order)."""
    by_node: dict[str, list[Record]] = {}
    for record in sorted(records, key=lambda r: r.at):
        by_node.setdefault(record.node, []).append(record)
    return [_node_log(own) for own in by_node.values()]


def _node_log(own: Sequence[Record]) -> NodeLog:
    rounds: list[dict] = []
    status: str | None = None
    previous: float | None = None  # the node's record before: its rendezvous began after it
    for record in own:
        f, current = record.fields, rounds[-1] if rounds else None
        if record.event is Event.ROUND_JOINED:
            start = began(record)
            if previous is not None:
                start = min(max(start, previous), record.at)  # the duration is rounded; the record is not
            if current is not None:
                current["next"] = (start, record.at)
            rounds.append({"round": f["round"], "began": start, "joined": record.at, "fields": f, "started": None,
                           "kept": (), "started_at": None, "formed": None, "failure": None, "next": None,
                           "next_kept": False, "finished": None, "restart": None, "why": "",
                           "settled": not rounds})
        elif current is None:
            if record.event is Event.JOB_FINISHED:
                status = f["status"]
        elif record.event is Event.RESTART:  # (the branches below have a current round)
            current["restart"], current["settled"] = f, True
        elif record.event is Event.WORKERS_STARTED and f["round"] == current["round"] and not f.get("refill"):
            if current["started_at"] is None:
                current.update(started=tuple(f["started"]), kept=tuple(f["kept"]), started_at=record.at, settled=True)
                if f["kept"] and len(rounds) > 1:
                    rounds[-2]["next_kept"] = True
        elif record.event is Event.ROUND_FORMED and f["round"] == current["round"] and current["formed"] is None:
            current["formed"] = record.at
        elif record.event is Event.WORKER_EXIT and current["failure"] is None and _failed(f):
            current["failure"] = Sign(record.at, record.node, "worker_exit", _exit_text(record))
        elif record.event in (Event.MEMBER_LOST, Event.NODES_WAITING) and current["settled"]:
            # Before the round settled (its restart or workers recorded), a member_lost is about
            # the round before (a failure not counted because a member is absent).
            current["why"] = current["why"] or f.get("reason", record.event.value.replace("_", " "))
        elif record.event is Event.JOB_FINISHED:
            status = f["status"]
            current["finished"] = (record.at, status)
        previous = record.at
    node = own[0].node
    # An agent that records its workers' starts and did not for a round never started them there.
    says_starts = any(record.event is Event.WORKERS_STARTED for record in own)
    built = tuple(_node_round(node, own[0].run_id, r, rounds[i + 1] if i + 1 < len(rounds) else None, says_starts)
                  for i, r in enumerate(rounds))
    return NodeLog(node, own[0].host, own[0].run_id, own[0].source, tuple(own), built, status)


def _node_round(node: str, run_id: str, r: dict, after: dict | None, says_starts: bool) -> NodeRound:
    if r["formed"] is not None or r["kept"]:
        trains = r["formed"]  # live workers (kept or replacements) train once they all formed the round
    elif r["started_at"] is not None:
        trains = r["started_at"]
    else:  # an older agent's log: its workers started as the round closed
        trains = None if says_starts else r["joined"]
    left: Sign | None = None
    if r["next"] is not None:
        began_next, joined_next = r["next"]
        cause = (after or {}).get("restart") or {}
        why = r["why"] or (f"restart: {cause['cause']}" if cause else "rejoined")
        if r["next_kept"]:
            left = Sign(joined_next, node, "left", f"node {node} moved its kept workers to round "
                        f"{after['round'] if after else '?'} ({why})")
        else:
            left = Sign(began_next, node, "left", f"node {node} left for the next round ({why})")
    elif r["finished"] is not None:
        at, status = r["finished"]
        left = Sign(at, node, "finished", f"node {node} finished ({status})")
    return NodeRound(node, run_id, r["round"], r["began"], r["joined"], r["fields"], r["started"], r["kept"],
                     trains, r["failure"], left)


def _failed(fields: Mapping) -> bool:
    return bool(fields.get("signal")) or fields.get("exitcode") not in (0, None)


def _exit_text(record: Record) -> str:
    f = record.fields
    cause = f.get("signal") or f"exit {f.get('exitcode')}"
    return f"worker rank {f.get('global_rank')} (local {f.get('local_rank')}) of node {record.node}: {cause}"


def noticed_lost(nodes: Sequence[NodeLog]) -> dict[str, float]:
    """For each node without ``job_finished``, when a peer first acted on its loss after its last
    record: began a round without it right after one with it, or reported a member lost while
    its latest round had it. One pass over the records (members lists are bounded)."""
    gone = {n.node: n.last for n in nodes if n.status is None}
    if not gone:
        return {}
    noticed: dict[str, float] = {}
    current: dict[str, frozenset[str]] = {}
    for record in sorted((r for n in nodes for r in n.records), key=lambda r: r.at):
        if record.event is Event.ROUND_JOINED:
            members = frozenset(record.fields.get("members", ()))
            before = current.get(record.node)
            current[record.node] = members
            if before is None:
                continue
            for node in before - members:
                last = gone.get(node)
                if node != record.node and last is not None and record.at >= last:
                    at = max(began(record), last)
                    noticed[node] = min(noticed.get(node, at), at)
        elif record.event is Event.MEMBER_LOST:
            for node in current.get(record.node, ()):
                last = gone.get(node)
                if node != record.node and last is not None and record.at >= last:
                    noticed[node] = min(noticed.get(node, record.at), record.at)
    return noticed


def round_spans(nodes: Sequence[NodeLog], noticed: Mapping[str, float]) -> tuple[list[RoundSpan], dict[str, Sign]]:
    """Every round's span, in order of their start, and the deaths of the nodes without
    ``job_finished`` (none for a node whose peers recorded no sign of its loss)."""
    by_key: dict[tuple[str, int], list[NodeRound]] = {}
    for log in nodes:
        for node_round in log.rounds:
            by_key.setdefault((node_round.run_id, node_round.round), []).append(node_round)
    by_node = {(r.run_id, r.round, r.node): r for rounds in by_key.values() for r in rounds}
    deaths: dict[str, Sign] = {}
    for log in nodes:
        if log.status is None:
            death = _death(log, by_node, by_key, noticed.get(log.node))
            if death is not None:
                deaths[log.node] = death
    spans = []
    for (run_id, number), members in by_key.items():
        start = _round_start(members)
        stops = [s for s in (_stop(m, deaths) for m in members) if s is not None]
        stop = min(stops, key=first_cause) if stops else None
        spans.append(RoundSpan(run_id, number, tuple(members), start, stop))
    spans.sort(key=lambda s: (s.start if s.start is not None else min(m.joined for m in s.members), s.run_id))
    return spans, deaths


def _round_start(members: Sequence[NodeRound]) -> float | None:
    """When the job trained in a round: once its last member trained in it; with kept live
    workers, once the first node with kept workers formed it (survivors train on without a
    node whose new workers are not ready: they join at a later step, docs/live-recovery.md)."""
    kept = [m.trains for m in members if m.kept and m.trains is not None]
    if kept:
        return min(kept)
    starts = [m.trains for m in members]
    return None if any(s is None for s in starts) else max(starts)  # type: ignore[type-var]


def _stop(member: NodeRound, deaths: Mapping[str, Sign]) -> Sign | None:
    signs = [s for s in (member.own_stop, deaths.get(member.node) if member.left is None else None) if s is not None]
    return min(signs, key=first_cause) if signs else None


def _death(log: NodeLog, by_node: Mapping[tuple[str, int, str], NodeRound],
           by_key: Mapping[tuple[str, int], list[NodeRound]], noticed: float | None) -> Sign | None:
    """The first sign of ``log``'s node's death its peers recorded after its last record. Looks
    at the members its round names (bounded), or, a round without a members list, at the first
    few nodes of that round."""
    last = log.last
    signs: list[Sign] = []
    if log.rounds and log.rounds[-1].left is None:
        mine = log.rounds[-1]
        if mine.members:
            peers = [by_node.get((mine.run_id, mine.round, member)) for member in mine.members]
        else:
            peers = list(itertools.islice(by_key.get((mine.run_id, mine.round), ()), _MAX_PEERS))
        for peer in peers:
            if peer is None or peer.node == log.node:
                continue
            signs += [s for s in (peer.failure, peer.left) if s is not None and s.at >= last]
    first = min(signs, key=lambda s: s.at) if signs else None
    if noticed is not None and (first is None or noticed < first.at):
        first = Sign(noticed, "", "left", "a peer went on without it")
    if first is None:
        return None
    return Sign(max(first.at, last), log.node, "lost", f"node {log.node} lost (killed or crashed: no job_finished)",
                first.what)
