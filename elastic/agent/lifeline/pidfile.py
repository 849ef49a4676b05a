"""The PID file of one agent's live workers, and stopping the workers a dead agent left.

An agent keeps ``<state dir>/workers-<agent pid>.json`` up to date: its own identity and each
live worker's, where an identity is a pid *and* the process's start time, so a pid the kernel
gave to another process since is never taken for a worker. Two readers use it: the lifeline
watchdog (:mod:`elastic.agent.lifeline.watchdog`) when its agent dies, and a restarted agent of the same
run, which stops what a dead agent's file still names before it starts new workers.

The file is versioned JSON (never pickle), at most :data:`MAX_FILE_BYTES`, owned by the reader's
user; anything else is a :class:`PidFileError` (one line, the file is left as it is).

Stopping a worker means SIGKILL to it, to its descendants and to every process of its session
(workers are session leaders): that covers a worker's subprocesses and forked DataLoader
workers, even once the worker itself is gone, because Linux does not hand out a pid again while
a session of that id has members. A grandchild that left the session (``setsid``) after its
parent died is out of reach. (One case this cannot tell apart: the worker's session emptied,
its pid went to an unrelated process that led a session of its own and exited, and that
session's members remain; only a restart long after the death leaves time for that.)
"""

from __future__ import annotations

import enum
import json
import os
import signal
import stat
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import psutil

from elastic.agent.errors import PidFileError
from elastic.agent.processes.proctree import ProcLister, find_tree

__all__ = [
    "MAX_FILE_BYTES",
    "LiveWorkers",
    "Liveness",
    "PidFileError",
    "ProcessId",
    "decode",
    "encode",
    "kill_workers",
    "liveness",
    "read",
    "remove",
    "write",
]

MAX_FILE_BYTES = 1 << 20
"""A PID file larger than this is refused (it names a node's workers: a few hundred bytes)."""

VERSION = 1
# Start times are psutil's (boot time + clock ticks): equal for one process whoever reads them.
_START_TOLERANCE_S = 0.05
_KILL_PASSES_S = 2.0
_KILL_WAIT_S = 0.05


@dataclass(frozen=True)
class ProcessId:
    """One process, robust to pid reuse: its pid and its start time (seconds since the epoch)."""

    pid: int
    start: float

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        """The identity of the live process ``pid``, or ``None`` when there is none."""
        start = start_time(pid)
        return None if start is None else cls(pid, start)


@dataclass(frozen=True)
class LiveWorkers:
    """What one agent's PID file says: the run, the agent, and its live workers."""

    run_id: str
    agent: ProcessId
    workers: tuple[ProcessId, ...] = ()


class Liveness(enum.Enum):
    """What became of a recorded process."""

    ALIVE = "alive"  # the recorded process still runs
    GONE = "gone"  # no process has its pid
    REUSED = "reused"  # another process has its pid now


def liveness(recorded: ProcessId, current_start: float | None) -> Liveness:
    """Judge ``recorded`` from the start time of whatever has its pid now (``None``: nothing)."""
    if current_start is None:
        return Liveness.GONE
    if abs(current_start - recorded.start) <= _START_TOLERANCE_S:
        return Liveness.ALIVE
    return Liveness.REUSED


def start_time(pid: int) -> float | None:
    """The start time of process ``pid``, or ``None`` if there is none (a zombie counts as none)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except psutil.Error:
        return None


# -- the file ------------------------------------------------------------------------------------


def encode(live: LiveWorkers) -> bytes:
    """The file's bytes for ``live``."""
    doc = {"v": VERSION, "run_id": live.run_id, "agent": _ident(live.agent),
           "workers": [_ident(w) for w in live.workers]}  # fmt: skip
    return json.dumps(doc, sort_keys=True).encode()


def _ident(process: ProcessId) -> dict[str, object]:
    return {"pid": process.pid, "start": process.start}


def decode(data: bytes) -> LiveWorkers:
    """Parse and validate a PID file's bytes.

    Raises:
        PidFileError: not JSON, an unknown version, or a field of the wrong type.
    """
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PidFileError(f"not JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("v") != VERSION:
        version = doc.get("v") if isinstance(doc, dict) else None
        raise PidFileError(f"unknown version {version!r} (this agent reads version {VERSION})")
    run_id, workers = doc.get("run_id"), doc.get("workers")
    if not isinstance(run_id, str) or not isinstance(workers, list):
        raise PidFileError("'run_id' must be a string and 'workers' a list")
    return LiveWorkers(run_id, _process_id(doc.get("agent")), tuple(_process_id(w) for w in workers))


def _process_id(item: object) -> ProcessId:
    if not isinstance(item, dict):
        raise PidFileError(f"a process must be an object with 'pid' and 'start', not {item!r}")
    pid, start = item.get("pid"), item.get("start")
    if type(pid) is not int or pid <= 0 or type(start) not in (int, float):
        raise PidFileError(f"a process needs a positive integer 'pid' and a number 'start': {item!r}")
    return ProcessId(pid, float(start))


def write(path: str, live: LiveWorkers) -> None:
    """Replace ``path`` atomically with ``live`` (mode 0600)."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, encode(live))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read(path: str) -> LiveWorkers:
    """Read and validate ``path``.

    Raises:
        FileNotFoundError: no such file.
        PidFileError: a symlink, not a regular file, another user's, too large, or bad content.
        OSError: it cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise PidFileError(f"cannot open it ({exc.strerror}; a symlink?)") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PidFileError("not a regular file")
        if info.st_uid != os.geteuid():
            raise PidFileError(f"owned by uid {info.st_uid}, not by this user ({os.geteuid()})")
        if info.st_size > MAX_FILE_BYTES:
            raise PidFileError(f"{info.st_size} bytes, more than {MAX_FILE_BYTES}")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    return decode(data)


def remove(path: str, *, directory_too: bool = True) -> None:
    """Remove a PID file if it exists, and (``directory_too``) its directory if now empty."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    if directory_too:
        try:
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass  # not empty (logs, another agent's file) or already gone


# -- stopping --------------------------------------------------------------------------------------


def kill_workers(
    workers: Iterable[ProcessId],
    *,
    budget_s: float = _KILL_PASSES_S,
    clock: Callable[[], float] = time.monotonic,
) -> list[int]:
    """SIGKILL each recorded worker that still runs, its descendants and its session's members.

    Repeats until a pass finds nothing (a process may fork while it is being killed) or
    ``budget_s`` has passed. Returns the pids signalled, sorted. Never raises for processes
    that vanish meanwhile.
    """
    workers = tuple(workers)
    deadline = clock() + budget_s
    killed: set[int] = set()
    while True:
        targets = _targets(workers) - killed
        if not targets:
            break
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        killed |= targets
        if clock() >= deadline:
            break
        time.sleep(_KILL_WAIT_S)
    return sorted(killed)


def _targets(workers: tuple[ProcessId, ...]) -> set[int]:
    """Live pids to kill: recorded workers still running, their descendants, their sessions' members."""
    sessions: set[int] = set()
    roots: list[int] = []
    for worker in workers:
        state = liveness(worker, start_time(worker.pid))
        if state is Liveness.REUSED:
            continue  # the session id is someone else's now
        sessions.add(worker.pid)
        if state is Liveness.ALIVE:
            roots.append(worker.pid)
    found = find_tree(ProcLister(), roots, sessions, scan_sessions=True, exclude=(os.getpid(),))
    return {pid for pid in found if start_time(pid) is not None}
