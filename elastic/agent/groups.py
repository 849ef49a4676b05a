"""What the agent needs of a worker group, and the factory that makes the real one.

:class:`~elastic.agent.processes.workers.WorkerGroup` is the implementation; the agent is typed
against :class:`Workers` so its loop can be tested in-process with a fake group
(:mod:`elastic.testing.fake_workers`).
"""

from __future__ import annotations

from typing import Callable, Protocol

from elastic.agent.live.workers import LiveWorkers
from elastic.agent.prewarm.pool import TemplatePool
from elastic.agent.processes.logs_specs import LogsSpecsHost
from elastic.agent.processes.group_settings import GroupSettings
from elastic.agent.processes.group_state import GroupState
from elastic.agent.processes.workers import WorkerGroup
from elastic.config import LaunchConfig
from elastic.rendezvous.api import RendezvousInfo


class Workers(Protocol):
    """One attempt's workers on this node, as the agent drives them."""

    rdzv: RendezvousInfo
    """The round these workers belong to."""

    @property
    def world_size(self) -> int:
        """``WORLD_SIZE`` of the attempt."""

    def start(self) -> None:
        """Start every worker (from the agent's main thread: see :mod:`elastic.agent.lifeline.keeper`).

        Raises:
            WorkerStartError: a worker could not be started; those already started are stopped.
        """

    def poll(self) -> GroupState:
        """The group's state now, without blocking."""

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from any thread) after each worker exit."""

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to every live worker and its descendants."""

    def stop(self, timeout: float | None = None) -> GroupState:
        """Stop every worker's process tree (SIGTERM, ``timeout``, SIGKILL); idempotent."""

    def pids(self) -> dict[int, int]:
        """Local rank → pid of the workers started."""

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
    """The factory of real :class:`WorkerGroup` s for this node (:class:`LiveWorkers` with
    ``--live-recovery``; ``logs_specs``: the helper of ``config.logs_specs``' plugin, which every
    attempt's group reifies through)."""

    settings = GroupSettings(node_id=node_id, templates=templates, logs_specs=logs_specs)
    kind = LiveWorkers if config.live_recovery else WorkerGroup

    def make(info: RendezvousInfo, *, attempt: int, restart_count: int, use_agent_store: bool) -> Workers:
        return kind(config, info, attempt=attempt, restart_count=restart_count, use_agent_store=use_agent_store,
                    settings=settings)

    return make
