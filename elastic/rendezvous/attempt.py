"""One node's join of one round, from its join transaction until the next join replaces it.

The handler keeps the attempt of the round it is in (its join key is its membership) and
makes a new one per join; the next join deletes the old key in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.api import KeyValue, WatchEvent
from elastic.rendezvous.records import RoundRecord

__all__ = ["ClosedRound", "JoinAttempt"]


@dataclass(frozen=True)
class ClosedRound:
    """A round record as closed in the store, and the revision its write landed at."""

    record: RoundRecord
    revision: int


@dataclass
class JoinAttempt:
    """This node's join of round ``forming``.

    Attributes:
        forming: the round joined.
        key: this node's join key (lease-bound; it is the node's membership once the round closes).
        value: the encoded join record, also the value of a closer claim this node takes.
        count: the joiners counted by the join transaction, this one included.
        closer: the round's closer claim as last seen (the holder's key).
        holds_claim: whether this node holds the claim it has not yet dropped.
        backlog: ``state/`` events taken from the watch after the close was seen; the
            membership monitor of the round handles them.
    """

    forming: int
    key: str
    value: bytes
    count: int
    closer: KeyValue
    holds_claim: bool = False
    backlog: list[WatchEvent] = field(default_factory=list)
