"""Workers die with their agent, whatever kills it (SIGKILL, the OOM killer, a crash).

Three mechanisms, each covering what the one before cannot:

1. **Parent-death signal** (Linux): :func:`~elastic.agent.pdeathsig.parent_death_preexec` gives
   ``Popen`` a ``preexec_fn`` that calls ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` in the child before exec, then
   re-checks the parent pid (an agent that died before the ``prctl`` would never send the
   signal) and kills itself if the parent changed. The kernel sends the signal when the
   *thread* that forked the child exits, so workers must be forked by a thread that lives as
   long as the agent: the agent's main thread (``ElasticAgent.run`` → ``WorkerGroup.start``). A
   worker forked by any other thread gets no parent-death signal (logged once); the watchdog
   still covers it. The signal reaches the direct child only.
2. **The watchdog** (any POSIX system, :mod:`elastic.agent.lifeline.watchdog`), one per agent, in its
   own session, started without the agent's working directory on its path
   (:mod:`elastic.agent.safe_path`), holds the read end of a pipe whose only write end is the agent's. It is
   started as soon as the command line is read, and told its PID file's path on that pipe once
   the file exists (:mod:`elastic.agent.lifeline.watchdog_process`). When the
   agent dies, however, the kernel closes that end; the watchdog reads EOF,
   SIGKILLs every worker its agent's PID file names with their descendants and sessions
   (:func:`elastic.agent.lifeline.pidfile.kill_workers`), removes the file and exits. This is what
   catches grandchildren: a worker's subprocesses and forked DataLoader workers stay in its
   session. An agent that exits normally removes its file first, so the watchdog finds
   nothing to do.
3. **The restarted agent**: :meth:`Lifeline.open` reads the PID files of dead agents of the
   same run in the same state directory and stops what they still name, with one log line.
   That covers an agent killed together with its watchdog. Only files of this host and PID
   namespace (:func:`~elastic.agent.lifeline.pidfile.host_key`) are read: the state directory
   may be a ``--log-dir`` shared by several hosts.

The state directory is ``<log_dir>/<run_id>``, or ``<tmp>/elasticrun-<uid>/<run_id>``. Another
user can create ``<tmp>/elasticrun-<uid>`` first (``/tmp`` is world-writable): then the PID
files go to ``$XDG_STATE_HOME/elasticrun`` (``~/.local/state/elasticrun``), with one warning.
Falling back beats failing: a squat is a denial of service any local user can mount against
another, and failing would stop every job of the victim; the fallback keeps every protection
and is stable, so a restarted agent finds it. Our own directory with group or other access
is made 0700 again (any entry someone else made in it is refused by its owner).
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
import threading
from typing import Iterable, Mapping

from elastic.agent.lifeline import pidfile
from elastic.agent.errors import LifelineError
from elastic.agent.lifeline.pidfile import PidRecord, ProcessId
from elastic.agent.lifeline.watchdog_process import Watchdog
from elastic.agent.processes.log_loss import DISK_FULL, free_bytes, size_text
from elastic.console import CONSOLE

log = logging.getLogger(__name__)

__all__ = ["Lifeline", "state_dir"]

def state_dir(log_dir: str | None, run_id: str, environ: Mapping[str, str] = os.environ) -> str:
    """Where a run's PID files live: ``<log_dir>/<run_id>``, or without ``--log-dir``
    ``<tmp>/elasticrun-<uid>/<run_id>`` (stable, so a restarted agent finds it), falling back to
    ``$XDG_STATE_HOME/elasticrun/<run_id>`` when the former is not a private directory of this
    user (see the module docstring).

    Raises:
        OSError: neither root can be created as a private directory of this user.
    """
    root = log_dir
    if not root:
        shared = os.path.join(tempfile.gettempdir(), f"elasticrun-{os.geteuid()}")
        try:
            root = _private_dir(shared, repair_mode=True)
        except OSError as error:
            state_home = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
            root = _private_dir(os.path.join(state_home, "elasticrun"), repair_mode=True)
            log.warning("Run %s: cannot keep PID files in %s (%s; another user may have created it); keeping "
                        "them in %s instead.", run_id, shared, error, root)
    return os.path.join(root, run_id.replace(os.sep, "_") or "run")


class Lifeline:
    """The agent's side: its PID file and its watchdog. Use :meth:`open`; :meth:`close` at exit."""

    def __init__(self, directory: str, run_id: str, node: str) -> None:
        self.directory = directory
        self.run_id = run_id
        self._node = node
        me = ProcessId.of(os.getpid())
        if me is None:  # psutil cannot see this process: nothing can be tracked
            raise LifelineError("cannot read this process's start time")
        self._me = me
        self._host = pidfile.host_key()
        self.path = os.path.join(directory, pidfile.file_name(self._host, me.pid))
        self._workers: dict[int, ProcessId] = {}
        self._lock = threading.Lock()
        self._watchdog: Watchdog | None = None
        self._unwritten = False  # the last write of the PID file failed (and was said)

    @classmethod
    def open(cls, directory: str, run_id: str, node: str, *, watchdog: bool | Watchdog = True) -> Lifeline:
        """Stop what dead agents of this run left in ``directory``, then write our (empty) PID
        file and arm the watchdog: ``watchdog`` started earlier (:meth:`Watchdog.start`), then
        owned by the lifeline, or True to start one now, or False for none.

        Raises:
            OSError: the directory cannot be created, the PID file cannot be written for another
                reason than a full disk (that is said once), or the watchdog cannot start or is
                gone (a watchdog passed in is closed then).
        """
        try:
            lifeline = cls(_private_dir(directory), run_id, node)
            lifeline.stop_stale()
            try:
                lifeline._write()
            except OSError as error:
                if error.errno not in DISK_FULL:
                    raise
                lifeline._failed(error)  # a full disk passes: the watchdog starts, a later update writes it
        except BaseException:
            if isinstance(watchdog, Watchdog):
                watchdog.close(run_id)
            raise
        if watchdog is not False:
            try:
                lifeline._watchdog = watchdog if isinstance(watchdog, Watchdog) else Watchdog.start()
                lifeline._watchdog.arm(lifeline.path)
            except OSError:
                lifeline._close_watchdog()
                pidfile.remove(lifeline.path)
                raise
        return lifeline

    @property
    def watchdog_pid(self) -> int | None:
        """The watchdog's pid (None without one)."""
        return self._watchdog.pid if self._watchdog is not None else None

    def stop_stale(self) -> list[int]:
        """SIGKILL the workers named by the PID files of dead agents here, and remove those files.

        Only files of this host and PID namespace are read (by name, then by content); files of
        live agents (another node of the run on this host) are left alone; a bad file is
        reported in one line and left in place. Returns the pids signalled.
        """
        stopped: list[int] = []
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return stopped
        for name in names:
            path = os.path.join(self.directory, name)
            if not pidfile.is_file_of(name, self._host) or path == self.path:
                continue  # another host's (a shared --log-dir) or PID namespace's: its pids are not ours
            try:
                live = pidfile.read(path)
            except FileNotFoundError:
                continue
            except (pidfile.PidFileError, OSError) as exc:
                log.warning("Run %s node %s: ignoring the PID file %s: %s", self.run_id, self._node, path, exc)
                continue
            if live.host != self._host:
                log.warning("Run %s node %s: ignoring the PID file %s: it names host %s, not this one (%s)",
                            self.run_id, self._node, path, live.host, self._host)
                continue
            if pidfile.liveness(live.agent, pidfile.start_time(live.agent.pid)) is pidfile.Liveness.ALIVE:
                continue
            killed = pidfile.kill_workers(live.workers)
            if killed:
                log.warning("Run %s node %s: stopped %d process(es) %s left by an earlier agent (pid %d) of "
                            "this run before starting new workers.", self.run_id, self._node, len(killed),
                            killed, live.agent.pid)
            stopped.extend(killed)
            pidfile.remove(path, directory_too=False)
        return stopped

    def track(self, pids: Iterable[int]) -> None:
        """Add workers to the PID file (call right after they start); a failed write is said once."""
        with self._lock:
            for pid in pids:
                ident = ProcessId.of(pid)
                if ident is not None:
                    self._workers[pid] = ident
            self._write_logged(misses_live=True)

    def untrack(self, pids: Iterable[int]) -> None:
        """Drop workers from the PID file (call once they are stopped). A failed write leaves them
        named, which is harmless (a stopped process's start time never matches again): logged at
        DEBUG only."""
        with self._lock:
            for pid in pids:
                self._workers.pop(pid, None)
            self._write_logged(misses_live=False)

    def close(self) -> None:
        """Release the watchdog. Normally no worker is tracked any more: the PID file is removed
        first and the watchdog exits finding nothing to do. Workers still tracked (the agent is
        exiting on an unexpected error) are left in the file for the watchdog to kill."""
        with self._lock:
            if not self._workers:
                pidfile.remove(self.path)
        self._close_watchdog()

    def _close_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.close(self.run_id)

    def _write(self) -> None:
        live = PidRecord(self.run_id, self._me, tuple(self._workers.values()), self._host)
        try:
            pidfile.write(self.path, live)
        except FileNotFoundError:  # a dead agent's watchdog removed the emptied directory
            _private_dir(self.directory)
            pidfile.write(self.path, live)

    def _write_logged(self, *, misses_live: bool) -> None:
        """:meth:`_write`, never raising. A failure that leaves live workers out of the file
        (``misses_live``) is said once, until a write works again."""
        try:
            self._write()
        except OSError as error:
            if misses_live:
                self._failed(error)
            else:
                log.debug("Run %s node %s: the PID file %s still names stopped workers (%s).", self.run_id,
                          self._node, self.path, error)
            return
        if self._unwritten:
            self._unwritten = False
            log.info("Run %s node %s: the PID file %s is up to date again.", self.run_id, self._node, self.path,
                     extra=CONSOLE)

    def _failed(self, error: OSError) -> None:
        if self._unwritten:
            return
        self._unwritten = True
        log.warning("Run %s node %s: cannot update the PID file %s (%s; %s free there); a restarted agent or the "
                    "watchdog may miss these workers. Said once, until it can be written again.", self.run_id,
                    self._node, self.path, error.strerror or error, size_text(free_bytes(self.directory)))


def _private_dir(directory: str, *, repair_mode: bool = False) -> str:
    """``directory``, created (0700) if missing; with ``repair_mode``, made 0700 again when it is
    ours but open to others (not done for a run directory under ``--log-dir``, which may be
    meant for a group to read).

    Raises:
        OSError: it cannot be created; LifelineError (an OSError): it is not a directory owned
            by this user (a PID file found there could name any process).
    """
    os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise LifelineError(f"{directory} is not a directory owned by this user (uid {os.geteuid()})")
    if repair_mode and info.st_mode & 0o077:  # ours, but others could rename or delete our files in it
        os.chmod(directory, 0o700)
    return directory
