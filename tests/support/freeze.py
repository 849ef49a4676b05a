"""Freeze a process for a fault-injection test and know that it is frozen.

``kill(pid, SIGSTOP)`` returns before every thread of the target has stopped (under gVisor a
thread in a host call stops only when the call returns), so a request sent right after it may
still be answered. :func:`freeze` waits until ``/proc`` shows every thread stopped.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

STOPPED_STATES = frozenset("Tt")


def thread_states(pid: int) -> list[str]:
    """The scheduler state letter of each thread of ``pid`` (``/proc/PID/task/*/stat``); [] when gone."""
    states = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread exited meanwhile
        states.append(stat[stat.rindex(")") + 2])  # the field after "(comm)": comm may hold spaces
    return states


def freeze(pid: int, timeout: float = 5.0) -> None:
    """SIGSTOP ``pid`` and wait until all its threads are stopped.

    Raises:
        TimeoutError: some thread still ran after ``timeout`` seconds.
        ProcessLookupError: no such process.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        states = thread_states(pid)
        if states and all(state in STOPPED_STATES for state in states):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"pid {pid} was sent SIGSTOP but its threads are still {''.join(states)!r} after {timeout}s")
        time.sleep(0.01)


def thaw(pid: int) -> None:
    """SIGCONT ``pid``."""
    os.kill(pid, signal.SIGCONT)
