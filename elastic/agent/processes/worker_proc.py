"""One worker process of a group: its record, where its output goes, how it starts, what it left.

:class:`~elastic.agent.processes.workers.WorkerGroup` keeps one :class:`Worker` per local rank.
:func:`plan_output` lays out our own log files for it (:func:`make_log_dirs` makes their
directories), :func:`place_logs` asks a ``--logs-specs`` plugin instead; :func:`start_process`
starts it, forked from its pre-warmed template when there is one that serves, else as a new
session with the parent-death signal (:mod:`elastic.agent.pdeathsig`); :func:`failure_of` is the
:class:`~elastic.agent.processes.failures.WorkerFailure` an exited worker left, and
:func:`stop_pumps` ends its output's pumps once it is stopped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from typing import IO, Callable, Mapping

from elastic.agent.pdeathsig import parent_death_preexec
from elastic.agent.prewarm.pool import ForkedWorker, TemplatePool
from elastic.agent.processes.failures import WorkerFailure, read_error_file
from elastic.agent.processes.group_state import WorkerExtras
from elastic.agent.processes.log_loss import DISK_FULL, REPORTER
from elastic.agent.processes.logs_specs import LogsSpecsHost
from elastic.agent.processes.output import PUMP_DRAIN_S, WorkerLogs, WorkerOutput
from elastic.config import LaunchConfig, Std

log = logging.getLogger(__name__)

__all__ = ["Worker", "failure_of", "make_log_dirs", "place_logs", "plan_output", "start_process", "stop_pumps"]


@dataclass
class Worker:
    """One local rank of a worker group: its process once started, and its exit once seen."""

    local_rank: int
    global_rank: int
    output: WorkerOutput | None  # None until a --logs-specs plugin placed it (at start)
    env_overrides: Mapping[str, str] = field(default_factory=dict)  # what the plugin set in its environment
    proc: subprocess.Popen | ForkedWorker | None = None
    watcher: threading.Thread | None = None
    exitcode: int | None = None
    exit_monotonic: float = 0.0
    exit_time: float = 0.0
    failure: WorkerFailure | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    @property
    def logs(self) -> WorkerLogs:
        return self.output.logs if self.output is not None else WorkerLogs(None, None, "")


def plan_output(config: LaunchConfig, log_dir: str, local_rank: int,
                consoles: dict[str, IO | None]) -> WorkerOutput:
    """Where ``local_rank``'s output goes in our own layout under ``log_dir``."""
    redirect = config.redirects.for_rank(local_rank)
    tee = config.tee.for_rank(local_rank)
    ranks = config.local_ranks_filter
    return WorkerOutput.planned(
        os.path.join(log_dir, str(local_rank)),
        redirect={"stdout": bool(redirect & Std.OUT), "stderr": bool(redirect & Std.ERR)},
        tee={"stdout": bool(tee & Std.OUT), "stderr": bool(tee & Std.ERR)},
        shown=not ranks or local_rank in ranks,
        consoles=consoles,
    )


def make_log_dirs(log_dir: str, workers: list[Worker]) -> None:
    """Make the attempt's log directory ``log_dir`` anew (a re-used attempt number starts clean)
    with an owner-only directory per worker. A full disk costs log lines, not the attempt: it is
    reported and the log pumps retry.

    Raises:
        OSError: a directory could not be made for another reason.
    """
    shutil.rmtree(log_dir, ignore_errors=True)
    for worker in workers:
        rank_dir = os.path.dirname(worker.logs.error_file)
        try:
            os.makedirs(rank_dir, mode=0o700, exist_ok=True)
        except OSError as error:
            if error.errno not in DISK_FULL:
                raise
            REPORTER.lost(rank_dir, 0, error)


def place_logs(host: LogsSpecsHost, workers: list[Worker], env_of: Callable[[Worker], dict[str, str]],
               environ: Mapping[str, str], consoles: dict[str, IO | None]) -> str:
    """Ask the ``--logs-specs`` plugin where each worker's output goes, as torchrun asks it before
    starting its workers (``reify`` gets the variables the launcher sets per rank); place it and
    return the plugin's root log directory.

    Raises:
        LogsSpecsError: the plugin failed.
    """
    envs = {}
    for worker in workers:  # torch's envs: what the launcher sets; reify adds the error file
        env = env_of(worker)
        del env["TORCHELASTIC_ERROR_FILE"]
        envs[worker.local_rank] = {key: value for key, value in env.items() if environ.get(key) != value}
    plan = host.reify(envs)
    for worker in workers:
        worker.output = WorkerOutput.from_dest(plan.dests[worker.local_rank], consoles)
        worker.env_overrides = plan.env[worker.local_rank]
    return plan.root_log_dir


def start_process(config: LaunchConfig, worker: Worker, argv: list[str], env: dict[str, str],
                  std: dict[str, object], extras: WorkerExtras,
                  templates: TemplatePool | None) -> subprocess.Popen | ForkedWorker:
    """Start ``worker``: forked from its pre-warmed template, or (no template) the normal way.

    Raises:
        OSError: the process could not be started.
    """
    proc = _fork(config, worker, argv, env, std, extras, templates)
    if proc is None:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=std["stdout"],
            stderr=std["stderr"],
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(extras.fds.values()),
            # Linux: SIGKILL when this thread's process dies (see elastic.agent.pdeathsig).
            preexec_fn=parent_death_preexec(),
        )
    return proc


def _fork(config: LaunchConfig, worker: Worker, args: list[str], env: dict[str, str],
          std: dict[str, object], extras: WorkerExtras,
          templates: TemplatePool | None) -> ForkedWorker | None:
    """The worker forked from its pre-warmed template, or None: start it normally."""
    if templates is None:
        return None
    substituted = args[len(args) - len(config.entrypoint.args):]  # every argv ends with them
    job = dataclasses.replace(templates.job(env, substituted), inherited=tuple(extras.fds))
    return templates.fork(worker.local_rank, job, std, args, inherited=tuple(extras.fds.values()))


def failure_of(worker: Worker, stop_began: float | None) -> WorkerFailure:
    """The failure ``worker`` left (worked out once, then kept); ``during_stop`` if it exited
    after ``stop_began``."""
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
                stop_began is not None and worker.exit_monotonic >= stop_began
            ),
        )
    return worker.failure


def stop_pumps(workers: list[Worker], label: str) -> None:
    """Ask the log pumps of ``workers`` to stop, then wait (bounded) for each to drain; one line
    (``label``: ``Run <id>``) for a pump that did not finish."""
    pumps = [pump for worker in workers if worker.output is not None for pump in worker.output.pumps]
    for pump in pumps:
        pump.request_stop()
    for pump in pumps:
        pump.join(timeout=PUMP_DRAIN_S + 2.0)
        if pump.is_alive():
            log.warning("%s: log pump %s did not finish.", label, pump.name)
