"""What the ranks forming one generation of a round write in its store: arrivals and the verdict.

Pure and torch-free. Every value is versioned JSON, bounded and validated on read (a peer may
be broken or hostile): a bad one raises ``ValueError`` with one line, which the barrier turns
into :class:`~elastic.worker.errors.CollectiveFailed`.

* **Arrivals** (:data:`ARRIVALS`): each arriving rank appends one line, then adds one to
  :data:`ARRIVED` (so a waiter reads the lines only when the count moved)::

      {"v": 1, "rank": 3, "holder": true, "step": 120, "round": 7}

  ``rank`` is its rank in the round (as the agent published it); ``holder`` whether it holds
  the newest training state it knows of (:func:`elastic.worker.decisions.holds_newest`);
  ``step``/``round`` its mark, for the logs.
* **The verdict** (:data:`VERDICT`), written once by compare-and-set: who forms the group, in
  round-rank order, or that nobody does::

      {"v": 1, "verdict": "go", "members": [0, 1, 3]}
      {"v": 1, "verdict": "abandon"}

  A member's rank in the group is its index in ``members``; the group's size is their number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["ARRIVALS", "ARRIVED", "ArrivalRecord", "VERDICT", "Verdict", "encode_arrival", "encode_verdict",
           "parse_arrivals", "parse_verdict"]

ARRIVED = "elastic-live/arrived"
ARRIVALS = "elastic-live/arrivals"
VERDICT = "elastic-live/verdict"
VERSION = 1
MAX_ARRIVAL_BYTES = 256
"""The longest arrival line accepted (a real one is under 80 bytes)."""


@dataclass(frozen=True)
class ArrivalRecord:
    """One rank's arrival at a generation: its round rank, whether it holds the newest state, its mark."""

    rank: int
    holder: bool
    step: int = 0
    round: int = -1


@dataclass(frozen=True)
class Verdict:
    """A generation's outcome: ``members`` (round ranks, ascending) form it, or nobody does (``()``)."""

    members: tuple[int, ...]

    @property
    def go(self) -> bool:
        return bool(self.members)


ABANDON = Verdict(())


def encode_arrival(record: ArrivalRecord) -> bytes:
    """The line ``record`` appends to :data:`ARRIVALS`, newline included."""
    return json.dumps({"v": VERSION, "rank": record.rank, "holder": record.holder, "step": record.step,
                       "round": record.round}, separators=(",", ":")).encode() + b"\n"


def parse_arrivals(raw: bytes, world_size: int) -> dict[int, ArrivalRecord]:
    """The arrivals in ``raw`` by round rank (the first line of a rank counts).

    Raises:
        ValueError: ``raw`` is longer than ``world_size`` lines can be, or a line is not an
            arrival of a rank of a round of ``world_size``.
    """
    if len(raw) > world_size * MAX_ARRIVAL_BYTES:
        raise ValueError(f"the arrivals are {len(raw)} bytes, over the {world_size * MAX_ARRIVAL_BYTES} bytes "
                         f"{world_size} ranks may write")
    arrivals: dict[int, ArrivalRecord] = {}
    for line in raw.splitlines():
        if not line.strip():
            continue
        value = _object(line, "arrival")
        rank, holder, step, round_ = value.get("rank"), value.get("holder"), value.get("step"), value.get("round")
        if not _index(rank, world_size) or type(holder) is not bool or not _count(step) or not _count(round_, -1):
            raise ValueError(f"an arrival line is not valid for a round of {world_size} ranks: {line[:120]!r}")
        arrivals.setdefault(rank, ArrivalRecord(rank, holder, step, round_))
    return arrivals


def encode_verdict(verdict: Verdict) -> bytes:
    """The bytes of ``verdict`` in :data:`VERDICT`."""
    fields: dict[str, Any] = {"v": VERSION, "verdict": "go" if verdict.go else "abandon"}
    if verdict.go:
        fields["members"] = list(verdict.members)
    return json.dumps(fields, separators=(",", ":")).encode()


def parse_verdict(raw: bytes, world_size: int) -> Verdict:
    """The verdict ``raw`` holds, for a round of ``world_size`` ranks.

    Raises:
        ValueError: ``raw`` is too long, not a verdict of this version, or names members that
            are not distinct ascending ranks of the round.
    """
    if len(raw) > 64 + 12 * world_size:
        raise ValueError(f"the verdict is {len(raw)} bytes, too long for a round of {world_size} ranks")
    value = _object(raw, "verdict")
    if value.get("verdict") == "abandon":
        return ABANDON
    members = value.get("members")
    if (value.get("verdict") != "go" or not isinstance(members, list) or not members
            or not all(_index(rank, world_size) for rank in members)
            or any(a >= b for a, b in zip(members, members[1:]))):
        raise ValueError(f"the verdict {raw[:120]!r} is not a verdict for a round of {world_size} ranks")
    return Verdict(tuple(members))


def _object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ValueError(f"the {what} {raw[:120]!r} is not UTF-8 JSON") from error
    if not isinstance(value, dict) or value.get("v") != VERSION:
        raise ValueError(f"the {what} {raw[:120]!r} is not a version {VERSION} object")
    return value


def _index(value: Any, size: int) -> bool:
    return type(value) is int and 0 <= value < size


def _count(value: Any, low: int = 0) -> bool:
    return type(value) is int and low <= value < 2**63
