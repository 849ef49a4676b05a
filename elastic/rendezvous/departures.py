"""Why a member of the last round is gone: what a waiting node says once about each lost member.

A member's join key of a round vanishes when its lease expires, or when its agent deletes it.
etcd does not say which (a DELETE event is a DELETE), so an agent that deletes its key on
purpose first leaves a short-lived note beside it, ``rounds/<r>/departed/<node>`` (a
:class:`DepartureRecord` bound to a lease of :data:`DEPARTURE_TTL`), with why: its agent shut
down, its workers finished, it was excluded, or it gave up at its join timeout. A member's
monitor watches ``rounds/``, so it sees the note before the DELETE it explains, in one ordered
stream, and names why at once (:func:`~elastic.rendezvous.round_events.classify`). An excluded
node also has ``excluded/<node>`` for its cooldown. A member whose key is gone without either
was not heard from: its lease expired (its agent was killed, hung, or cut off from the store).

:func:`absent_members` (pure) splits the previous round's members that have not joined the
forming round into those still *expected* (their key of the previous round exists: alive,
about to rejoin) and those *lost*; :class:`LostNodes` finds why each lost one left, once per
join, and never names a node that has joined after all.
"""

from __future__ import annotations

import enum
import json
import logging
from dataclasses import dataclass
from typing import Iterable

from backends.api import KVBackend
from backends.errors import BackendError
from backends.untrusted import parse_json, quote
from elastic.rendezvous.errors import RendezvousStateError
from elastic.rendezvous.progress import LostNode
from elastic.rendezvous.records import FORMAT_VERSION, RendezvousKeys, RoundRecord

__all__ = ["DEPARTURE_TTL", "Departure", "DepartureRecord", "LostNodes", "absent_members", "decode_departure",
           "departed_key", "encode_departure", "say_departure", "why_lost"]

log = logging.getLogger(__name__)

DEPARTURE_TTL = 300.0
"""Seconds a departure note outlives its writer: ample for the survivors to rejoin and read it."""

LEASE_EXPIRED = "its lease expired: its agent was killed, hung or cut off from the store"
"""Why a member left when it left no note."""


class Departure(enum.Enum):
    """Why an agent deleted its own join key (the value is how a departure note spells it)."""

    LEFT = "left"
    FINISHED = "finished"
    EXCLUDED = "excluded"
    TIMED_OUT = "timed out"

    def describe(self) -> str:
        return {
            Departure.LEFT: "its agent shut down",
            Departure.FINISHED: "its workers finished and its agent left",
            Departure.EXCLUDED: "it was excluded",
            Departure.TIMED_OUT: "it gave up at its join timeout",
        }[self]


@dataclass(frozen=True)
class DepartureRecord:
    """A node deleted its join key of ``round`` on purpose, and why (``detail``: more words, e.g.
    the exclusion's reason)."""

    round: int
    why: Departure
    detail: str = ""


def departed_key(keys: RendezvousKeys, round_number: int, node_id: str) -> str:
    return keys.departed(round_number, node_id)


def encode_departure(record: DepartureRecord) -> bytes:
    body = {"v": FORMAT_VERSION, "round": record.round, "why": record.why.value, "detail": record.detail}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_departure(key: str, raw: bytes) -> DepartureRecord:
    """Raises RendezvousStateError when ``raw`` is not a departure note of this format version."""
    try:
        body = parse_json(raw, max_bytes=64 * 1024)
    except ValueError as error:
        raise RendezvousStateError(f"The departure note at {quote(key)} is corrupt: {error}.") from error
    if not isinstance(body, dict) or body.get("v") != FORMAT_VERSION:
        raise RendezvousStateError(f"The departure note at {quote(key)} is not of format version {FORMAT_VERSION}.")
    number, why, detail = body.get("round"), body.get("why"), body.get("detail", "")
    try:
        departure = Departure(why)
    except ValueError:
        raise RendezvousStateError(f"The departure note at {quote(key)} gives an unknown reason {quote(why)}.") from None
    if type(number) is not int or number < 0 or not isinstance(detail, str):
        raise RendezvousStateError(f"The departure note at {quote(key)} needs a round number and a text detail.")
    return DepartureRecord(number, departure, detail)


