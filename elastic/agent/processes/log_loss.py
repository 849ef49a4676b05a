"""Saying, without flooding the console, that worker output cannot be written to its log files.

A full disk (or quota) under ``--log-dir`` must cost log lines, never training: the log pumps
(:mod:`elastic.agent.processes.output`) drop what they cannot write, keep draining the worker's
pipe and its console copy, and tell this module. Per filesystem, the agent then says one
warning naming the directory and its free space; while writes keep failing, one more at most
every :data:`REPEAT_S` seconds with the bytes lost so far; and one line when writing works
again. :func:`after_loss` and :func:`after_write` decide (pure, case-table tested);
:class:`LogLossReporter` keeps their state per filesystem and logs.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from elastic.console import CONSOLE

log = logging.getLogger(__name__)

__all__ = ["DISK_FULL", "REPEAT_S", "REPORTER", "LogLossReporter", "LossState", "Say", "after_loss", "after_write",
           "free_bytes", "size_text"]

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The ``errno`` values of a full disk or quota: a state that passes, not a mistake."""

REPEAT_S = 60.0
"""The least time between two lines about one filesystem's lost output."""


class Say(enum.Enum):
    """The line to log after a write: the first failure of an episode, a reminder, or the end."""

    FULL = "full"
    STILL_FULL = "still_full"
    RESUMED = "resumed"


@dataclass(frozen=True)
class LossState:
    """One filesystem's writes: whether they fail now (an episode), whether this episode was
    said, when the last line was said (monotonic seconds; None: never) and the bytes lost in
    this episode."""

    failing: bool = False
    said: bool = False
    last_said: float | None = None
    lost: int = 0


def after_loss(state: LossState, nbytes: int, now: float, every_s: float) -> tuple[LossState, Say | None]:
    """After a write of ``nbytes`` failed: the new state and the line to say, if any.

    A line is said at most every ``every_s`` seconds (a new episode that starts sooner after the
    last line is said once that time has passed, if it still lasts).
    """
    lost = (state.lost if state.failing else 0) + nbytes
    said = state.said and state.failing
    due = state.last_said is None or now - state.last_said >= every_s
    if not due:
        return LossState(failing=True, said=said, last_said=state.last_said, lost=lost), None
    return LossState(failing=True, said=True, last_said=now, lost=lost), Say.STILL_FULL if said else Say.FULL


def after_write(state: LossState, now: float) -> tuple[LossState, Say | None]:
    """After a write succeeded: the new state and the line to say, if any (the end of an
    episode that was said)."""
    if not state.failing:
        return state, None
    if not state.said:
        return dataclasses.replace(state, failing=False, lost=0), None
    return LossState(last_said=now), Say.RESUMED


def free_bytes(directory: str) -> int | None:
    """Bytes an unprivileged user may still write on ``directory``'s filesystem (None: unknown)."""
    path = os.path.abspath(directory)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)  # not created (the disk is full): its filesystem is its ancestor's
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def size_text(nbytes: int | None) -> str:
    """``0 B``, ``812 B``, ``12.0 KiB``, ``3.9 MiB``...; ``an unknown amount`` for None."""
    if nbytes is None:
        return "an unknown amount"
    size, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{nbytes} B" if unit == "B" else f"{size:.1f} {unit}"


class LogLossReporter:
    """Logs the lines :func:`after_loss` and :func:`after_write` decide, per filesystem.

    Thread-safe (one per agent process: every pump reports here). ``clock``: monotonic seconds.
    """

    def __init__(self, *, every_s: float = REPEAT_S, clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger = log) -> None:
        if every_s <= 0:
            raise ValueError(f"The repeat interval ({every_s}) must be positive.")
        self._every_s = every_s
        self._clock = clock
        self._log = logger
        self._lock = threading.Lock()
        self._states: dict[object, tuple[LossState, str]] = {}

    def lost(self, directory: str, nbytes: int, error: OSError) -> None:
        """``nbytes`` of output for a file in ``directory`` were dropped: writing failed with ``error``."""
        key = _filesystem(directory)
        with self._lock:
            state, named = self._states.get(key, (LossState(), directory))
            if not state.failing:
                named = directory
            state, say = after_loss(state, nbytes, self._clock(), self._every_s)
            self._states[key] = (state, named)
        reason = error.strerror or str(error)
        if say is Say.FULL:
            self._log.warning(
                "Worker output cannot be written under %s (%s; %s free there): the workers run on, but "
                "their log files miss what they print from now on (the console copy of --tee does not) "
                "until there is space again; said again at most every %.0f s while it lasts.",
                named, reason, size_text(free_bytes(named)), self._every_s)
        elif say is Say.STILL_FULL:
            self._log.warning("Worker output still cannot be written under %s (%s; %s free there): %s lost so far.",
                              named, reason, size_text(free_bytes(named)), size_text(state.lost))

    def written(self, directory: str) -> None:
        """A write to a file in ``directory`` succeeded after its stream had lost output."""
        key = _filesystem(directory)
        with self._lock:
            before, named = self._states.get(key, (LossState(), directory))
            state, say = after_write(before, self._clock())
            self._states[key] = (state, named)
        if say is Say.RESUMED:
            self._log.info("Worker output is written under %s again (%s free there); %s were lost meanwhile, "
                           "each gap marked in its file.", named, size_text(free_bytes(named)),
                           size_text(before.lost), extra=CONSOLE)


def _filesystem(directory: str) -> object:
    """What identifies ``directory``'s filesystem: the device of it or of its nearest existing
    ancestor (a full disk may have refused to create it); the path when none can be read."""
    path = os.path.abspath(directory)
    while True:
        try:
            return os.stat(path).st_dev
        except OSError:
            parent = os.path.dirname(path)
            if parent == path:
                return directory
            path = parent


REPORTER = LogLossReporter()
"""The agent's reporter: every log pump of the process reports to it."""
