"""One attempt's worker processes on this node: start them, watch them, stop them with no orphans.

A :class:`WorkerGroup` runs ``nproc_per_node`` workers for one rendezvous round and attempt.
Each worker is its own session (``start_new_session``), so the worker and everything it spawns
can be found and signalled; stdin is ``/dev/null``. On Linux each worker also gets the
parent-death signal (:mod:`elastic.agent.pdeathsig`): start groups from the agent's main thread.
Where the output goes is :mod:`elastic.agent.processes.output`'s job; finding and stopping the process
trees is :mod:`elastic.agent.processes.proctree`'s; seeing the exits (a thread per worker blocked in
``wait()``, so :meth:`WorkerGroup.wait` sleeps instead of polling) is :mod:`.exits`'. :meth:`WorkerGroup.stop` signals each worker's whole tree —
its descendants, its process group and its session — SIGTERM, waits up to the shutdown
timeout, then SIGKILLs what is left. Call ``stop()`` after every attempt, even a successful one:
it also reaps grandchildren a finished worker left behind.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import IO, TYPE_CHECKING, Callable

from elastic.agent.errors import WorkerStartError
from elastic.agent.prewarm.pool import ForkedWorker
from elastic.agent.processes.exits import Exits
from elastic.agent.processes.failures import read_log_tail, root_cause_summary
from elastic.agent.processes.group_settings import GroupSettings
from elastic.agent.processes.group_state import GroupState, GroupStatus, WorkerExtras, WorkersView, group_status
from elastic.agent.processes.logs_specs import LogsSpecsError, LogsSpecsHost
from elastic.agent.processes.output import WorkerLogs, attempt_log_dir, console_prefix, resolve_log_root
from elastic.agent.processes.proctree import WorkerTrees
from elastic.agent.processes.worker_proc import (
    Worker,
    failure_of,
    make_log_dirs,
    place_logs,
    plan_output,
    start_process,
    stop_pumps,
)
from elastic.agent.worker_env import worker_argv, worker_env, worker_ranks
from elastic.config import LaunchConfig

if TYPE_CHECKING:
    from elastic.rendezvous.api import RendezvousInfo

log = logging.getLogger(__name__)

__all__ = [
    "GroupSettings",
    "WorkerGroup",
    "WorkerLogs",
    "WorkerStartError",
    "attempt_log_dir",
    "console_prefix",
    "resolve_log_root",
]


class WorkerGroup:
    """The ``nproc_per_node`` workers of one attempt on this node.

    Its workers end with their round: it answers live recovery's questions with no (:meth:`refill`, :meth:`move_to`).

    Args:
        config: the launch configuration (entrypoint, nproc, role, streams, shutdown timeout).
        rdzv: the round these workers belong to.
        attempt: the attempt number, naming the log directory ``attempt_<attempt>``.
        restart_count: ``TORCHELASTIC_RESTART_COUNT`` (restarts after failures so far).
        use_agent_store: ``TORCHELASTIC_USE_AGENT_STORE``.
        settings: how this node starts its groups (log root, environment, console, templates...).
        local_ranks: the local ranks this group runs (default: all ``nproc_per_node``; live
            recovery restarts only those that died).
        extras: per local rank, what its worker gets beyond the usual.

    Raises:
        ValueError: bad counts, ids that would put the logs outside the log root, or a plugin
            named without its helper.
    """

    def __init__(self, config: LaunchConfig, rdzv: RendezvousInfo, *, attempt: int, restart_count: int = 0,
                 use_agent_store: bool = False, settings: GroupSettings = GroupSettings(),
                 local_ranks: tuple[int, ...] | None = None,
                 extras: Callable[[int], WorkerExtras] | None = None) -> None:
        if config.nproc_per_node < 1:
            raise ValueError(f"The number of workers ({config.nproc_per_node}) must be positive.")
        if attempt < 0:
            raise ValueError(f"The attempt number ({attempt}) must not be negative.")
        if settings.logs_specs is None and config.logs_specs:
            raise ValueError(f"--logs-specs {config.logs_specs}: the worker group was given no helper for the plugin.")
        self.config = config
        self.rdzv = rdzv
        self.attempt = attempt
        self.restart_count = restart_count
        self._use_agent_store = use_agent_store
        self._environ = settings.worker_environ()
        self._python = settings.interpreter(self._environ)
        self._consoles: dict[str, IO | None] = dict(settings.consoles())
        self._prefix_template = settings.prefix_template(config)
        self._templates = settings.templates_for(config)
        self._logs_specs = settings.logs_specs
        # Our layout's attempt directory; with a plugin, its root_log_dir once started.
        self.log_dir = "" if self._logs_specs is not None else attempt_log_dir(
            settings.log_root or resolve_log_root(config.log_dir), rdzv.run_id, attempt, settings.node_id)
        ranks = range(config.nproc_per_node) if local_ranks is None else local_ranks
        if any(not 0 <= rank < config.nproc_per_node for rank in ranks):
            raise ValueError(f"The local ranks {tuple(ranks)} must be in [0, {config.nproc_per_node}).")
        self._extras = extras
        self._workers = [self._plan(local_rank) for local_rank in ranks]
        self._stop_lock = threading.RLock()
        self._stop_began: float | None = None
        self._stopped = False
        self._started = False
        label = f"Run {rdzv.run_id} attempt {attempt}"
        self._exits = Exits(label, lambda: self._stop_began is not None)
        self._trees = WorkerTrees(lambda: [w.pid for w in self._exits.unreaped(self._workers)],
                                  lambda: {w.pid for w in self._workers if w.proc is not None},
                                  wait=lambda timeout: self._exits.wait(None, timeout), label=label,
                                  lister=settings.process_lister)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Create the log directories and start every worker.

        Raises:
            RuntimeError: already started.
            WorkerStartError: a worker could not be started; those already started are stopped.
        """
        if self._started or self._stopped:
            raise RuntimeError(f"Worker group of run {self.rdzv.run_id} was already started or stopped.")
        self._started = True
        if self._logs_specs is not None:
            self._place_logs(self._logs_specs)
        else:
            make_log_dirs(self.log_dir, self._workers)
        for stream in self._consoles.values():
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for worker in self._workers:
            try:
                self._spawn(worker)
            except OSError as exc:
                self.stop(timeout=0)
                raise WorkerStartError(f"Run {self.rdzv.run_id}: cannot start local rank {worker.local_rank} "
                                       f"({' '.join(self._argv(worker))}): {exc}") from exc
        forked = sum(isinstance(w.proc, ForkedWorker) for w in self._workers)
        log.info("Run %s attempt %d: started %d %s worker(s) %s%s; logs in %s", self.rdzv.run_id, self.attempt,
                 len(self._workers), self.config.role, self.pids(),
                 f" ({forked} forked from pre-warmed templates)" if self._templates is not None else "", self.log_dir)

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
        exited, running = self._exits.look(self._workers)
        failures = tuple(failure_of(w, self._stop_began) for w in exited if w.exitcode != 0)
        return GroupState(group_status(failures, running, self._stop_began is not None), failures, running)

    def look(self) -> WorkersView:
        """One look for the agent: the state, and no live recovery (see the class docstring)."""
        return WorkersView(self.poll())

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after each worker exit is recorded (from a watcher thread; it must be
        quick and never raise). Exits before the call are seen by :meth:`poll`."""
        self._exits.on_exit(callback)

    def wait(self, timeout: float | None = None) -> GroupState:
        """Block until a worker exits (or the group is no longer running) or ``timeout`` passes."""
        seen = self._exits.count  # before poll(): an exit in between must not be missed
        state = self.poll()
        if state.status is not GroupStatus.RUNNING:
            return state
        self._exits.wait(seen, timeout)
        return self.poll()

    def stderr_tails(self, max_lines: int = 30) -> dict[int, str]:
        """Local rank → the last lines of its ``stderr.log`` (ranks whose stderr is in a file)."""
        tails = ((w.local_rank, read_log_tail(w.logs.stderr, max_lines=max_lines)) for w in self._workers)
        return {rank: tail for rank, tail in tails if tail}

    def failure_report(self, host: str) -> str:
        """:func:`~elastic.agent.processes.failures.root_cause_summary` of this group's failures."""
        return root_cause_summary(self.poll().failures, host, self.config.role, stderr_tails=self.stderr_tails())

    # -- what live recovery asks: no -----------------------------------------------------------

    def held(self, until: float | None) -> None:
        """Nothing to tell: these workers do not read rounds."""

    def refill(self, *, attempt: int, restart_count: int, use_agent_store: bool) -> tuple[int, ...]:
        """None replaced (``()``): a failure ends this group."""
        return ()

    def move_to(self, info: RendezvousInfo, *, attempt: int, restart_count: int,
                use_agent_store: bool) -> tuple[int, ...]:
        """Raises WorkerStartError: a group of one attempt stays in its round."""
        raise WorkerStartError(f"Run {self.rdzv.run_id}: the workers of attempt {self.attempt} cannot move to round "
                               f"{info.round}: they end with round {self.rdzv.round}.")

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
            self._terminate(self.config.shutdown_timeout if timeout is None else max(0.0, timeout))
            self._exits.join(self._workers)
            stop_pumps(self._workers, f"Run {self.rdzv.run_id}")
            self._stopped = True  # only now: an interrupted stop() must be redone, not skipped
        state = self.poll()
        log.info("Run %s attempt %d: workers stopped (%s).", self.rdzv.run_id, self.attempt, state.status.value)
        return state

    # -- internals ---------------------------------------------------------------------------

    def _plan(self, local_rank: int) -> Worker:
        global_rank = worker_ranks(self.config, self.rdzv, local_rank).rank
        if self._logs_specs is not None:
            return Worker(local_rank=local_rank, global_rank=global_rank, output=None)  # placed at start
        output = plan_output(self.config, self.log_dir, local_rank, self._consoles)
        return Worker(local_rank=local_rank, global_rank=global_rank, output=output)

    def _place_logs(self, host: LogsSpecsHost) -> None:
        """Ask the ``--logs-specs`` plugin where this attempt's output goes (:func:`place_logs`).

        Raises:
            WorkerStartError: the plugin failed (no worker has started).
        """
        try:
            self.log_dir = place_logs(host, self._workers, lambda worker: self._env(worker, error_file=""),
                                      self._environ, self._consoles)
        except LogsSpecsError as error:
            self.stop(timeout=0)
            raise WorkerStartError(f"Run {self.rdzv.run_id}: {error}") from error

    def _terminate(self, grace: float) -> None:
        self._trees.terminate(grace)

    def _env(self, worker: Worker, error_file: str) -> dict[str, str]:
        env = worker_env(self._environ, self.config, self.rdzv, worker.local_rank, restart_count=self.restart_count,
                         error_file=error_file, use_agent_store=self._use_agent_store)
        env.update(worker.env_overrides)
        return env

    def _argv(self, worker: Worker) -> list[str]:
        return worker_argv(self.config.entrypoint, python=self._python, local_rank=worker.local_rank)

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
        self._exits.watch(worker, proc)
        prefix = console_prefix(self._prefix_template, self.config.role, worker.global_rank, worker.local_rank)
        output.start_pumps(proc, prefix, worker.local_rank,
                           f"Run {self.rdzv.run_id} attempt {self.attempt} local rank {worker.local_rank}")
