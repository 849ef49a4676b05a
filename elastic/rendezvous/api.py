"""The boundary between an agent and a rendezvous: what one may ask of the other.

The agent (:mod:`elastic.agent.agent`), the torchrun plugin and the static rendezvous are
typed against :class:`Rendezvous` and nothing else; the engine behind it
(:mod:`elastic.rendezvous.handler`) is one implementation. torch's
``torch/distributed/elastic/rendezvous/api.py`` is the model: one abstract class whose
required methods are the ones every rendezvous has, with defaults for the rest, so a caller
never probes an object for what it can do.

Required: :meth:`Rendezvous.next_rendezvous` and :meth:`Rendezvous.shutdown`. Defaulted (a
rendezvous whose membership never changes, such as the static one, keeps them): membership
snapshots and change callbacks, failure reports, the job's end, the exit barrier, closing,
exclusion, the store outage and progress.

Every method raises only :class:`~elastic.rendezvous.errors.RendezvousError` subclasses.
"""

from __future__ import annotations

import abc
import enum
import socket
from dataclasses import dataclass, field
from typing import Callable

from elastic.rendezvous.errors import RendezvousClosedError, RendezvousError
from elastic.rendezvous.progress import WaitSnapshot
from elastic.rendezvous.records import Member, NodeLayout

__all__ = [
    "MembershipStatus",
    "MembershipChange",
    "Rendezvous",
    "RendezvousInfo",
]


class MembershipChange(enum.Enum):
    """Why a closed round's members should stop their workers.

    MEMBER_LOST: a member's key vanished (lease expired, node left or restarted), or this
        node's own lease was lost.
    NODES_WAITING: a node joined the next round and the world can grow, or a member rejoined.
    ROUND_SUPERSEDED: a newer round was closed without this node.
    CLOSED: the rendezvous was closed for good.
    STORE_UNREACHABLE: the store has not answered for ``store_outage_timeout``: the node stops
        training blind (not a restart: it cannot rejoin without the store).
    JOB_FINISHED: a member of this round finished the job (its workers all succeeded; torchrun's
        rule: the first node to succeed ends the job). No round forms any more: workers still
        running may finish, and a failure of theirs that follows ends the node (exit 0), it is
        not restarted.
    JOB_FINISHED_ELSEWHERE: the job finished on a node outside this round (this round formed
        without it, before it finished): this round trains a job that is done; it stops (exit 0).
    """

    MEMBER_LOST = "member_lost"
    NODES_WAITING = "nodes_waiting"
    ROUND_SUPERSEDED = "round_superseded"
    CLOSED = "closed"
    STORE_UNREACHABLE = "store_unreachable"
    JOB_FINISHED = "job_finished"
    JOB_FINISHED_ELSEWHERE = "job_finished_elsewhere"


@dataclass(frozen=True)
class RendezvousInfo:
    """The result of a completed round, as this node sees it.

    Everything here comes from the round record, so every member sees the same world, master
    and restart count. ``layout`` places this node's workers (None from rendezvous that know no
    local world sizes, e.g. the static one: ranks are then ``group_rank * nproc + local_rank``
    and the restart count is the node's own). ``master_listener`` is the listening socket of
    the master port when this node is group rank 0 (see :mod:`elastic.rendezvous.ports`): the
    caller owns it and must hand it to the store's host or close it.
    """

    run_id: str
    round: int
    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    members: tuple[Member, ...]
    restart_count: int = 0
    layout: NodeLayout | None = None
    culprit: str | None = None
    """The node charged with this round's failure restart, if it counts one."""
    master_listener: socket.socket | None = field(default=None, compare=False, repr=False)

    @property
    def agreed(self) -> bool:
        """Whether the restart count and ranks were decided once, in a round record, for every
        member (False for the static rendezvous: each node counts its own restarts)."""
        return self.layout is not None


