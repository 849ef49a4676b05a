"""Processes a test starts and waits for: launched agents, a job of several, bounded polling.

End-to-end tests start launchers (``elasticrun``, stock ``torchrun``) and sometimes workers as
real processes on loopback. Every suite does that with the same pieces:

- :class:`Launched`: one process with its output in files; :meth:`~Launched.wait` has a
  deadline and, when it expires, gathers where the process waits
  (:func:`~elastic.testing.hang_report.hang_report`); :meth:`~Launched.kill_tree` SIGKILLs the
  process and every descendant at once, as a machine dying;
- :class:`Job`: the processes of one test by name: start, wait for a condition while they
  live, collect their exit codes under one deadline, stop all by PID whatever happened;
- :class:`Reports`: the JSON lines that workers append to one file;
- :func:`wait_until`, :func:`kill_tree`, :func:`clean_env`.

A failure is a :class:`HarnessFailure`, an ``AssertionError``: pytest shows its message as the
test's failure, and each message names what was waited for and what was seen.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence, TypeVar

import psutil

from elastic.testing.hang_report import hang_report

__all__ = [
    "DidNotExit", "HarnessFailure", "Job", "Killed", "Launched", "ProcessExited", "Reports", "WaitTimeout",
    "clean_env", "is_alive", "kill_processes", "kill_tree", "process_tree", "read_json_lines", "wait_until",
]

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 60.0
"""How long a launched process may run, or a condition take, before a test gives up on it."""

STDERR_TAIL = 4000
"""How much of a process's stderr a failure message quotes."""

# What a launcher or a worker reads from its environment: set by an outer launcher, they would
# change what the process under test does.
_LAUNCHER_PREFIXES = ("TORCHELASTIC_", "PET_", "TORCH_NCCL", "ELASTIC_", "OMP_")
_LAUNCHER_KEYS = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOGLEVEL",
})


class HarnessFailure(AssertionError):
    """A process or a wait of a test went wrong; the message says what and what was seen."""


class WaitTimeout(HarnessFailure):
    """A condition did not hold within its deadline."""


class ProcessExited(HarnessFailure):
    """A process that a wait depended on exited before the condition held."""


class DidNotExit(HarnessFailure):
    """A process did not exit within its deadline (the message holds where it waits)."""


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without launcher/worker variables from outside, plus ``extra``.

    Dropped: ``TORCHELASTIC_*``, ``PET_*``, ``TORCH_NCCL*``, ``ELASTIC_*``, ``OMP_*``, the ranks and
    sizes torchrun gives a worker, ``MASTER_ADDR``/``MASTER_PORT`` and ``LOGLEVEL``.
    """
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(_LAUNCHER_PREFIXES) and key not in _LAUNCHER_KEYS}
    env.update(extra)
    return env


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05, *,
               context: Callable[[], str] | None = None, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``predicate`` every ``interval`` s until it returns something true; return that.

    It is called at least once, and once more after the deadline. Raises :class:`WaitTimeout`
    naming ``what`` (and ``context()``, the state seen last) when ``timeout`` s pass first.
    """
    if timeout < 0:
        raise ValueError(f"The timeout of the wait for {what} ({timeout:g}) must not be negative.")
    deadline = clock() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if clock() >= deadline:
            seen = f"; {context()}" if context is not None else ""
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}{seen}")
        sleep(interval)


