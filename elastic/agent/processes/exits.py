"""Seeing a group's workers exit: one thread per worker blocked in ``wait()``, so nothing polls.

Each exit is stamped under one lock, so the order in which looks see exits is the order they
happened; then the group's exit callbacks run (they wake the agent), and a failure the agent did
not cause is logged. :meth:`Exits.wait` sleeps on the same lock's condition.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from typing import Callable

from elastic.agent.prewarm.pool import ForkedWorker
from elastic.agent.processes.output import PUMP_DRAIN_S
from elastic.agent.processes.worker_proc import Worker

log = logging.getLogger(__name__)

__all__ = ["Exits"]


class Exits:
    """The exits of one group's workers.

    Args:
        label: how log lines name the group (``Run <id> attempt <k>``).
        stopping: whether the agent began stopping the group (its exits are then not logged).
    """

    def __init__(self, label: str, stopping: Callable[[], bool]) -> None:
        self._label = label
        self._stopping = stopping
        self._cond = threading.Condition()
        self._count = 0
        self._callbacks: list[Callable[[], None]] = []

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after each exit is recorded (from a watcher thread; quick, never raising)."""
        self._callbacks.append(callback)

    def watch(self, worker: Worker, proc: subprocess.Popen | ForkedWorker) -> None:
        """Start the thread that waits for ``worker``'s process."""
        worker.watcher = threading.Thread(target=self._wait_for, args=(worker, proc), name=f"watch-{worker.local_rank}",
                                          daemon=True)
        worker.watcher.start()

    def look(self, workers: list[Worker]) -> tuple[list[Worker], frozenset[int]]:
        """The workers that exited, in exit order, and the local ranks still running."""
        with self._cond:
            exited = sorted((w for w in workers if w.exitcode is not None), key=lambda w: w.exit_monotonic)
            running = frozenset(w.local_rank for w in workers if w.exitcode is None)
        return exited, running

    def unreaped(self, workers: list[Worker]) -> list[Worker]:
        """The workers started and not yet seen to exit (their pids are still theirs)."""
        with self._cond:
            return [w for w in workers if w.proc is not None and w.exitcode is None]

    @property
    def count(self) -> int:
        """How many exits were recorded so far."""
        with self._cond:
            return self._count

    def wait(self, seen: int | None = None, timeout: float | None = None) -> None:
        """Sleep until more than ``seen`` exits were recorded (None: any exit from now), or ``timeout``."""
        with self._cond:
            if seen is None:
                self._cond.wait(timeout)
            else:
                self._cond.wait_for(lambda: self._count != seen, timeout)

    def join(self, workers: list[Worker], timeout: float = 1.0) -> None:
        """Wait (bounded) for the watcher threads."""
        for worker in workers:
            if worker.watcher is not None:
                worker.watcher.join(timeout=timeout)

    def _wait_for(self, worker: Worker, proc: subprocess.Popen | ForkedWorker) -> None:
        code = proc.wait()
        with self._cond:  # stamped under the lock: exit order == the order looks see exits
            worker.exitcode = code
            worker.exit_monotonic, worker.exit_time = time.monotonic(), time.time()
            self._count += 1
            self._cond.notify_all()
        for callback in list(self._callbacks):
            callback()
        if code == 0 or self._stopping():
            return
        # After a traceback that only said a peer left, the agent's line about the peer says it.
        kept_in = worker.output.peer_left_at_end(PUMP_DRAIN_S) if worker.output is not None else None
        log.log(logging.INFO if kept_in else logging.WARNING, "%s: local rank %d (rank %d, pid %d) exited with %d%s.",
                self._label, worker.local_rank, worker.global_rank, worker.pid, code,
                f" after a traceback that says a peer left (in {kept_in})" if kept_in else "")
