"""Finding and stopping the process trees of a node's workers.

Each worker leads its own session and process group, so everything it starts can be found from
its pid: its descendants (parent → children links) and, for processes whose parent died first
(re-parented to init), the members of its session or process group.

Descendants are cheap to find: on Linux ``/proc/<pid>/task/<tid>/children`` names a process's
children, so a tree costs one read per process *in the tree*. (psutil's ``children()`` reads every
process on the host to build a parent map.) Session members can only be found by looking at
every process on the host, so :class:`WorkerTrees` does that only at the few moments of a stop
that need it: when a stop or a forwarded signal begins, before the SIGKILL, and for a last look
once every tracked process is gone. While it waits out the grace period it follows only the
descendants of what it already tracks. The process lister is injected, so tests use a table.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Protocol

import psutil

log = logging.getLogger(__name__)

__all__ = ["KILL_GRACE_S", "ProcLister", "ProcessLister", "WorkerTrees", "alive", "find_tree"]

# After SIGKILL, how long to wait for processes to vanish before giving up on them (a process in
# uninterruptible sleep cannot die; the agent must not hang on it).
KILL_GRACE_S = 5.0
# While waiting for a tree to exit: how often to look for descendants spawned meanwhile.
RESCAN_S = 0.25


class ProcessLister(Protocol):
    """The process table, as :func:`find_tree` reads it."""

    def children(self, pid: int) -> Iterable[int]:
        """The direct children of ``pid`` (none if it is gone)."""

    def pids(self) -> Iterable[int]:
        """Every process on the host: the expensive call."""

    def session_and_group(self, pid: int) -> tuple[int, int] | None:
        """``(session id, process group id)`` of ``pid``; None if it is gone."""


class ProcLister:
    """The real process table: ``/proc/<pid>/task/*/children`` where the kernel offers it
    (Linux with ``CONFIG_PROC_CHILDREN``), psutil otherwise."""

    def __init__(self) -> None:
        self._proc_children = os.path.exists(f"/proc/self/task/{os.getpid()}/children")

    def children(self, pid: int) -> list[int]:
        if not self._proc_children:
            try:
                return [child.pid for child in psutil.Process(pid).children()]
            except psutil.Error:
                return []
        found: list[int] = []
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return found
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    found.extend(int(token) for token in f.read().split())
            except OSError:
                continue  # the thread exited meanwhile
        return found

    def pids(self) -> list[int]:
        return psutil.pids()

    def session_and_group(self, pid: int) -> tuple[int, int] | None:
        try:
            return os.getsid(pid), os.getpgid(pid)
        except OSError:
            return None


def find_tree(
    lister: ProcessLister,
    roots: Iterable[int],
    sessions: Collection[int] = (),
    *,
    scan_sessions: bool = False,
    exclude: Collection[int] = (),
) -> set[int]:
    """``roots`` and their descendants; with ``scan_sessions``, also every process whose session
    or process group is in ``sessions`` (one pass over the host's processes). Never ``exclude``.

    Follows each pid once, so a table that changes while it is read (or a fake with a cycle)
    cannot loop.
    """
    found: set[int] = set()
    queue = list(roots)
    while queue:
        pid = queue.pop()
        if pid in found:
            continue
        found.add(pid)
        queue.extend(child for child in lister.children(pid) if child not in found)
    if scan_sessions and sessions:
        for pid in lister.pids():
            if pid in found:
                continue
            ids = lister.session_and_group(pid)
            if ids is not None and (ids[0] in sessions or ids[1] in sessions):
                found.add(pid)
    return found - set(exclude)


def alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (psutil also checks the pid was not reused)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class WorkerTrees:
    """Signals and stops the process trees of one worker group.

    Args:
        leaders: the pids of the workers not yet reaped (their pids are still theirs, and name
            their process groups for ``killpg``).
        sessions: the pids of every worker started (the ids of their sessions).
        wait: sleeps up to the given seconds, waking early when a worker exits.
        label: how log lines name the group (``Run <id> attempt <k>``).
        lister: the process table (default: :class:`ProcLister`).
        clock: monotonic seconds, for the grace and kill deadlines.
    """

    def __init__(
        self,
        leaders: Callable[[], list[int]],
        sessions: Callable[[], Collection[int]],
        *,
        wait: Callable[[float], object],
        label: str,
        lister: ProcessLister | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._leaders = leaders
        self._sessions = sessions
        self._wait = wait
        self._label = label
        self._lister = lister if lister is not None else ProcLister()
        self._known: dict[int, psutil.Process] = {}
        self._clock = clock

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` once to every live worker and all of its tree."""
        procs, groups = self._find(scan_sessions=True)
        self._signal(procs, groups, sig)

    def terminate(self, grace: float) -> None:
        """SIGTERM every tree, wait up to ``grace`` seconds, SIGKILL what is left, and wait (at
        most :data:`KILL_GRACE_S`) for it to vanish; logs what survived. Never raises for
        processes that vanish meanwhile."""
        procs, groups = self._find(scan_sessions=True)
        if not procs and not groups:
            return
        log.info("%s: sending SIGTERM to %d process(es); SIGKILL after %.1fs.",
                 self._label, len(procs), grace)
        self._signal(procs, groups, signal.SIGTERM)
        if self._wait_gone(procs, self._clock() + grace):
            return
        # The tracked ones too: one that left its session and lost its parent is found no other way.
        procs, groups = self._find(scan_sessions=True, also=[pid for pid, p in procs.items() if alive(p)])
        survivors = {pid: p for pid, p in procs.items() if alive(p)}
        if survivors or groups:
            log.warning("%s: %d process(es) survived SIGTERM for %.1fs; sending SIGKILL: %s",
                        self._label, len(survivors), grace, sorted(survivors))
            self._signal(survivors, groups, signal.SIGKILL)
        if not self._wait_gone(survivors, self._clock() + KILL_GRACE_S, rescan=False):
            left = sorted(pid for pid, p in survivors.items() if alive(p))
            log.error("%s: processes %s did not die %.0fs after SIGKILL (uninterruptible sleep?); "
                      "abandoning them.", self._label, left, KILL_GRACE_S)

    def _find(
        self, *, scan_sessions: bool, also: Iterable[int] = ()
    ) -> tuple[dict[int, psutil.Process], list[int]]:
        """Every process to signal (by pid), and the process groups of unreaped workers."""
        groups = self._leaders()
        pids = find_tree(self._lister, [*groups, *also], self._sessions(),
                         scan_sessions=scan_sessions, exclude=(os.getpid(),))
        procs = {}
        for pid in pids:
            proc = self._known.get(pid)
            if proc is None or not proc.is_running():  # not seen yet, or the pid was reused
                try:
                    proc = self._known[pid] = psutil.Process(pid)
                except psutil.Error:
                    continue
            procs[pid] = proc
        return procs, groups

    def _signal(self, procs: Mapping[int, psutil.Process], groups: list[int], sig: int) -> None:
        """Signal each process exactly once: whole groups with ``killpg``, the rest one by one.

        (Twice would matter: a worker that handles SIGUSR1 and exits would be killed by the
        second one arriving while the interpreter shuts down.)
        """
        signalled = set()
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
                signalled.add(pgid)
            except OSError:
                pass
        for proc in procs.values():
            try:
                if os.getpgid(proc.pid) in signalled:
                    continue
                proc.send_signal(sig)
            except (OSError, psutil.Error):
                pass

    def _wait_gone(self, procs: dict[int, psutil.Process], deadline: float, rescan: bool = True) -> bool:
        """Wait until no tracked process nor worker lives; SIGTERM and track newcomers (the
        descendants of what is tracked; the whole sessions once more at the end). False at
        the deadline."""
        next_scan = self._clock() + RESCAN_S
        while True:
            now = self._clock()
            if rescan and now >= next_scan:
                self._track_newcomers(procs, scan_sessions=False)
                next_scan = now + RESCAN_S
            if not self._leaders() and not any(alive(p) for p in procs.values()):
                if not rescan or not self._track_newcomers(procs, scan_sessions=True):
                    return True  # nothing left, not even a late descendant
            if now >= deadline:
                return False
            self._wait(min(0.05, max(0.0, deadline - now)))

    def _track_newcomers(self, procs: dict[int, psutil.Process], *, scan_sessions: bool) -> bool:
        """Add (and SIGTERM) processes of the trees spawned since ``procs`` was taken."""
        tracked = [pid for pid, p in procs.items() if alive(p)]
        found, _ = self._find(scan_sessions=scan_sessions, also=tracked)
        new = {pid: p for pid, p in found.items() if pid not in procs and alive(p)}
        self._signal(new, [], signal.SIGTERM)
        procs.update(new)
        return bool(new)
