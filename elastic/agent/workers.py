"""One attempt's worker processes on this node: start them, watch them, stop them with no orphans.

A :class:`WorkerGroup` runs ``nproc_per_node`` workers for one rendezvous round and attempt.
Each worker is its own session (``start_new_session``), so the worker and everything it spawns
can be found and signalled; stdin is ``/dev/null``. On Linux each worker also gets the
parent-death signal (:mod:`elastic.agent.lifeline`): start groups from the agent's main thread.

Output, per local rank and stream, as torchrun's ``--redirects``/``--tee``/``--local-ranks-filter``:

==============  =====================================  ============================================
mask            shown rank                             filtered-out rank
==============  =====================================  ============================================
neither         the agent's console, as is (inherited)  discarded
redirect        ``<rank dir>/{stdout,stderr}.log``      the file
tee             the file, and the console with each     the file
                line prefixed ``[{role}{local_rank}]:``
==============  =====================================  ============================================

Logs live in ``<log_root>/<run_id>/<node_id>/attempt_<k>/<local_rank>/`` with the worker's
``error.json`` (its ``TORCHELASTIC_ERROR_FILE``). Tee'd streams are pumped by one thread each
(pipe → file + console, line-buffered, bounded memory); the others are plain file descriptors.

Exits are seen by one thread per worker blocked in ``wait()``, so :meth:`WorkerGroup.wait` sleeps
on a condition instead of polling. :meth:`WorkerGroup.stop` signals each worker's whole tree —
its descendants (psutil), its process group and its session — SIGTERM, waits up to the shutdown
timeout, then SIGKILLs what is left. Call ``stop()`` after every attempt, even a successful one:
it also reaps grandchildren a finished worker left behind.
"""

from __future__ import annotations

import enum
import io
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from string import Template
from typing import IO, TYPE_CHECKING, Mapping

import psutil

from elastic.agent.errors import WorkerStartError
from elastic.agent.failures import (
    WorkerFailure,
    read_error_file,
    read_log_tail,
    root_cause_summary,
)
from elastic.agent.lifeline import parent_death_preexec
from elastic.agent.private_files import open_private_file
from elastic.agent.worker_env import python_executable, worker_argv, worker_env, worker_ranks
from elastic.launch.config import LaunchConfig, Std

if TYPE_CHECKING:
    from elastic.rendezvous.handler import RendezvousInfo

log = logging.getLogger(__name__)

__all__ = [
    "GroupState",
    "GroupStatus",
    "WorkerGroup",
    "WorkerLogs",
    "WorkerStartError",
    "attempt_log_dir",
    "console_prefix",
    "resolve_log_root",
]

# After SIGKILL, how long to wait for processes to vanish before giving up on them (a process in
# uninterruptible sleep cannot die; the agent must not hang on it).
KILL_GRACE_S = 5.0
# How long a pump keeps draining its pipe after stop() once no worker holds it.
PUMP_DRAIN_S = 1.0
# A console line longer than this is emitted in pieces rather than buffered further.
MAX_LINE_BYTES = 64 * 1024
_POLL_S = 0.05
_RESCAN_S = 0.25

_console_lock = threading.Lock()
_default_log_root: str | None = None
_default_log_root_lock = threading.Lock()


class GroupStatus(enum.Enum):
    """Where a worker group stands.

    ``RUNNING`` → ``SUCCEEDED`` (every worker exited 0), ``FAILED`` (a worker exited non-zero or
    was killed before the agent began stopping the group) or ``STOPPED`` (the agent stopped the
    group first). The last three are final.
    """

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class GroupState:
    """A snapshot of a worker group.

    Attributes:
        status: see :class:`GroupStatus`.
        failures: every worker that exited non-zero so far, in exit order; a later snapshot's
            tuple extends an earlier one's. Those killed by :meth:`WorkerGroup.stop` carry
            ``during_stop=True``.
        running: local ranks still running.
    """

    status: GroupStatus
    failures: tuple[WorkerFailure, ...] = ()
    running: frozenset[int] = frozenset()


@dataclass(frozen=True)
class WorkerLogs:
    """Where one worker's output went: file paths, ``None`` for a stream not written to a file."""

    stdout: str | None
    stderr: str | None
    error_file: str