@dataclass(frozen=True)
class MembershipStatus:
    """One look at the current round's membership; taken without I/O.

    Attributes:
        change: the first change seen since the round closed (None: none yet).
        reason: a sentence about it, for logs and events ("" without a change).
        waiting: waiting nodes that justify a restart (members rejoining, newcomers with room).
        rejoining: members of this round that already joined the next one (they restarted).
        spares: nodes waiting beyond a full round (no restart for them).
        store_outage: seconds the store has not answered this node's keepalives (0.0 while it
            answers).
        store_full: the store refused this node's last write for lack of space (etcd's NOSPACE
            alarm): a join waits for an operator (see :mod:`elastic.rendezvous.store_full`).
        held_until: ``time.monotonic()`` before which the store cannot have dropped this node
            (its lease renewed, see :attr:`backends.session.Session.valid_until`); None when no
            lease holds the membership (lost, or a rendezvous without leases).
    """

    change: MembershipChange | None = None
    reason: str = ""
    waiting: int = 0
    rejoining: int = 0
    spares: int = 0
    store_outage: float = 0.0
    store_full: bool = False
    held_until: float | None = None


class Rendezvous(abc.ABC):
    """How an agent meets the other nodes of its job, round after round."""

    # -- required -------------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def run_id(self) -> str:
        """The run (``--rdzv-id``) this rendezvous belongs to."""

    @property
    @abc.abstractmethod
    def node_id(self) -> str:
        """This node's id, unique per agent; it names the node in events, metrics and records."""

    @abc.abstractmethod
    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and block until it closes with this node in it.

        Raises:
            RendezvousClosedError: the rendezvous was closed for good.
            RendezvousTimeoutError: no round included this node within the join timeout.
            RendezvousConnectionError: the backend failed for the whole join timeout.
            RendezvousStateError: the state in the store is corrupt.
        """

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Leave without closing the rendezvous for the others; interrupts a join in progress
        in another thread (it raises RendezvousClosedError). Idempotent; never raises."""

    # -- membership of the current round ----------------------------------------------------------
    def membership(self) -> MembershipStatus:
        """The current round's membership as last seen. No I/O."""
        return MembershipStatus()

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on any thread, quickly, never raising) whenever :meth:`membership`
        may have changed; the agent wakes on it instead of polling. Default: never called."""

    # -- reports and the end of a job ------------------------------------------------------------
    def report_failure(self, at: float) -> None:
        """This node's own workers failed in the current round (first exit at wall time ``at``);
        the next join carries it. No I/O. Default: nothing to report to."""

    def declare_finished(self) -> None:
        """This node's workers all succeeded: the job is finished, for every node (the first node
        to say so wins; no round forms after it). Call it before :meth:`finish`. Default: nobody
        to tell.

        Raises:
            RendezvousConnectionError: the backend could not be reached within the close timeout.
        """

    def finish(self, timeout: float) -> bool:
        """The exit barrier: mark this node done and wait up to ``timeout`` for every member.

        Returns True when every member finished in time. Default: nobody to wait for.

        Raises:
            RendezvousConnectionError: the backend could not be reached.
        """
        return True

    def set_closed(self, reason: str = RendezvousClosedError.JOB_FINISHED) -> None:
        """Close the rendezvous for every node (the job finished or failed for good). Idempotent.

        Raises:
            RendezvousConnectionError: the backend could not be reached.
        """

    def is_closed(self) -> bool:
        """Whether the rendezvous was closed for good.

        Raises:
            RendezvousConnectionError: the backend could not be reached.
        """
        return False

    def job_running(self) -> bool:
        """Whether a round of this run is running now (a join would interrupt it). Never raises."""
        return False

    # -- exclusion ------------------------------------------------------------------------------
    @property
    def supports_exclusion(self) -> bool:
        """Whether :meth:`exclude` can take this node out of the job for a while."""
        return False

    def exclude(self, cooldown: float, reason: str) -> None:
        """Leave the current round and stay out for ``cooldown`` seconds; the next
        :meth:`next_rendezvous` joins again.

        Raises:
            RendezvousError: this rendezvous cannot exclude nodes (see :attr:`supports_exclusion`).
            RendezvousConnectionError: the backend could not be reached.
        """
        raise RendezvousError(f"Rendezvous {self.run_id}: this rendezvous cannot exclude node {self.node_id}.")

    # -- progress while joining --------------------------------------------------------------------
    def progress(self) -> WaitSnapshot | None:
        """While :meth:`next_rendezvous` waits: what this node knows of the round (else None). No I/O."""
        return None

    def on_progress(self, callback: Callable[[WaitSnapshot | None], None]) -> None:
        """Call ``callback`` with each new :meth:`progress` (e.g. to update a gauge); it must not
        raise. Default: never called."""
