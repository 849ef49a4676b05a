"""What the agent needs of a worker group, and the factory that makes this node's kind.

Two kinds satisfy :class:`Workers`: :class:`~elastic.agent.processes.workers.WorkerGroup`, one
attempt's workers, and :class:`~elastic.agent.live.workers.LiveWorkers` (``--live-recovery``),
workers kept across rounds. The agent and :mod:`elastic.agent.attempts` never ask which kind
they hold: they decide on one :class:`~elastic.agent.processes.group_state.WorkersView` per
turn (:meth:`Workers.look`) and ask every group the same questions, which a group of one attempt
answers with no. The loop is tested in-process with a fake group (``tests/support/fake_workers.py``).
"""

from __future__ import annotations

from typing import Callable, Protocol

from elastic.agent.live.workers import LiveWorkers
from elastic.agent.prewarm.pool import TemplatePool
from elastic.agent.processes.group_settings import GroupSettings
from elastic.agent.processes.group_state import GroupState, WorkersView
from elastic.agent.processes.logs_specs import LogsSpecsHost
from elastic.agent.processes.workers import WorkerGroup
from elastic.config import LaunchConfig
from elastic.rendezvous.api import RendezvousInfo


class Workers(Protocol):
    """A node's workers, as the agent drives them."""

    rdzv: RendezvousInfo
    """The round these workers belong to."""

    @property
    def world_size(self) -> int:
        """``WORLD_SIZE`` of the round."""

    def start(self) -> None:
        """Start every worker (from the agent's main thread: see :mod:`elastic.agent.pdeathsig`).

        Raises:
            WorkerStartError: a worker could not be started; those already started are stopped.
        """

    def look(self) -> WorkersView:
        """One look at the workers, without blocking: all the agent decides on in one turn."""

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from any thread) after each worker exit."""

    def held(self, until: float | None) -> None:
        """The store cannot have dropped this node before ``until`` (a lease renewal; None: none
        known): tell the workers that read it."""

    def refill(self, *, attempt: int, restart_count: int, use_agent_store: bool) -> tuple[int, ...]:
        """Replace the workers that failed in the round in use, as of the last look; the local
        ranks started (``()``: none, or the kind cannot).

        Raises:
            WorkerStartError: a replacement could not be started.
        """

    def move_to(self, info: RendezvousInfo, *, attempt: int, restart_count: int,
                use_agent_store: bool) -> tuple[int, ...]:
        """Move the running workers to round ``info`` (they were kept: see
        :func:`~elastic.agent.live.decisions.keeps_workers`) and restart the exited ones in it;
        the local ranks restarted.

        Raises:
            WorkerStartError: a worker could not be started, or the kind cannot move.
        """

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to every live worker and its descendants."""

    def stop(self, timeout: float | None = None) -> GroupState:
        """Stop every worker's process tree (SIGTERM, ``timeout``, SIGKILL); idempotent."""

    def pids(self) -> dict[int, int]:
        """Local rank → pid of the current workers."""

    def global_ranks(self) -> list[int]:
        """The global ranks of this node's workers, by local rank."""

    def failure_report(self, host: str) -> str:
        """The root-cause summary of the group's failures."""


class GroupFactory(Protocol):
    """Makes the (not yet started) worker group of one attempt."""

    def __call__(self, info: RendezvousInfo, *, attempt: int, restart_count: int, use_agent_store: bool) -> Workers:
        """``restart_count``: ``TORCHELASTIC_RESTART_COUNT``; ``use_agent_store``: ``TORCHELASTIC_USE_AGENT_STORE``."""


def worker_groups(config: LaunchConfig, node_id: str, templates: TemplatePool | None,
                  logs_specs: LogsSpecsHost | None = None) -> GroupFactory:
    """The factory of this node's groups: :class:`LiveWorkers` with ``--live-recovery``, else a
    :class:`WorkerGroup` per attempt; every group starts with the same :class:`GroupSettings`
    (``logs_specs``: the helper of ``config.logs_specs``' plugin, which every group reifies
    through)."""
    settings = GroupSettings(node_id=node_id, templates=templates, logs_specs=logs_specs)
    kind = LiveWorkers if config.live_recovery else WorkerGroup

    def make(info: RendezvousInfo, *, attempt: int, restart_count: int, use_agent_store: bool) -> Workers:
        return kind(config, info, attempt=attempt, restart_count=restart_count, use_agent_store=use_agent_store,
                    settings=settings)

    return make