def resolve_log_root(log_dir: str | None) -> str:
    """``--log-dir``, or else one temporary directory per agent process (as torchrun), created
    on first use and shared by every attempt."""
    global _default_log_root
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        return log_dir
    with _default_log_root_lock:
        if _default_log_root is None or not os.path.isdir(_default_log_root):
            _default_log_root = tempfile.mkdtemp(prefix="elasticrun_")
        return _default_log_root


def attempt_log_dir(log_root: str, run_id: str, attempt: int, node_id: str | None = None) -> str:
    """``<log_root>/<run_id>/<node_id>/attempt_<attempt>``: one directory per node, so agents
    may share ``--log-dir`` (a shared volume); a ``/`` in an id becomes ``_``.

    Raises:
        ValueError: the ids would lead outside ``log_root`` (``.``, ``..``): the agent deletes
            an attempt's directory before reusing it, and must never delete anything else.
    """
    parts = [part.replace(os.sep, "_") or "run" for part in (run_id, node_id) if part is not None]
    for part in parts:
        if not part.strip("."):
            raise ValueError(f"The log directory name {part!r} must be a plain name, not only dots.")
    path = os.path.join(log_root, *parts, f"attempt_{attempt}")
    root = os.path.realpath(log_root)
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise ValueError(f"The log directory {path!r} is outside the log root {log_root!r}.")
    return path


def console_prefix(template: str | None, role: str, rank: int, local_rank: int) -> str:
    """The console prefix of a tee'd line: ``[default0]:``, or torchrun's
    ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` with ``${role_name}``, ``${rank}`` (global) and
    ``${local_rank}`` substituted."""
    if template is None:
        return f"[{role}{local_rank}]:"
    return Template(template).safe_substitute(role_name=role, rank=rank, local_rank=local_rank)


class _Route(enum.Enum):
    CONSOLE = "console"  # inherit the agent's stream
    DISCARD = "discard"
    FILE = "file"
    TEE = "tee"


def _route(redirect: bool, tee: bool, shown: bool) -> _Route:
    if tee:
        return _Route.TEE if shown else _Route.FILE
    if redirect:
        return _Route.FILE
    return _Route.CONSOLE if shown else _Route.DISCARD


class _Pump(threading.Thread):
    """Copies a worker's pipe to its log file and, line by line with a prefix, to the console."""

    def __init__(self, name: str, fd: int, path: str | None, console: IO, prefix: str) -> None:
        super().__init__(name=name, daemon=True)
        self._fd = fd
        self._file = open_private_file(path, "wb", buffering=0) if path else None
        self._console = console
        self._prefix = prefix.encode()
        self._partial = b""
        self._stop_at: float | None = None

    def request_stop(self, drain_s: float = PUMP_DRAIN_S) -> None:
        """Finish at EOF, or ``drain_s`` from now at the latest."""
        self._stop_at = time.monotonic() + drain_s

    def run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        try:
            while True:
                if self._stop_at is not None and time.monotonic() >= self._stop_at:
                    break  # a process that escaped the stop still holds the pipe
                if not poller.poll(int(_POLL_S * 1000)):
                    continue
                chunk = os.read(self._fd, 65536)
                if not chunk:
                    break
                if self._file is not None:
                    self._file.write(chunk)
                self._to_console(chunk)
        except OSError:
            log.exception("Log pump %s failed; its output is lost from now on.", self.name)
        finally:
            if self._partial:
                self._emit([self._partial + b"\n"])
            os.close(self._fd)
            if self._file is not None:
                self._file.close()

    def _to_console(self, chunk: bytes) -> None:
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out = [line + b"\n" for line in lines]
        while len(self._partial) > MAX_LINE_BYTES:
            out.append(self._partial[:MAX_LINE_BYTES] + b"\n")
            self._partial = self._partial[MAX_LINE_BYTES:]
        if out:
            self._emit(out)

    def _emit(self, lines: list[bytes]) -> None:
        payload = b"".join(self._prefix + line for line in lines)
        with _console_lock:
            try:
                _write_bytes(self._console, payload)
            except (OSError, ValueError):
                pass  # a closed or broken console must not stop the log file


def _write_bytes(stream: IO, payload: bytes) -> None:
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        stream.flush()
        buffer.write(payload)
        buffer.flush()
    else:
        stream.write(payload.decode("utf-8", errors="replace"))
        stream.flush()