def absent_members(previous: RoundRecord | None, forming: int, joined: Iterable[str],
                   alive: Iterable[str] | None) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """``(expected, lost)``: the members of ``previous`` that have not joined round ``forming``,
    split by whether their key of ``previous`` still exists (``alive``; None: not known, and
    every absent member is still expected).

    Only the round just before ``forming`` says who is expected: for any other (this node missed
    a round, or never was in one) nothing is known, ``(None, ())``.
    """
    if previous is None or previous.round != forming - 1:
        return None, ()
    joined = set(joined)
    absent = [member.node_id for member in previous.members if member.node_id not in joined]
    if alive is None:
        return tuple(absent), ()
    alive = set(alive)
    return tuple(node for node in absent if node in alive), tuple(node for node in absent if node not in alive)


def why_lost(departure: DepartureRecord | None, exclusion: str | None, previous_round: int) -> str:
    """Why a member of round ``previous_round`` is lost, from its departure note and its exclusion
    mark (the mark's reason; None: not excluded). A note of an earlier round is stale."""
    if departure is not None and departure.round >= previous_round:
        return departure.why.describe() + (f": {departure.detail}" if departure.detail else "")
    if exclusion is not None:
        return f"it was excluded: {exclusion}" if exclusion else Departure.EXCLUDED.describe()
    return LEASE_EXPIRED


def say_departure(backend: KVBackend, keys: RendezvousKeys, node_id: str, record: DepartureRecord) -> None:
    """Leave the departure note (before deleting the join key it explains). Best effort: a store
    that does not answer only makes the others say the lease expired."""
    try:
        lease = backend.grant(DEPARTURE_TTL).id
        backend.put(departed_key(keys, record.round, node_id), encode_departure(record), lease=lease)
    except BackendError as error:
        log.info("Rendezvous %s: node %s could not leave its departure note (%s): %s", keys.run_id, node_id,
                 record.why.value, error)


class LostNodes:
    """Why each lost member left, looked up once per join (see the module docstring)."""

    def __init__(self, backend: KVBackend, keys: RendezvousKeys) -> None:
        self._backend = backend
        self._keys = keys
        self._known: dict[str, str] = {}

    def reset(self) -> None:
        """Forget what was found (a new join)."""
        self._known = {}

    def split(self, previous: RoundRecord, forming: int, joined: Iterable[str],
              alive: Iterable[str] | None) -> tuple[tuple[str, ...] | None, tuple[LostNode, ...]]:
        """``(expected, lost)`` of :func:`absent_members`, the lost ones with why."""
        expected, gone = absent_members(previous, forming, joined, alive)
        return expected, self.lost(gone, previous.round, forming)

    def lost(self, candidates: Iterable[str], previous_round: int, forming: int) -> tuple[LostNode, ...]:
        """The ``candidates`` (absent from ``forming``, their key of ``previous_round`` gone) that
        are lost, with why; a candidate whose key of ``forming`` exists after all (it rejoined
        between two reads) is not lost."""
        found = []
        for node in candidates:
            if node not in self._known:
                why = self._look_up(node, previous_round, forming)
                if why is None:
                    continue
                self._known[node] = why
            found.append(LostNode(node, self._known[node]))
        return tuple(found)

    def _look_up(self, node: str, previous_round: int, forming: int) -> str | None:
        try:
            if self._backend.get(self._keys.node(forming, node)).kv is not None:
                return None
            # It left the previous round, or joined the forming one and left that.
            departed = (self._backend.get(departed_key(self._keys, forming, node)).kv
                        or self._backend.get(departed_key(self._keys, previous_round, node)).kv)
            excluded = self._backend.get(self._keys.excluded(node)).kv
            departure = decode_departure(departed.key, departed.value) if departed is not None else None
            return why_lost(departure, _exclusion_reason(excluded.value) if excluded is not None else None,
                            previous_round)
        except (BackendError, RendezvousStateError) as error:
            return f"its key is gone (why is unknown: {error})"


def _exclusion_reason(raw: bytes) -> str:
    """The reason of an exclusion mark (``records.encode_exclusion``); "" when unreadable."""
    try:
        body = parse_json(raw, max_bytes=64 * 1024)
    except ValueError:
        return ""
    reason = body.get("reason") if isinstance(body, dict) else None
    return reason if isinstance(reason, str) else ""