# -- process trees ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Killed:
    """What :func:`kill_tree` did."""

    at: float
    """Wall-clock time (``time.time()``) just before the first SIGKILL: compare with workers' reports."""
    seconds: float
    """How long until every process was gone (exited; a zombie counts as gone)."""
    pids: tuple[int, ...]
    """Every process signalled."""
    survivors: tuple[int, ...]
    """Those still running when the timeout passed (none, normally)."""


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and all its live descendants (empty when ``pid`` is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_processes(procs: Sequence[psutil.Process], timeout: float = 10.0) -> Killed:
    """SIGKILL all of ``procs`` at once, then wait up to ``timeout`` s until they are gone.

    psutil refuses to signal a process whose PID was reused. Nothing is reaped here: the parent
    of each (a ``Popen`` of the test, or init) reaps it.
    """
    at, started = time.time(), time.monotonic()
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    deadline = started + timeout
    while (left := [proc for proc in procs if not _gone(proc)]) and time.monotonic() < deadline:
        time.sleep(0.005)
    return Killed(at, time.monotonic() - started, tuple(proc.pid for proc in procs), tuple(proc.pid for proc in left))


def kill_tree(pid: int, timeout: float = 10.0) -> Killed:
    """SIGKILL ``pid`` and every descendant at once (a machine dying); see :func:`kill_processes`."""
    return kill_processes(process_tree(pid), timeout)


def is_alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs (not a zombie) with ``marker`` in its command line (so not a reused PID)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and marker in " ".join(proc.cmdline())
    except psutil.Error:
        return False


# -- one process --------------------------------------------------------------------------------


class Launched:
    """One process a test started, with its stdout and stderr in files of ``logdir``.

    The files are ``<name>.stdout`` and ``<name>.stderr``, or one ``<name>.log`` with
    ``merge_output``. ``env`` is the whole environment (default: :func:`clean_env`). ``timeout``
    is the default deadline of :meth:`wait`.
    """

    def __init__(self, argv: Sequence[str], *, name: str, logdir: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, merge_output: bool = False, new_session: bool = False,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.name = name
        self.argv = list(argv)
        self.timeout = timeout
        self.hang = ""
        """Where the process waited when a wait for its exit expired (empty until one did)."""
        self.stdout_path = logdir / (f"{name}.log" if merge_output else f"{name}.stdout")
        self.stderr_path = self.stdout_path if merge_output else logdir / f"{name}.stderr"
        # Only a process started through elastic.testing.with_stacks answers SIGUSR1 with its
        # stacks; for any other it is fatal.
        self._answers_sigusr1 = "elastic.testing.with_stacks" in self.argv
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT if merge_output else err, stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else clean_env(), cwd=cwd, start_new_session=new_session)
        self.pid = self.proc.pid

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    @property
    def returncode(self) -> int | None:
        """The exit code, or None while it runs."""
        return self.proc.poll()

    def tail(self, chars: int = STDERR_TAIL) -> str:
        """The end of its stderr."""
        return self.stderr[-chars:]

    def exited_within(self, timeout: float | None = None, *, diagnose: bool = True) -> int | None:
        """The exit code, or None if it still runs after ``timeout`` s; then, with ``diagnose``,
        :attr:`hang` says where it waits (a few seconds: py-spy, then its own stack dump)."""
        try:
            return self.proc.wait(timeout=self.timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            if diagnose:
                self.hang = hang_report(self.pid, sigusr1=self._answers_sigusr1)
            return None

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; raises :class:`DidNotExit` (with where it waits) after ``timeout`` s."""
        code = self.exited_within(timeout)
        if code is None:
            raise DidNotExit(f"{self.name} (pid {self.pid}) did not exit within "
                             f"{self.timeout if timeout is None else timeout:g}s; {self.describe()}")
        return code

    def describe(self, chars: int = STDERR_TAIL, *, stdout_chars: int = 0) -> str:
        """Its exit status and stderr tail (and with ``stdout_chars``, its stdout tail: what
        workers that inherit it printed), and where it waited if a wait for its exit expired."""
        text = f"--- {self.name} (pid {self.pid}, exit {self.proc.poll()}) stderr tail:\n{self.tail(chars)}"
        if stdout_chars > 0 and self.stdout_path != self.stderr_path:
            text += f"\n--- {self.name}'s stdout tail:\n{self.stdout[-stdout_chars:]}"
        return f"{text}\n--- {self.name}'s threads:\n{self.hang}" if self.hang else text

    def tree(self) -> list[psutil.Process]:
        """The process and all its live descendants (workers may run in their own sessions)."""
        return process_tree(self.pid)

    def kill_tree(self, timeout: float = 10.0) -> Killed:
        """SIGKILL the process and every descendant at once (a machine dying), and reap it."""
        killed = kill_tree(self.pid, timeout)
        self.proc.wait(timeout=timeout)
        return killed

    def send_signal(self, signum: int) -> float:
        """Send ``signum`` to the process alone; the wall-clock time it was sent."""
        at = time.time()
        self.proc.send_signal(signum)
        return at

    def terminate(self) -> float:
        """SIGTERM (a graceful stop); the wall-clock time it was sent."""
        return self.send_signal(signal.SIGTERM)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, then after ``grace`` s SIGKILL; then SIGKILL any descendant it left. The exit code."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        descendants = self.tree()[1:]  # before the signal: once it exits, they are reparented
        self.terminate()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill_tree()
        kill_processes(descendants)
        return self.proc.returncode


def wait_while_running(what: str, predicate: Callable[[], T], processes: Iterable[Launched], timeout: float, *,
                       interval: float = 0.05, context: Callable[[], str] | None = None) -> T:
    """:func:`wait_until`, but raise :class:`ProcessExited` (with its stderr) as soon as one of
    ``processes`` exits while ``predicate`` does not hold."""
    watched = list(processes)

    def check() -> T:
        value = predicate()
        if value:
            return value
        for process in watched:
            if process.proc.poll() is not None:
                value = predicate()  # it may have been met just before the exit
                if not value:
                    raise ProcessExited(f"{process.name} exited ({process.proc.returncode}) while waiting for "
                                        f"{what}; {process.describe()}")
                return value
        return value

    return wait_until(check, timeout, what, interval, context=context)


# -- several processes --------------------------------------------------------------------------


class Job:
    """The processes of one test by name, stopped together by :meth:`stop_all` (or ``with``).

    Workers started by the agents are stopped with them when their PIDs are added to
    :attr:`worker_pids` (:class:`Reports` does it): each is SIGKILLed if it still runs with
    ``worker_marker`` in its command line.
    """

    def __init__(self, workdir: Path, *, timeout: float = DEFAULT_TIMEOUT_S, worker_marker: str | None = None) -> None:
        self.workdir = workdir
        self.timeout = timeout
        self.worker_marker = worker_marker
        self.agents: dict[str, Launched] = {}
        self.worker_pids: set[int] = set()

    def start(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
              merge_output: bool = False, new_session: bool = False) -> Launched:
        """Start ``argv`` as process ``name`` (its output in ``workdir``); see :class:`Launched`."""
        if name in self.agents:
            raise ValueError(f"A process named {name!r} was started already in {self.workdir}.")
        launched = Launched(argv, name=name, logdir=self.workdir, env=env, cwd=cwd, merge_output=merge_output,
                            new_session=new_session, timeout=self.timeout)
        self.agents[name] = launched
        return launched

    def __getitem__(self, name: str) -> Launched:
        return self.agents[name]

    def _chosen(self, names: Iterable[str] | None) -> list[Launched]:
        return [self.agents[name] for name in (self.agents if names is None else names)]

    def wait_for(self, what: str, predicate: Callable[[], T], *, names: Iterable[str] | None = None,
                 timeout: float | None = None, context: Callable[[], str] | None = None) -> T:
        """Poll ``predicate`` until it holds; raises :class:`ProcessExited` when one of the
        processes ``names`` (all) exits first, :class:`WaitTimeout` after ``timeout`` s."""
        return wait_while_running(what, predicate, self._chosen(names), self.timeout if timeout is None else timeout,
                                  context=context)

    def collect(self, names: Iterable[str] | None = None, timeout: float | None = None, *,
                diagnose: bool = True) -> dict[str, int | None]:
        """Each process's exit code within one deadline of ``timeout`` s for all; None for one
        still running (with ``diagnose``, its :attr:`Launched.hang` then says where it waits)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        return {launched.name: launched.exited_within(max(0.1, deadline - time.monotonic()), diagnose=diagnose)
                for launched in self._chosen(names)}

    def logs(self, chars: int = 3000) -> str:
        """Every process's :meth:`Launched.describe`."""
        return "\n".join(launched.describe(chars) for launched in self.agents.values())

    def stop_all(self) -> None:
        """SIGKILL every process still running with its tree, then the workers of :attr:`worker_pids`."""
        for launched in self.agents.values():
            if launched.proc.poll() is None:
                launched.kill_tree()
        if self.worker_marker is not None:
            strays = []
            for pid in self.worker_pids:
                try:
                    if is_alive(pid, self.worker_marker):
                        strays.append(psutil.Process(pid))
                except psutil.Error:
                    pass
            kill_processes(strays)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()


# -- worker reports -----------------------------------------------------------------------------


def read_json_lines(path: Path) -> list[dict]:
    """The complete lines of a JSON-lines file that writers may still append to (the text after
    the last newline may be a line being written: it is left for the next read)."""
    if not path.exists():
        return []
    complete = path.read_text(errors="replace").split("\n")[:-1]
    return [json.loads(line) for line in complete if line.strip()]


class Reports:
    """The JSON lines the workers of a test append to one file: one object per line, with an
    ``event`` key and the worker's ``pid``; read pids go to ``job``'s :attr:`Job.worker_pids`."""

    def __init__(self, path: Path, job: Job | None = None) -> None:
        self.path = path
        self._job = job

    def all(self) -> list[dict]:
        records = read_json_lines(self.path)
        if self._job is not None:
            self._job.worker_pids.update(record["pid"] for record in records if "pid" in record)
        return records

    def events(self, event: str, **match: object) -> list[dict]:
        """The records of ``event`` whose fields equal ``match``."""
        return [r for r in self.all() if r["event"] == event and all(r.get(k) == v for k, v in match.items())]

    def wait_for(self, what: str, predicate: Callable[[list[dict]], bool], processes: Iterable[Launched],
                 timeout: float = DEFAULT_TIMEOUT_S) -> list[dict]:
        """Poll until ``predicate(records)``; the records. Raises :class:`ProcessExited` when one of
        ``processes`` exits first, :class:`WaitTimeout` (with the last reports) after ``timeout`` s."""
        seen: list[list[dict]] = []

        def met() -> bool:
            seen[:] = [self.all()]
            return predicate(seen[0])

        wait_while_running(what, met, processes, timeout, context=lambda: f"last reports: {self.all()[-6:]}")
        return seen[0]