def _fileno(stream: IO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


@dataclass
class _Worker:
    local_rank: int
    global_rank: int
    logs: WorkerLogs
    routes: dict[str, _Route]
    proc: subprocess.Popen | None = None
    ps: psutil.Process | None = None
    pumps: list[_Pump] = field(default_factory=list)
    watcher: threading.Thread | None = None
    exitcode: int | None = None
    exit_monotonic: float = 0.0
    exit_time: float = 0.0
    failure: WorkerFailure | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1


class WorkerGroup:
    """The ``nproc_per_node`` workers of one attempt on this node.

    Args:
        config: the launch configuration (entrypoint, nproc, role, streams, shutdown timeout).
        rdzv: the round these workers belong to.
        attempt: the attempt number, naming the log directory ``attempt_<attempt>``.
        restart_count: ``TORCHELASTIC_RESTART_COUNT`` (restarts after failures so far).
        use_agent_store: ``TORCHELASTIC_USE_AGENT_STORE``.
        log_root: base log directory (from :func:`resolve_log_root`); ``None``:
            ``config.log_dir`` or a new temporary directory.
        environ: the base environment of workers (default: the agent's ``os.environ``).
        python: the interpreter (default: ``$PYTHON_EXEC`` or ours).
        console_stdout, console_stderr: the console (default: ``sys.stdout``/``sys.stderr``).
        line_prefix_template: torchrun's ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``.
        node_id: this node's id in the rendezvous, naming its log directory (agents may share
            ``--log-dir``).

    Raises:
        ValueError: bad counts, or ids that would put the logs outside the log root.
    """

    def __init__(
        self,
        config: LaunchConfig,
        rdzv: RendezvousInfo,
        *,
        attempt: int,
        restart_count: int = 0,
        use_agent_store: bool = False,
        log_root: str | None = None,
        environ: Mapping[str, str] | None = None,
        python: str | None = None,
        console_stdout: IO | None = None,
        console_stderr: IO | None = None,
        line_prefix_template: str | None = None,
        node_id: str | None = None,
    ) -> None:
        if config.nproc_per_node < 1:
            raise ValueError(f"The number of workers ({config.nproc_per_node}) must be positive.")
        if attempt < 0:
            raise ValueError(f"The attempt number ({attempt}) must not be negative.")
        self.config = config
        self.rdzv = rdzv
        self.attempt = attempt
        self.restart_count = restart_count
        self._use_agent_store = use_agent_store
        self._environ = dict(os.environ if environ is None else environ)
        self._python = python or python_executable(self._environ)
        self._console_out = console_stdout if console_stdout is not None else sys.stdout
        self._console_err = console_stderr if console_stderr is not None else sys.stderr
        self._prefix_template = line_prefix_template
        self.log_dir = attempt_log_dir(
            log_root or resolve_log_root(config.log_dir), rdzv.run_id, attempt, node_id
        )
        self._workers = [self._plan(local_rank) for local_rank in range(config.nproc_per_node)]
        self._cond = threading.Condition()
        self._exits = 0
        self._stop_lock = threading.RLock()
        self._stop_began: float | None = None
        self._stopped = False
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Create the log directories and start every worker.

        Raises:
            RuntimeError: already started.
            WorkerStartError: a worker could not be started; those already started are stopped.
        """
        if self._started or self._stopped:
            raise RuntimeError(
                f"Worker group of run {self.rdzv.run_id} was already started or stopped."
            )
        self._started = True
        shutil.rmtree(self.log_dir, ignore_errors=True)  # a re-used attempt number starts clean
        for worker in self._workers:
            os.makedirs(os.path.dirname(worker.logs.error_file), mode=0o700, exist_ok=True)  # owner-only
        for stream in (self._console_out, self._console_err):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for worker in self._workers:
            try:
                self._spawn(worker)
            except OSError as exc:
                self.stop(timeout=0)
                raise WorkerStartError(
                    f"Run {self.rdzv.run_id}: cannot start local rank {worker.local_rank} "
                    f"({' '.join(self._argv(worker))}): {exc}"
                ) from exc
        log.info(
            "Run %s attempt %d: started %d %s worker(s) %s; logs in %s",
            self.rdzv.run_id, self.attempt, len(self._workers), self.config.role,
            self.pids(), self.log_dir,
        )

    def __enter__(self) -> WorkerGroup:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- observation -------------------------------------------------------------------------

    def pids(self) -> dict[int, int]:
        """Local rank → pid of the workers started."""
        return {w.local_rank: w.pid for w in self._workers if w.proc is not None}

    def global_ranks(self) -> list[int]:
        """The global ranks of this node's workers, by local rank."""
        return [w.global_rank for w in self._workers]

    @property
    def world_size(self) -> int:
        """``WORLD_SIZE`` of this attempt."""
        return worker_ranks(self.config, self.rdzv, 0).world_size

    def logs(self) -> dict[int, WorkerLogs]:
        """Local rank → where its output goes."""
        return {w.local_rank: w.logs for w in self._workers}

    def poll(self) -> GroupState:
        """The group's state now, without blocking.

        Raises:
            RuntimeError: not started.
        """
        if not self._started:
            raise RuntimeError(f"Worker group of run {self.rdzv.run_id} was not started.")
        with self._cond:
            exited = [(w, w.exitcode) for w in self._workers if w.exitcode is not None]
            running = frozenset(w.local_rank for w in self._workers if w.exitcode is None)
        failures = tuple(
            self._failure_of(w)
            for w, code in sorted(exited, key=lambda item: item[0].exit_monotonic)
            if code != 0
        )
        if any(not f.during_stop for f in failures):
            status = GroupStatus.FAILED
        elif not running and not failures:
            status = GroupStatus.SUCCEEDED
        elif self._stop_began is not None:
            status = GroupStatus.STOPPED
        else:
            status = GroupStatus.RUNNING
        return GroupState(status=status, failures=failures, running=running)

    def wait(self, timeout: float | None = None) -> GroupState:
        """Block until a worker exits (or the group is no longer running) or ``timeout`` passes."""
        with self._cond:
            seen = self._exits  # before poll(): an exit in between must not be missed
        state = self.poll()
        if state.status is not GroupStatus.RUNNING:
            return state
        with self._cond:
            self._cond.wait_for(lambda: self._exits != seen, timeout)
        return self.poll()

    def stderr_tails(self, max_lines: int = 30) -> dict[int, str]:
        """Local rank → the last lines of its ``stderr.log`` (ranks whose stderr is in a file)."""
        tails = {}
        for w in self._workers:
            tail = read_log_tail(w.logs.stderr, max_lines=max_lines)
            if tail:
                tails[w.local_rank] = tail
        return tails

    def failure_report(self, host: str) -> str:
        """:func:`~elastic.agent.failures.root_cause_summary` of this group's failures."""
        state = self.poll()
        return root_cause_summary(
            state.failures, host, self.config.role, stderr_tails=self.stderr_tails()
        )

    # -- signalling --------------------------------------------------------------------------

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to every live worker and all of its descendants."""
        targets, groups = self._tree()
        self._signal(targets, groups, sig)

    def stop(self, timeout: float | None = None) -> GroupState:
        """Stop every worker's whole process tree; idempotent, safe from any thread.

        SIGTERM to all, up to ``timeout`` (default ``config.shutdown_timeout``) for them to exit,
        then SIGKILL to what is left; waits (bounded) for the exits and the log pumps.
        """
        with self._stop_lock:  # re-entrant: a signal handler may stop while stop() runs
            if self._stop_began is None:
                self._stop_began = time.monotonic()
            if not self._started:
                self._stopped = True
                return GroupState(GroupStatus.STOPPED)
            if self._stopped:
                return self.poll()
            grace = self.config.shutdown_timeout if timeout is None else max(0.0, timeout)
            self._terminate(grace)
            self._join_threads()
            self._stopped = True  # only now: an interrupted stop() must be redone, not skipped
        state = self.poll()
        log.info(
            "Run %s attempt %d: workers stopped (%s).",
            self.rdzv.run_id, self.attempt, state.status.value,
        )
        return state

    # -- internals ---------------------------------------------------------------------------

    def _plan(self, local_rank: int) -> _Worker:
        rank_dir = os.path.join(self.log_dir, str(local_rank))
        redirect = self.config.redirects.for_rank(local_rank)
        tee = self.config.tee.for_rank(local_rank)
        shown = self._shown(local_rank)
        paths, routes = {}, {}
        for flag, name in ((Std.OUT, "stdout"), (Std.ERR, "stderr")):
            route = routes[name] = _route(bool(redirect & flag), bool(tee & flag), shown)
            paths[name] = (
                os.path.join(rank_dir, f"{name}.log")
                if route in (_Route.FILE, _Route.TEE)
                else None
            )
        logs = WorkerLogs(
            stdout=paths["stdout"],
            stderr=paths["stderr"],
            error_file=os.path.join(rank_dir, "error.json"),
        )
        global_rank = worker_ranks(self.config, self.rdzv, local_rank).rank
        return _Worker(local_rank=local_rank, global_rank=global_rank, logs=logs, routes=routes)

    def _shown(self, local_rank: int) -> bool:
        ranks = self.config.local_ranks_filter
        return not ranks or local_rank in ranks

    def _argv(self, worker: _Worker) -> list[str]:
        return worker_argv(
            self.config.entrypoint, python=self._python, local_rank=worker.local_rank
        )

    def _spawn(self, worker: _Worker) -> None:
        env = worker_env(
            self._environ, self.config, self.rdzv, worker.local_rank,
            restart_count=self.restart_count, error_file=worker.logs.error_file,
            use_agent_store=self._use_agent_store,
        )
        opened: list[IO] = []
        try:
            std, pumps = self._stdio(worker, opened)
            worker.proc = proc = subprocess.Popen(
                self._argv(worker),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=std["stdout"],
                stderr=std["stderr"],
                start_new_session=True,
                close_fds=True,
                # Linux: SIGKILL when this thread's process dies (see elastic.agent.lifeline).
                preexec_fn=parent_death_preexec(),
            )
        finally:
            for fp in opened:  # the child holds its own copies
                fp.close()
        try:
            worker.ps = psutil.Process(proc.pid)
        except psutil.Error:
            worker.ps = None  # already gone; the watcher reports its exit
        worker.watcher = threading.Thread(
            target=self._watch, args=(worker, proc), name=f"watch-{worker.local_rank}", daemon=True
        )
        worker.watcher.start()
        prefix = console_prefix(
            self._prefix_template, self.config.role, worker.global_rank, worker.local_rank
        )
        for name, path, console in pumps:
            pipe = getattr(proc, name)
            fd = os.dup(pipe.fileno())
            pipe.close()
            pump = _Pump(
                f"pump-{name}-{worker.local_rank}", fd, path, console, prefix if path else ""
            )
            pump.start()
            worker.pumps.append(pump)

    def _stdio(
        self, worker: _Worker, opened: list[IO]
    ) -> tuple[dict[str, object], list[tuple[str, str | None, IO]]]:
        """Popen's ``stdout``/``stderr`` for ``worker``; the pumps to run (stream, file, console).

        Files opened for the child are appended to ``opened`` for the caller to close.
        """
        std: dict[str, object] = {}
        pumps: list[tuple[str, str | None, IO]] = []
        for name, console in (("stdout", self._console_out), ("stderr", self._console_err)):
            route = worker.routes[name]
            path = getattr(worker.logs, name)
            if route is _Route.FILE:
                fp = open_private_file(path, "wb")  # closed by the caller after Popen
                opened.append(fp)
                std[name] = fp
            elif route is _Route.DISCARD or console is None:
                std[name] = subprocess.DEVNULL
            elif route is _Route.CONSOLE and _fileno(console) is not None:
                std[name] = _fileno(console)
            else:  # TEE, or a console without a file descriptor (e.g. a StringIO): pump it
                std[name] = subprocess.PIPE
                pumps.append((name, path if route is _Route.TEE else None, console))
        return std, pumps

    def _watch(self, worker: _Worker, proc: subprocess.Popen) -> None:
        code = proc.wait()
        with self._cond:  # stamped under the lock: exit order == the order polls see exits
            worker.exitcode = code
            worker.exit_monotonic, worker.exit_time = time.monotonic(), time.time()
            self._exits += 1
            self._cond.notify_all()
        if code != 0 and self._stop_began is None:
            log.warning(
                "Run %s attempt %d: local rank %d (rank %d, pid %d) exited with %d.",
                self.rdzv.run_id, self.attempt, worker.local_rank, worker.global_rank,
                worker.pid, code,
            )

    def _failure_of(self, worker: _Worker) -> WorkerFailure:
        if worker.failure is None:
            worker.failure = WorkerFailure(
                local_rank=worker.local_rank,
                global_rank=worker.global_rank,
                pid=worker.pid,
                exitcode=worker.exitcode if worker.exitcode is not None else 0,
                exit_monotonic=worker.exit_monotonic,
                exit_time=worker.exit_time,
                error_file=worker.logs.error_file,
                error=read_error_file(worker.logs.error_file),
                stderr_log=worker.logs.stderr,
                during_stop=(
                    self._stop_began is not None and worker.exit_monotonic >= self._stop_began
                ),
            )
        return worker.failure

    def _live_leaders(self) -> list[_Worker]:
        with self._cond:
            return [w for w in self._workers if w.proc is not None and w.exitcode is None]

    def _tree(self) -> tuple[dict[int, psutil.Process], list[int]]:
        """Every process to signal, and the process groups of unreaped workers (for killpg).

        Found three ways, so a grandchild is missed only if it both left the worker's session
        and lost its parent chain: the live workers' descendants; every process in a worker's
        session or process group (a leader's id stays reserved while any member lives).
        """
        me = os.getpid()
        procs: dict[int, psutil.Process] = {}
        groups = []
        for w in self._live_leaders():
            groups.append(w.pid)
            if w.ps is None:
                continue
            procs[w.pid] = w.ps
            try:
                for child in w.ps.children(recursive=True):
                    procs[child.pid] = child
            except psutil.Error:
                pass
        sessions = {w.pid for w in self._workers if w.proc is not None}
        for proc in psutil.process_iter():
            pid = proc.pid
            if pid == me or pid in procs:
                continue
            try:
                if os.getsid(pid) in sessions or os.getpgid(pid) in sessions:
                    procs[pid] = proc
            except OSError:
                continue
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

    def _terminate(self, grace: float) -> None:
        procs, groups = self._tree()
        if not procs and not groups:
            return
        log.info(
            "Run %s attempt %d: sending SIGTERM to %d process(es); SIGKILL after %.1fs.",
            self.rdzv.run_id, self.attempt, len(procs), grace,
        )
        self._signal(procs, groups, signal.SIGTERM)
        if self._wait_gone(procs, time.monotonic() + grace):
            return
        procs, groups = self._tree()
        survivors = {pid: p for pid, p in procs.items() if _alive(p)}
        if survivors or groups:
            log.warning(
                "Run %s attempt %d: %d process(es) survived SIGTERM for %.1fs; sending SIGKILL: %s",
                self.rdzv.run_id, self.attempt, len(survivors), grace, sorted(survivors),
            )
            self._signal(survivors, groups, signal.SIGKILL)
        if not self._wait_gone(survivors, time.monotonic() + KILL_GRACE_S, rescan=False):
            left = sorted(pid for pid, p in survivors.items() if _alive(p))
            log.error(
                "Run %s attempt %d: processes %s did not die %.0fs after SIGKILL "
                "(uninterruptible sleep?); abandoning them.",
                self.rdzv.run_id, self.attempt, left, KILL_GRACE_S,
            )

    def _wait_gone(
        self, procs: dict[int, psutil.Process], deadline: float, rescan: bool = True
    ) -> bool:
        """Wait until no tracked process nor worker lives; track newcomers. False at deadline."""
        next_scan = time.monotonic() + _RESCAN_S
        while True:
            now = time.monotonic()
            if rescan and now >= next_scan:
                self._track_newcomers(procs)
                next_scan = now + _RESCAN_S
            if not self._live_leaders() and not any(_alive(p) for p in procs.values()):
                if not rescan:
                    return True
                if not self._track_newcomers(procs):  # one last look for late descendants
                    return True
            if now >= deadline:
                return False
            with self._cond:
                self._cond.wait(min(_POLL_S, max(0.0, deadline - now)))

    def _track_newcomers(self, procs: dict[int, psutil.Process]) -> bool:
        """Add (and SIGTERM) processes of the tree spawned since ``procs`` was taken."""
        found, _ = self._tree()
        new = {pid: p for pid, p in found.items() if pid not in procs and _alive(p)}
        self._signal(new, [], signal.SIGTERM)
        procs.update(new)
        return bool(new)

    def _join_threads(self) -> None:
        for w in self._workers:
            if w.watcher is not None:
                w.watcher.join(timeout=1.0)
        for w in self._workers:
            for pump in w.pumps:
                pump.request_stop()
        for w in self._workers:
            for pump in w.pumps:
                pump.join(timeout=PUMP_DRAIN_S + 2.0)
                if pump.is_alive():
                    log.warning("Run %s: log pump %s did not finish.", self.rdzv.run_id, pump.name)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
