"""Pure decisions of a member of a closed round: what an event under the run's root means.

:func:`classify` turns one watch event into a :class:`~elastic.rendezvous.api.MembershipChange`
(or none) and the member's new :class:`MonitorState`; :func:`deleted_by_hand` tells an
operator's deletion from a lease etcd expired; :func:`barrier_outcome` is the exit barrier's
state. No I/O, no clocks, no threads; the monitor and the barrier perform the effects. Each is
tested with case tables in ``tests/rendezvous/test_decisions.py``.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Iterable, Sequence

from backends.api import EventType, WatchEvent
from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.departures import decode_departure
from elastic.rendezvous.job import FinishedRecord, decode_finished
from elastic.rendezvous.records import RendezvousKeys, RoundRecord, decode_round


# -- what a change under a closed round means ------------------------------------------------
@dataclass(frozen=True)
class RoundView:
    """What a member knows of its closed round, for classifying later events."""

    keys: RendezvousKeys
    record: RoundRecord
    node_id: str
    max_nodes: int
    record_revision: int = 0
    """The revision that wrote ``record``: the monitor replays that PUT, which is not news."""


def waiting_counts(view: RoundView, waiting_ids: Iterable[str]) -> int:
    """How many waiting nodes justify a restart: members rejoining always; others only if the world can grow."""
    member_ids = {member.node_id for member in view.record.members}
    waiting = set(waiting_ids) - {view.node_id}
    rejoining = waiting & member_ids
    newcomers = waiting - member_ids
    room = view.record.group_world_size < view.max_nodes
    return len(rejoining) + (len(newcomers) if room else 0)


def rejoining_count(view: RoundView, waiting_ids: Iterable[str]) -> int:
    """How many waiting nodes are members of the current round joining again (they restarted)."""
    return len((set(waiting_ids) - {view.node_id}) & {member.node_id for member in view.record.members})


def spare_count(view: RoundView, waiting_ids: Iterable[str]) -> int:
    """How many waiting nodes are spares: newcomers while the round is full (no restart for them)."""
    if view.record.group_world_size < view.max_nodes:
        return 0
    return len(set(waiting_ids) - {member.node_id for member in view.record.members} - {view.node_id})


# -- the exit barrier -------------------------------------------------------------------------
class BarrierOutcome(enum.Enum):
    """Where the exit barrier stands: WAIT -> ALL_DONE or MEMBER_LOST (both final)."""

    WAIT = "wait"
    ALL_DONE = "all done"
    MEMBER_LOST = "member lost"


def barrier_outcome(members: frozenset[str], present: frozenset[str], done: frozenset[str]) -> BarrierOutcome:
    """The exit barrier's state from the round's join keys (``present``) and done keys seen.

    A member whose join key is gone without it ever marking itself done will never finish
    this round (its lease lapsed: its agent restarts into the next one), so waiting for it
    until the barrier's timeout would only hold the others back.
    """
    if members <= done:
        return BarrierOutcome.ALL_DONE
    if (members - done) - present:
        return BarrierOutcome.MEMBER_LOST
    return BarrierOutcome.WAIT


@dataclass(frozen=True)
class MonitorState:
    """What a member has learned since its round closed: who waits for the next round, who is
    done, the job's end once a node recorded it, and why members that left on purpose left
    (``departed``: node id and the reason of its departure note in this round)."""

    waiting: frozenset[str] = frozenset()
    done: frozenset[str] = frozenset()
    finished: FinishedRecord | None = None
    departed: frozenset[tuple[str, str]] = frozenset()

    def why_departed(self, node_id: str) -> str | None:
        return next((why for node, why in self.departed if node == node_id), None)


def job_end(view: RoundView, finished: FinishedRecord) -> MembershipChange:
    """What the job's end means to a member of ``view``'s round: its own round finished the job
    (JOB_FINISHED: running workers may finish), or a node outside it did (JOB_FINISHED_ELSEWHERE)."""
    if finished.round == view.record.round:
        return MembershipChange.JOB_FINISHED
    return MembershipChange.JOB_FINISHED_ELSEWHERE


def classify(view: RoundView, event: WatchEvent, state: MonitorState) -> tuple[MembershipChange | None, MonitorState]:
    """Classify one event under the run's root; returns the change (if any) and the new state.

    A member that marked itself done (its workers finished; the exit barrier) may leave
    without being *lost*.

    Raises:
        RendezvousStateError: the event carries a corrupt round, finished or departure record.
    """
    key = event.kv.key
    if key == view.keys.finished and event.type is EventType.PUT:
        finished = decode_finished(key, event.kv.value)
        return job_end(view, finished), dataclasses.replace(state, finished=finished)
    if key == view.keys.closed and event.type is EventType.PUT:
        return MembershipChange.CLOSED, state
    if key == view.keys.round and event.type is EventType.PUT:
        if event.revision == view.record_revision:
            return None, state  # our own round: skip decoding an O(members) record again
        newer = decode_round(key, event.kv.value).round > view.record.round
        return (MembershipChange.ROUND_SUPERSEDED if newer else None), state
    done = view.keys.parse_done_key(key)
    if done is not None:
        if done[0] == view.record.round and event.type is EventType.PUT:
            state = dataclasses.replace(state, done=state.done | {done[1]})
        return None, state
    departed = view.keys.parse_departed_key(key)
    if departed is not None:
        if departed[0] == view.record.round and event.type is EventType.PUT:
            note = decode_departure(key, event.kv.value)
            why = note.why.describe() + (f": {note.detail}" if note.detail else "")
            state = dataclasses.replace(state, departed=state.departed | {(departed[1], why)})
        return None, state
    parsed = view.keys.parse_node_key(key)
    if parsed is None:
        return None, state
    round_number, node_id = parsed
    if round_number == view.record.round and event.type is EventType.DELETE:
        is_member = view.record.rank_of(node_id) is not None
        lost = is_member and node_id != view.node_id and node_id not in state.done
        return (MembershipChange.MEMBER_LOST if lost else None), state
    if round_number == view.record.round + 1:
        waiting = state.waiting | {node_id} if event.type is EventType.PUT else state.waiting - {node_id}
        state = dataclasses.replace(state, waiting=waiting)
        change = MembershipChange.NODES_WAITING if waiting_counts(view, waiting) > 0 else None
        return change, state
    return None, state


def deleted_by_hand(view: RoundView, events: Sequence[WatchEvent]) -> str | None:
    """A sentence when ``events`` (one batch of a watch) show the job's keys deleted by a client,
    such as an operator's ``etcdctl del --prefix``; None otherwise.

    etcd deletes a node's keys when its lease expires, one lease per revision. So the round
    record vanishing, or the join keys of two members of the round vanishing at one revision,
    is a deletion by hand, not a loss etcd judged: saying "member lost" would send the operator
    after a node that is fine.
    """
    together: dict[int, set[str]] = {}
    for event in events:
        if event.type is not EventType.DELETE:
            continue
        if event.kv.key == view.keys.round:
            return (f"the job's keys were deleted: the round record {event.kv.key} is gone (revision {event.revision}; "
                    f"etcdctl del --prefix {view.keys.root}?); re-forming")
        parsed = view.keys.parse_node_key(event.kv.key)
        if parsed is not None and parsed[0] == view.record.round and view.record.rank_of(parsed[1]) is not None:
            together.setdefault(event.revision, set()).add(parsed[1])
    for revision, nodes in sorted(together.items()):
        if len(nodes) >= 2:
            return (f"the job's keys were deleted: the join keys of {', '.join(sorted(nodes))} in round "
                    f"{view.record.round} vanished together at revision {revision}, not with a lease "
                    f"(etcdctl del --prefix {view.keys.root}?); re-forming")
    return None
