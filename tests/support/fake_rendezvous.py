"""An in-memory :class:`~elastic.rendezvous.api.Rendezvous` for unit tests of an agent.

Rounds come from a script: each :meth:`FakeRendezvous.next_rendezvous` takes the next item, a
:class:`Round` (the round closes at once with this node in it), an exception to raise, or
:data:`BLOCK` (the join waits until :meth:`~FakeRendezvous.shutdown`, then raises
RendezvousClosedError, as the engine's join does when another thread shuts it down). The test
sets membership changes and store outages from any thread (:meth:`~FakeRendezvous.change`,
:meth:`~FakeRendezvous.set_outage`); like the engine's watch, they call the ``on_change``
callbacks. Every call the agent makes is recorded in :attr:`FakeRendezvous.calls`. Hooks run
when a join or the exit barrier begins (in the calling thread), so a test can act just then.

Example::

    rendezvous = FakeRendezvous([Round(("a", "b")), Round(("a", "b"), restart_count=1, culprit="a")],
                                node_id="a")
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Union

from elastic.rendezvous.api import MembershipChange, MembershipStatus, Rendezvous, RendezvousInfo
from elastic.rendezvous.errors import RendezvousClosedError, RendezvousError
from elastic.rendezvous.records import Member, NodeLayout

__all__ = ["BLOCK", "FakeRendezvous", "Round"]


class _Block:
    def __repr__(self) -> str:
        return "BLOCK"


BLOCK = _Block()
"""A script item (or ``finish`` value): block until shutdown."""


@dataclass(frozen=True)
class Round:
    """A scripted round that includes this node.

    Attributes:
        members: node ids in group-rank order (this node must be one).
        restart_count: the restart count the round record agreed.
        culprit: the node charged with the failure restart this round counts (None: none).
        agreed: whether the round comes from a round record (False: as the static rendezvous,
            no layout, and each node counts its own restarts).
        local_world_size: workers per node.
    """

    members: tuple[str, ...]
    restart_count: int = 0
    culprit: str | None = None
    agreed: bool = True
    local_world_size: int = 1


ScriptItem = Union[Round, RendezvousError, _Block]


class FakeRendezvous(Rendezvous):
    """A rendezvous whose rounds, membership changes and outcome are scripted by a test.

    Args:
        script: what each join gives, in order; a join past the end raises RendezvousClosedError.
        run_id, node_id: this node's identity.
        exclusion: whether :meth:`exclude` is supported.
        finish: what :meth:`finish` returns (True: every member finished; BLOCK: wait for shutdown).
        closed: what :meth:`is_closed` says.
    """

    def __init__(self, script: Iterable[ScriptItem], *, run_id: str = "job", node_id: str = "a",
                 exclusion: bool = False, finish: bool | _Block = True, closed: bool = False,
                 job_running: bool = False) -> None:
        self._script = list(script)
        self._run_id = run_id
        self._node_id = node_id
        self._exclusion = exclusion
        self._finish = finish
        self.closed = closed
        self._job_running = job_running
        self._lock = threading.Lock()
        self._shut = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._status = MembershipStatus()
        self._joins = 0
        self.calls: list[str] = []
        """The agent's calls in order: ``next_rendezvous``, ``report_failure``, ``declare_finished``,
        ``finish``, ``set_closed``, ``exclude``, ``is_closed``, ``job_running``, ``shutdown``."""
        self.failures: list[float] = []
        """The wall times :meth:`report_failure` was given."""
        self.closed_reasons: list[str] = []
        self.exclusions: list[tuple[float, str]] = []
        self.on_join: Callable[[int], None] | None = None
        """Called with the join's index when a join begins (in the joining thread)."""
        self.on_finish: Callable[[], None] | None = None
        """Called when the exit barrier begins (in the calling thread)."""

    # -- what the test does ----------------------------------------------------------------------
    def change(self, change: MembershipChange, reason: str = "", *, waiting: int = 0,
               rejoining: int | None = None) -> None:
        """The current round's membership changed (any thread); ``rejoining``: how many of the
        ``waiting`` are members of the round (default: as before)."""
        with self._lock:
            self._status = MembershipStatus(change, reason or change.value, waiting,
                                            self._status.rejoining if rejoining is None else rejoining,
                                            self._status.spares, self._status.store_outage)
        self._changed()

    def set_outage(self, seconds: float) -> None:
        """The store has not answered for ``seconds`` (0: it answers again)."""
        with self._lock:
            status = self._status
            self._status = MembershipStatus(status.change, status.reason, status.waiting, status.rejoining,
                                            status.spares, seconds)
        self._changed()

    @property
    def is_shut_down(self) -> bool:
        return self._shut.is_set()

    # -- the Rendezvous ----------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def node_id(self) -> str:
        return self._node_id

    def next_rendezvous(self) -> RendezvousInfo:
        with self._lock:
            self.calls.append("next_rendezvous")
            index, self._joins = self._joins, self._joins + 1
            # A new round: no change seen yet; a store outage lasts across rounds.
            self._status = MembershipStatus(store_outage=self._status.store_outage)
        if self.on_join is not None:
            self.on_join(index)
        if self._shut.is_set():
            raise RendezvousClosedError(f"Node {self._node_id} was shut down.")
        item = self._script[index] if index < len(self._script) else RendezvousClosedError(
            f"The fake rendezvous {self._run_id} has no round {index}.")
        if item is BLOCK:
            self._shut.wait()
            raise RendezvousClosedError(f"Node {self._node_id} was shut down while joining.")
        if isinstance(item, RendezvousError):
            raise item
        assert isinstance(item, Round)
        return self._info(index, item)

    def shutdown(self) -> None:
        with self._lock:
            self.calls.append("shutdown")
        self._shut.set()

    def membership(self) -> MembershipStatus:
        with self._lock:
            return self._status

    def on_change(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def report_failure(self, at: float) -> None:
        with self._lock:
            self.calls.append("report_failure")
            self.failures.append(at)

    def declare_finished(self) -> None:
        with self._lock:
            self.calls.append("declare_finished")

    def finish(self, timeout: float) -> bool:
        with self._lock:
            self.calls.append("finish")
        if self.on_finish is not None:
            self.on_finish()
        if self._finish is BLOCK:
            self._shut.wait()
            raise RendezvousClosedError(f"Node {self._node_id} was shut down in the exit barrier.")
        return bool(self._finish)

    def set_closed(self, reason: str = RendezvousClosedError.JOB_FINISHED) -> None:
        with self._lock:
            self.calls.append("set_closed")
            self.closed_reasons.append(reason)
        self.closed = True

    def is_closed(self) -> bool:
        with self._lock:
            self.calls.append("is_closed")
        return self.closed

    def job_running(self) -> bool:
        with self._lock:
            self.calls.append("job_running")
        return self._job_running

    @property
    def supports_exclusion(self) -> bool:
        return self._exclusion

    def exclude(self, cooldown: float, reason: str) -> None:
        if not self._exclusion:
            super().exclude(cooldown, reason)
        with self._lock:
            self.calls.append("exclude")
            self.exclusions.append((cooldown, reason))

    # -- internals ---------------------------------------------------------------------------------
    def _changed(self) -> None:
        for callback in list(self._callbacks):
            callback()

    def _info(self, index: int, spec: Round) -> RendezvousInfo:
        if self._node_id not in spec.members:
            raise ValueError(f"Round {index} of the script does not include node {self._node_id}: {spec.members}.")
        rank = spec.members.index(self._node_id)
        size = len(spec.members)
        members = tuple(Member(node, "127.0.0.1", 29500, spec.local_world_size) for node in spec.members)
        layout = None
        if spec.agreed:
            world = size * spec.local_world_size
            base = rank * spec.local_world_size
            layout = NodeLayout(rank, size, spec.local_world_size, base, world, "default", base, world)
        return RendezvousInfo(self._run_id, index, rank, size, "127.0.0.1", 29500, members,
                              restart_count=spec.restart_count, layout=layout, culprit=spec.culprit)
