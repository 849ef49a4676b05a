"""One attempt's worker processes on this node: start them, watch them, stop them with no orphans.

A :class:`WorkerGroup` runs ``nproc_per_node`` workers for one rendezvous round and attempt.
Each worker is its own session (``start_new_session``), so the worker and everything it spawns
can be found and signalled; stdin is ``/dev/null``. On Linux each worker also gets the
parent-death signal (:mod:`elastic.agent.lifeline.keeper`): start groups from the agent's main thread.
Where the output goes is :mod:`elastic.agent.processes.output`'s job; finding and stopping the process
trees is :mod:`elastic.agent.processes.proctree`'s.

Exits are seen by one thread per worker blocked in ``wait()``, so :meth:`WorkerGroup.wait` sleeps
on a condition instead of polling. :meth:`WorkerGroup.stop` signals each worker's whole tree —
its descendants, its process group and its session — SIGTERM, waits up to the shutdown
timeout, then SIGKILLs what is left. Call ``stop()`` after every attempt, even a successful one:
it also reaps grandchildren a finished worker left behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Callable, Mapping

from elastic.agent.errors import WorkerStartError
from elastic.agent.processes.failures import WorkerFailure, read_log_tail, root_cause_summary
from elastic.agent.processes.group_state import GroupState, GroupStatus, WorkerExtras
from elastic.agent.processes.log_loss import DISK_FULL, REPORTER
from elastic.agent.processes.output import (
    PUMP_DRAIN_S,
    WorkerLogs,
    attempt_log_dir,
    console_prefix,
    resolve_log_root,
)
from elastic.agent.processes.logs_specs import LogsSpecsError, LogsSpecsHost
from elastic.agent.processes.proctree import ProcessLister, WorkerTrees
from elastic.agent.prewarm.pool import ForkedWorker, TemplatePool
from elastic.agent.worker_env import python_executable, worker_argv, worker_env, worker_ranks
from elastic.agent.processes.worker_proc import Worker, failure_of, place_logs, plan_output, start_process
from elastic.config import LaunchConfig

if TYPE_CHECKING:
    from elastic.rendezvous.api import RendezvousInfo

log = logging.getLogger(__name__)

__all__ = [
    "WorkerGroup",
    "WorkerLogs",
    "WorkerStartError",
    "attempt_log_dir",
    "console_prefix",
    "resolve_log_root",
]


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
        line_prefix_template: torchrun's ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` (default: the
            config's, which the CLI reads from the environment).
        node_id: this node's id in the rendezvous, naming its log directory (agents may share
            ``--log-dir``).
        process_lister: the process table stop() reads (default: ``/proc``; tests inject one).
        templates: pre-warmed templates to fork workers from (``--prewarm``); a worker whose
            template cannot serve starts the normal way.
        logs_specs: the ``--logs-specs`` plugin's helper that places the logs (required when
            ``config.logs_specs`` names a plugin; None: our layout).
        local_ranks: the local ranks this group runs (default: all ``nproc_per_node``; live
            recovery restarts only those that died).
        extras: per local rank, what its worker gets beyond the usual.

    Raises:
        ValueError: bad counts, ids that would put the logs outside the log root, or a plugin
            named without its helper.
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
        process_lister: ProcessLister | None = None,
        templates: TemplatePool | None = None,
        logs_specs: LogsSpecsHost | None = None,
        local_ranks: tuple[int, ...] | None = None,
        extras: Callable[[int], WorkerExtras] | None = None,
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
        self._prefix_template = (config.log_line_prefix_template if line_prefix_template is None
                                 else line_prefix_template)
        self._templates = templates if templates is not None and templates.serves(config.entrypoint) else None
        if logs_specs is None and config.logs_specs:
            raise ValueError(f"--logs-specs {config.logs_specs}: the worker group was given no helper for the plugin.")
        self._logs_specs = logs_specs
        # Our layout's attempt directory; with a plugin, its root_log_dir once started.
        self.log_dir = "" if logs_specs is not None else attempt_log_dir(
            log_root or resolve_log_root(config.log_dir), rdzv.run_id, attempt, node_id
        )
        ranks = range(config.nproc_per_node) if local_ranks is None else local_ranks
        if any(not 0 <= rank < config.nproc_per_node for rank in ranks):
            raise ValueError(f"The local ranks {tuple(ranks)} must be in [0, {config.nproc_per_node}).")
        self._extras = extras
        self._workers = [self._plan(local_rank) for local_rank in ranks]
        self._cond = threading.Condition()
        self._exits = 0
        self._exit_callbacks: list[Callable[[], None]] = []
        self._stop_lock = threading.RLock()
        self._stop_began: float | None = None
        self._stopped = False
        self._started = False
        self._trees = WorkerTrees(
            lambda: [w.pid for w in self._live_leaders()],
            lambda: {w.pid for w in self._workers if w.proc is not None},
            wait=self._wait_exit,
            label=f"Run {rdzv.run_id} attempt {attempt}",
            lister=process_lister,
        )

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
        if self._logs_specs is not None:
            self._place_logs(self._logs_specs)
        else:
            shutil.rmtree(self.log_dir, ignore_errors=True)  # a re-used attempt number starts clean
            for worker in self._workers:
                rank_dir = os.path.dirname(worker.logs.error_file)
                try:
                    os.makedirs(rank_dir, mode=0o700, exist_ok=True)  # owner-only
                except OSError as error:  # a full disk costs log lines, not the attempt: the pumps retry
                    if error.errno not in DISK_FULL:
                        raise
                    REPORTER.lost(rank_dir, 0, error)
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
            "Run %s attempt %d: started %d %s worker(s) %s%s; logs in %s",
            self.rdzv.run_id, self.attempt, len(self._workers), self.config.role,
            self.pids(), self._forked_note(), self.log_dir,
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

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after each worker exit is recorded (from a watcher thread; it must be
        quick and never raise). Exits before the call are seen by :meth:`poll`."""
        self._exit_callbacks.append(callback)

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
        """:func:`~elastic.agent.processes.failures.root_cause_summary` of this group's failures."""
        state = self.poll()
        return root_cause_summary(
            state.failures, host, self.config.role, stderr_tails=self.stderr_tails()
        )

    # -- signalling --------------------------------------------------------------------------

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to every live worker and all of its descendants."""
        self._trees.send_signal(sig)

    def stop(self, timeout: float | None = None) -> GroupState:
        """Stop every worker's whole process tree; idempotent, safe from any thread.

        SIGTERM to all, up to ``timeout`` (default ``config.shutdown_timeout``) for them to exit,
        then SIGKILL to what is left; waits (bounded) for the exits and the log pumps.
        """
        with self._stop_lock:  # re-entrant, and an interrupted stop() is redone by the next call
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

    def _plan(self, local_rank: int) -> Worker:
        global_rank = worker_ranks(self.config, self.rdzv, local_rank).rank
        if self._logs_specs is not None:
            return Worker(local_rank=local_rank, global_rank=global_rank, output=None)  # placed at start
        output = plan_output(self.config, self.log_dir, local_rank, self._consoles())
        return Worker(local_rank=local_rank, global_rank=global_rank, output=output)

    def _consoles(self) -> dict[str, IO | None]:
        return {"stdout": self._console_out, "stderr": self._console_err}

    def _place_logs(self, host: LogsSpecsHost) -> None:
        """Ask the ``--logs-specs`` plugin where this attempt's output goes, as torchrun asks it
        before starting its workers: ``reify`` gets the variables the launcher sets per rank.

        Raises:
            WorkerStartError: the plugin failed (no worker has started).
        """
        try:
            self.log_dir = place_logs(host, self._workers, lambda worker: self._env(worker, error_file=""),
                                      self._environ, self._consoles())
        except LogsSpecsError as error:
            self.stop(timeout=0)
            raise WorkerStartError(f"Run {self.rdzv.run_id}: {error}") from error

    def _env(self, worker: Worker, error_file: str) -> dict[str, str]:
        env = worker_env(
            self._environ, self.config, self.rdzv, worker.local_rank,
            restart_count=self.restart_count, error_file=error_file,
            use_agent_store=self._use_agent_store,
        )
        env.update(worker.env_overrides)
        return env

    def _argv(self, worker: Worker) -> list[str]:
        return worker_argv(
            self.config.entrypoint, python=self._python, local_rank=worker.local_rank
        )

    def _spawn(self, worker: Worker) -> None:
        output = worker.output
        if output is None:
            raise RuntimeError(f"Run {self.rdzv.run_id}: local rank {worker.local_rank} has no output placed.")
        env = self._env(worker, error_file=worker.logs.error_file)
        extras = self._extras(worker.local_rank) if self._extras is not None else WorkerExtras()
        env.update({**extras.env, **{name: str(fd) for name, fd in extras.fds.items()}})
        with output.stdio() as std:
            proc = start_process(self.config, worker, self._argv(worker), env, std, extras, self._templates)
            worker.proc = proc
        worker.watcher = threading.Thread(
            target=self._watch, args=(worker, proc), name=f"watch-{worker.local_rank}", daemon=True
        )
        worker.watcher.start()
        prefix = console_prefix(
            self._prefix_template, self.config.role, worker.global_rank, worker.local_rank
        )
        output.start_pumps(proc, prefix, worker.local_rank,
                           f"Run {self.rdzv.run_id} attempt {self.attempt} local rank {worker.local_rank}")

    def _forked_note(self) -> str:
        forked = sum(isinstance(w.proc, ForkedWorker) for w in self._workers)
        return f" ({forked} forked from pre-warmed templates)" if self._templates is not None else ""

    def _watch(self, worker: Worker, proc: subprocess.Popen | ForkedWorker) -> None:
        code = proc.wait()
        with self._cond:  # stamped under the lock: exit order == the order polls see exits
            worker.exitcode = code
            worker.exit_monotonic, worker.exit_time = time.monotonic(), time.time()
            self._exits += 1
            self._cond.notify_all()
        for callback in list(self._exit_callbacks):
            callback()
        if code != 0 and self._stop_began is None:
            # After a traceback that only said a peer left, the agent's line about the peer says it.
            kept_in = worker.output.peer_left_at_end(PUMP_DRAIN_S) if worker.output is not None else None
            log.log(
                logging.INFO if kept_in else logging.WARNING,
                "Run %s attempt %d: local rank %d (rank %d, pid %d) exited with %d%s.",
                self.rdzv.run_id, self.attempt, worker.local_rank, worker.global_rank,
                worker.pid, code, f" after a traceback that says a peer left (in {kept_in})" if kept_in else "",
            )

    def _failure_of(self, worker: Worker) -> WorkerFailure:
        return failure_of(worker, self._stop_began)

    def _live_leaders(self) -> list[Worker]:
        with self._cond:
            return [w for w in self._workers if w.proc is not None and w.exitcode is None]

    def _wait_exit(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait(timeout)

    def _terminate(self, grace: float) -> None:
        self._trees.terminate(grace)

    def _join_threads(self) -> None:
        for w in self._workers:
            if w.watcher is not None:
                w.watcher.join(timeout=1.0)
        pumps = [pump for w in self._workers if w.output is not None for pump in w.output.pumps]
        for pump in pumps:
            pump.request_stop()
        for pump in pumps:
            pump.join(timeout=PUMP_DRAIN_S + 2.0)
            if pump.is_alive():
                log.warning("Run %s: log pump %s did not finish.", self.rdzv.run_id, pump.name)

