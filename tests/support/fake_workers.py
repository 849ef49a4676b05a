"""In-memory worker groups for unit tests of an agent (:class:`elastic.agent.groups.Workers`).

No process is started. Each group's :class:`Fate` decides what its workers do once started:
all succeed, local rank 0 fails, or all run until stopped; a test may also end workers itself,
from any thread (:meth:`FakeGroup.exit`), which wakes the agent as a real exit does. A hook on
:class:`FakeGroups` runs as each group starts (in the agent's thread), so a test can act then.
"""

from __future__ import annotations

import enum
import threading
import time
from typing import Callable, Sequence

from elastic.agent.errors import WorkerStartError
from elastic.agent.processes.failures import WorkerFailure
from elastic.agent.processes.group_state import GroupState, WorkersView, group_status
from elastic.rendezvous.api import RendezvousInfo

__all__ = ["Fate", "FakeGroup", "FakeGroups"]


class Fate(enum.Enum):
    """What a fake group's workers do once started."""

    SUCCEED = "succeed"
    FAIL = "fail"
    """Local rank 0 exits 1; the others run until stopped."""
    RUN = "run"
    """Every worker runs until stopped (or until the test ends it)."""
    NO_START = "no_start"
    """:meth:`FakeGroup.start` raises WorkerStartError."""


class FakeGroup:
    """One attempt's fake workers; records what the agent did to them."""

    def __init__(self, rdzv: RendezvousInfo, *, attempt: int, restart_count: int, use_agent_store: bool,
                 nproc: int, fate: Fate, on_start: Callable[[FakeGroup], None] | None = None) -> None:
        self.rdzv = rdzv
        self.attempt = attempt
        self.restart_count = restart_count
        self.use_agent_store = use_agent_store
        self.fate = fate
        self._nproc = nproc
        self._on_start = on_start
        self._lock = threading.Lock()
        self._exits: dict[int, tuple[int, float, bool]] = {}  # local rank → exit code, monotonic, during stop
        self._callbacks: list[Callable[[], None]] = []
        self.started = False
        self.stopping = False
        self.stops = 0
        self.signals: list[int] = []

    @property
    def world_size(self) -> int:
        return self.rdzv.group_world_size * self._nproc

    def start(self) -> None:
        if self.fate is Fate.NO_START:
            raise WorkerStartError(f"Run {self.rdzv.run_id}: cannot start local rank 0 (a scripted failure)")
        self.started = True
        if self.fate is Fate.SUCCEED:
            for rank in range(self._nproc):
                self.exit(rank, 0)
        elif self.fate is Fate.FAIL:
            self.exit(0, 1)
        if self._on_start is not None:
            self._on_start(self)

    def exit(self, local_rank: int, code: int) -> None:
        """Worker ``local_rank`` exits with ``code`` (any thread)."""
        with self._lock:
            if local_rank in self._exits:
                return
            self._exits[local_rank] = (code, time.monotonic(), self.stopping)
        for callback in list(self._callbacks):
            callback()

    def poll(self) -> GroupState:
        with self._lock:
            exits = dict(self._exits)
        failures = tuple(
            WorkerFailure(rank, self.global_ranks()[rank], 1000 + rank, code, at, time.time(), during_stop=during)
            for rank, (code, at, during) in sorted(exits.items(), key=lambda item: item[1][1]) if code != 0)
        running = frozenset(rank for rank in range(self._nproc) if rank not in exits)
        return GroupState(group_status(failures, running, self.stopping), failures, running)

    def look(self) -> WorkersView:
        return WorkersView(self.poll())

    def held(self, until: float | None) -> None:
        pass

    def refill(self, *, attempt: int, restart_count: int, use_agent_store: bool) -> tuple[int, ...]:
        return ()

    def move_to(self, info: RendezvousInfo, *, attempt: int, restart_count: int,
                use_agent_store: bool) -> tuple[int, ...]:
        raise WorkerStartError(f"Run {self.rdzv.run_id}: a fake group stays in its round")

    def on_exit(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)

    def stop(self, timeout: float | None = None) -> GroupState:
        self.stops += 1
        self.stopping = True
        for rank in range(self._nproc):
            self.exit(rank, -15)
        return self.poll()

    def pids(self) -> dict[int, int]:
        return {rank: 1000 + rank for rank in range(self._nproc)}

    def global_ranks(self) -> list[int]:
        return [self.rdzv.group_rank * self._nproc + rank for rank in range(self._nproc)]

    def failure_report(self, host: str) -> str:
        failures = [f for f in self.poll().failures if not f.during_stop]
        if not failures:
            return ""
        first = failures[0]
        return f"==== Root cause: rank {first.global_rank} on {host} exited with {first.exitcode} ===="


class FakeGroups:
    """A :class:`~elastic.agent.groups.GroupFactory` of fake groups, one :class:`Fate` per attempt
    (the last repeats).

    Args:
        fates: each attempt's fate, in order.
        nproc: workers per group.
        on_start: called with each group once it started and its fate applied (in the agent's thread).
    """

    def __init__(self, fates: Sequence[Fate], *, nproc: int = 1,
                 on_start: Callable[[FakeGroup], None] | None = None) -> None:
        if not fates:
            raise ValueError("FakeGroups needs at least one fate.")
        self._fates = list(fates)
        self._nproc = nproc
        self._on_start = on_start
        self.made: list[FakeGroup] = []

    def __call__(self, info: RendezvousInfo, *, attempt: int, restart_count: int, use_agent_store: bool) -> FakeGroup:
        fate = self._fates[min(len(self.made), len(self._fates) - 1)]
        group = FakeGroup(info, attempt=attempt, restart_count=restart_count, use_agent_store=use_agent_store,
                             nproc=self._nproc, fate=fate, on_start=self._on_start)
        self.made.append(group)
        return group
