"""The PID file of one agent's live workers, and stopping the workers a dead agent left.

An agent keeps ``<state dir>/workers-<host key>-<agent pid>.json`` up to date: its own identity
and each live worker's, where an identity is a pid *and* the process's start time, so a pid the
kernel gave to another process since is never taken for a worker. A pid means something only
in one PID namespace of one boot of one machine: :func:`host_key` names that (host name, boot
id, PID namespace), the file's name and content carry it, and nobody acts on a file of another
key. (Agents sharing ``--log-dir`` across hosts, or in containers with their own PID
namespaces, once judged each other's pids in their own namespace: one SIGKILLed an unrelated
local process and deleted a live agent's file.) Two readers use it: the lifeline
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
import functools
import hashlib
import json
import os
import re
import signal
import socket
import stat
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import psutil

from elastic.agent.errors import PidFileError
from elastic.agent.private_files import replace_file
from elastic.agent.processes.proctree import ProcLister, find_tree

__all__ = [
    "MAX_FILE_BYTES",
    "Liveness",
    "PidFileError",
    "PidRecord",
    "ProcessId",
    "decode",
    "encode",
    "file_name",
    "host_key",
    "is_file_of",
    "kill_workers",
    "liveness",
    "read",
    "remove",
    "write",
]

MAX_FILE_BYTES = 1 << 20
"""A PID file larger than this is refused (it names a node's workers: a few hundred bytes)."""

VERSION = 2
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


@functools.lru_cache(maxsize=1)
def host_key() -> str:
    """Where this process's pids mean something: ``<host name>-<12 hex digits>``, the digits a
    hash of the boot id and the PID namespace (Linux; elsewhere the host name alone)."""
    name = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:63] or "host"
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii", errors="replace") as boot:
            boot_id = boot.read(64).strip()
    except OSError:
        boot_id = ""
    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = ""
    return f"{name}-{hashlib.sha256(f'{boot_id}:{namespace}'.encode()).hexdigest()[:12]}"


_KEY = re.compile(r"[A-Za-z0-9._-]{1,80}")


def file_name(host: str, pid: int) -> str:
    """The PID file name of agent ``pid`` on ``host`` (a :func:`host_key`)."""
    return f"workers-{host}-{pid}.json"


def is_file_of(name: str, host: str) -> bool:
    """Whether ``name`` is a PID file name of an agent on ``host``."""
    prefix = f"workers-{host}-"
    return name.startswith(prefix) and name.endswith(".json") and name[len(prefix):-len(".json")].isdigit()


@dataclass(frozen=True)
class PidRecord:
    """What one agent's PID file says: the run, the agent, its live workers, and where their
    pids mean something (:func:`host_key`; this host unless given)."""

    run_id: str
    agent: ProcessId
    workers: tuple[ProcessId, ...] = ()
    host: str = field(default_factory=host_key)


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


def encode(live: PidRecord) -> bytes:
    """The file's bytes for ``live``."""
    doc = {"v": VERSION, "run_id": live.run_id, "host": live.host, "agent": _ident(live.agent),
           "workers": [_ident(w) for w in live.workers]}  # fmt: skip
    return json.dumps(doc, sort_keys=True).encode()


def _ident(process: ProcessId) -> dict[str, object]:
    return {"pid": process.pid, "start": process.start}


def decode(data: bytes) -> PidRecord:
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
    run_id, workers, host = doc.get("run_id"), doc.get("workers"), doc.get("host")
    if not isinstance(run_id, str) or not isinstance(workers, list):
        raise PidFileError("'run_id' must be a string and 'workers' a list")
    if not isinstance(host, str) or not _KEY.fullmatch(host):
        raise PidFileError(f"'host' must be a host key (letters, digits, '.', '_', '-'), not {str(host)[:100]!r}")
    return PidRecord(run_id, _process_id(doc.get("agent")), tuple(_process_id(w) for w in workers), host)


def _process_id(item: object) -> ProcessId:
    if not isinstance(item, dict):
        raise PidFileError(f"a process must be an object with 'pid' and 'start', not {item!r}")
    pid, start = item.get("pid"), item.get("start")
    if type(pid) is not int or pid <= 0 or type(start) not in (int, float):
        raise PidFileError(f"a process needs a positive integer 'pid' and a number 'start': {item!r}")
    return ProcessId(pid, float(start))


def write(path: str, live: PidRecord) -> None:
    """Replace ``path`` atomically with ``live`` (mode 0600). A failed write (a full disk) leaves
    ``path`` as it was and no temporary file, never a file cut short.

    Raises:
        OSError: it could not be written.
    """
    replace_file(path, lambda out: out.write(encode(live)))


def read(path: str) -> PidRecord:
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
