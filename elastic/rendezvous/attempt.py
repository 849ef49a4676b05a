"""What one node knows of its rounds: the round it closed into, its join, its closer claim.

Immutable values, replaced as a join goes on: :class:`StateView` (``state/`` read at one
revision), :class:`ClosedRound` (a round record and the revision that wrote it),
:class:`JoinAttempt` (this node's join of one round, with its :class:`Claim`) and
:class:`FailureReport` (this node's workers failed in a round; the next join carries it) and
:class:`Included` (the round that includes this node, as the agent gets it).
"""

from __future__ import annotations

import dataclasses
import enum
import socket
from dataclasses import dataclass

from backends.api import KeyValue
from elastic.rendezvous.api import RendezvousInfo
from elastic.rendezvous.job import FinishedRecord, JobIdentity
from elastic.rendezvous.records import RoundRecord

__all__ = ["Claim", "ClosedRound", "FailureReport", "Included", "JoinAttempt", "OwnedJob", "StateView"]


@dataclass(frozen=True)
class ClosedRound:
    """A round record as closed in the store, and the revision its write landed at."""

    record: RoundRecord
    revision: int


@dataclass(frozen=True)
class OwnedJob:
    """The job that owns the run id (``state/job``) and the revision that created its record:
    a join compares that revision, so it applies only under the identity this node checked."""

    identity: JobIdentity
    created: int


@dataclass(frozen=True)
class StateView:
    """``state/`` as read at one revision: the last closed round (None before round 0), why
    the rendezvous was closed for good (None while it is open), the job's end (None while it
    runs) and the job that owns the run id (None before the first join)."""

    revision: int
    last: ClosedRound | None
    closed_reason: str | None = None
    finished: FinishedRecord | None = None
    job: OwnedJob | None = None

    @property
    def closed(self) -> bool:
        return self.closed_reason is not None

    @property
    def round(self) -> RoundRecord | None:
        """The last closed round's record, or None."""
        return self.last.record if self.last is not None else None

    @property
    def forming(self) -> int:
        """The round a node joins now: the one after the last closed round."""
        return self.last.record.round + 1 if self.last is not None else 0


@dataclass(frozen=True)
class FailureReport:
    """This node's own workers failed in ``round``; the first exit was at wall time ``at``."""

    round: int
    at: float


class Claim(enum.Enum):
    """This node's part in closing the round it joined (the claim is ``state/closer/<r>``).

    OTHER: another node holds the claim as last seen; this node waits for the close, or for
        the holder's claim to vanish with its lease, and then tries to take it over.
    HELD: this node holds the claim (its join created it, or it took it over) and closes.
    RELEASED: the claim this node held is gone: a close of its round deleted it in the same
        step (every close does), or this node deleted it when it left. Final.

    Legal transitions: OTHER -> HELD (:meth:`JoinAttempt.seen_closer` with this node's claim),
    HELD -> RELEASED (:meth:`JoinAttempt.release`, :meth:`JoinAttempt.after_close`). Nothing else.
    """

    OTHER = "other"
    HELD = "held"
    RELEASED = "released"


@dataclass(frozen=True)
class JoinAttempt:
    """This node's join of round ``forming``, from its join transaction until the next one.

    Attributes:
        forming: the round joined.
        key: this node's join key (lease-bound; the node's membership once the round closes).
        value: the encoded join record, also the value of a closer claim this node takes.
        count: the joiners counted by the join transaction, this one included.
        closer: the round's closer claim as last seen (the holder's key).
        claim: this node's part in closing (see :class:`Claim`).
    """

    forming: int
    key: str
    value: bytes
    count: int
    closer: KeyValue
    claim: Claim = Claim.OTHER

    def seen_closer(self, closer: KeyValue, mine: bool) -> "JoinAttempt":
        """The claim as now seen: ``closer`` holds it; ``mine``: this node (OTHER -> HELD)."""
        if self.claim is not Claim.OTHER:
            return self
        return dataclasses.replace(self, closer=closer, claim=Claim.HELD if mine else Claim.OTHER)

    def release(self) -> "JoinAttempt":
        """HELD -> RELEASED; any other claim is left as it is."""
        return dataclasses.replace(self, claim=Claim.RELEASED) if self.claim is Claim.HELD else self

    def after_close(self, closed: ClosedRound) -> "JoinAttempt":
        """The attempt once ``closed`` was seen: a close of this round written after this node
        took the claim deleted the claim in the same step (HELD -> RELEASED)."""
        if closed.record.round == self.forming and self.closer.create_revision < closed.revision:
            return self.release()
        return self


@dataclass(frozen=True)
class Included:
    """A closed round that includes this node, and its group rank in it."""

    closed: ClosedRound
    rank: int

    def info(self, run_id: str, node_id: str, listener: socket.socket | None) -> RendezvousInfo:
        """What the agent gets: everything from the round record (``listener``: the master
        port's listening socket when this node is rank 0)."""
        record = self.closed.record
        master = record.members[0]
        return RendezvousInfo(run_id, record.round, self.rank, record.group_world_size, master.addr,
                              master.master_port, record.members, restart_count=record.restart_count,
                              layout=record.layout_of(node_id), culprit=record.culprit, master_listener=listener)
