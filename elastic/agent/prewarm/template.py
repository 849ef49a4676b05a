"""The program of a worker template: import the user's modules once, then fork workers on request.

Run by the agent (:mod:`elastic.agent.prewarm.pool`) as ``python -u -c BOOT FD PATH0 MODULES``
(``BOOT`` behind :func:`~elastic.agent.safe_path.isolated_program`: nothing is imported from the
agent's working directory) with the worker environment's fixed part, in its own session, with the parent-death signal.
FD is its end of a Unix socket pair; PATH0 is the ``sys.path[0]`` the workers get; MODULES is
the comma-separated ``--prewarm-modules``. It imports them, checks itself
(:mod:`elastic.agent.prewarm.check`) and answers ``ready`` or ``refused``. Then, for each
``fork`` request (the attempt's environment, argv and working directory, with the worker's
stdout and stderr passed as file descriptors) it forks; the child becomes the worker exactly
as ``python -u script.py`` would run it (see :func:`run_job`), the template answers ``forked``
with the child's pid and later ``exited`` with its exit code (``Popen.returncode``'s
convention). It exits when the agent closes the socket; its children then die by their
parent-death signal. The template stays single-threaded: it waits on the socket and on a
pidfd per child with one selector.

Stdlib only until the user's modules: this file, :mod:`template_wire`, :mod:`template_check` and
:mod:`elastic.agent.run_path`.
"""

from __future__ import annotations

import atexit
import builtins
import gc
import os
import runpy
import selectors
import signal
import socket
import sys
from dataclasses import dataclass
from importlib.machinery import SourceFileLoader
from typing import Any, Callable, NoReturn

from elastic.agent.pdeathsig import load_prctl
from elastic.agent.prewarm.check import judge_template, probe_template
from elastic.agent.prewarm.wire import FrameReader, TemplateWireError, WorkerJob, encode, read_fork_request
# ``--run-path`` workers run it as ``python -u -c``; a forked one runs the same text, so its
# traceback, argv and exit match a normal start's.
from elastic.agent.run_path import RUN_PATH_BOOTSTRAP

__all__ = ["BOOT", "Job", "main", "run_job"]

BOOT = "from elastic.agent.prewarm.template import main; main()"
_RECV_BYTES = 1 << 16
_MAX_FDS = 8
_WAIT_POLL_S = 0.1  # without pidfd_open: how often to look for exited children


@dataclass(frozen=True)
class Job:
    """One worker to become: the ``fork`` request's job, the worker's received stdio fds, and
    the descriptors it inherits by the environment variable that names each."""

    worker: WorkerJob
    stdout_fd: int
    stderr_fd: int
    inherited: tuple[tuple[str, int], ...] = ()


_set_pdeathsig = load_prctl()


def _send(chan: socket.socket, message: dict[str, Any]) -> None:
    chan.sendall(encode(message))


def _prepare(chan: socket.socket, path0: str, modules: list[str]) -> bool:
    """Import the modules with the workers' ``sys.path[0]``, check, and report; True if ready.

    The template starts without the implicit working-directory entry (``python -c`` with
    :func:`~elastic.agent.safe_path.isolated_program`), so ``path0`` goes first, where
    ``python -u script.py`` puts the script's directory; a forked worker replaces it with its own.
    """
    sys.path.insert(0, path0)
    for name in modules:
        try:
            __import__(name)
        except BaseException as error:  # noqa: BLE001 - any import failure refuses the template
            _send(chan, {"op": "refused", "reason": f"cannot import {name}: {type(error).__name__}: {error}"[:2000]})
            return False
    probe = probe_template()
    reason = judge_template(probe)
    if reason is not None:
        _send(chan, {"op": "refused", "reason": reason})
        return False
    gc.freeze()  # the imports' objects: no collection in a worker touches (and copies) their pages
    _send(chan, {"op": "ready", "pid": os.getpid(), "os_threads_before_fork": probe.os_threads_before_fork,
                 "os_threads_after_fork": probe.os_threads_after_fork})
    return True


def _job(message: dict[str, Any], fds: list[int]) -> Job:
    """The job of a ``fork`` request.

    Raises:
        TemplateWireError: a field is missing or of the wrong type, or the fds are missing.
    """
    worker = read_fork_request(message)
    if len(fds) != 2 + len(worker.inherited):
        raise TemplateWireError(f"A fork request carries {len(fds)} descriptors; stdout, stderr and "
                                f"{len(worker.inherited)} inherited need {2 + len(worker.inherited)}.")
    return Job(worker, stdout_fd=fds[0], stderr_fd=fds[1], inherited=tuple(zip(worker.inherited, fds[2:])))


def serve(chan: socket.socket) -> Job | None:
    """Answer fork requests until the agent closes the socket (then None). Returns a
    :class:`Job` only in a forked child, which must then become the worker."""
    selector = selectors.DefaultSelector()
    selector.register(chan, selectors.EVENT_READ, None)
    reader = FrameReader()
    received: list[int] = []
    children: dict[int, int | None] = {}  # pid -> pidfd
    pidfd_open = getattr(os, "pidfd_open", None)  # Linux >= 5.3
    while True:
        polled = [pid for pid, pidfd in children.items() if pidfd is None]
        events = selector.select(_WAIT_POLL_S if polled else None)
        for key, _ in events:
            if key.data is not None:  # a child's pidfd: it exited
                _reap(chan, selector, children, key.data)
                continue
            data, fds, _, _ = socket.recv_fds(chan, _RECV_BYTES, _MAX_FDS)
            received.extend(fds)
            if not data:
                return None
            try:
                messages = reader.feed(data)
            except TemplateWireError:
                return None  # the agent speaks nonsense: stop serving it
            for message in messages:
                if message.get("op") != "fork":
                    continue
                count = message.get("fds", 0)
                count = count if isinstance(count, int) and 0 <= count <= _MAX_FDS else 0
                fds, received[:] = received[:count], received[count:]
                job = _fork(chan, message, fds, selector, children, pidfd_open)
                if job is not None:
                    return job
        for pid in polled:  # children without a pidfd
            if pid in children:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    _report_exit(chan, children, pid, status)


def _fork(chan: socket.socket, message: dict[str, Any], fds: list[int], selector: selectors.BaseSelector,
          children: dict[int, int | None], pidfd_open: Callable[[int], int] | None) -> Job | None:
    """Fork one worker; in the child, return its job (everything of the template's closed)."""
    template = os.getpid()
    try:
        job = _job(message, fds)
        pid = os.fork()
    except (OSError, TemplateWireError) as error:
        for fd in fds:
            os.close(fd)
        _send(chan, {"op": "error", "error": f"{type(error).__name__}: {error}"[:2000]})
        return None
    if pid == 0:
        _detach(chan, selector, children, template)
        return job
    for fd in fds:
        os.close(fd)  # the child has them; kept here, the agent's pipes would never see EOF
    pidfd = None
    if pidfd_open is not None:
        try:
            pidfd = pidfd_open(pid)
            selector.register(pidfd, selectors.EVENT_READ, pid)
        except OSError:
            pidfd = None
    children[pid] = pidfd
    _send(chan, {"op": "forked", "pid": pid})
    return None


def _reap(chan: socket.socket, selector: selectors.BaseSelector, children: dict[int, int | None], pid: int) -> None:
    pidfd = children.get(pid)
    if pidfd is not None:
        selector.unregister(pidfd)
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    _report_exit(chan, children, pid, status)


def _report_exit(chan: socket.socket, children: dict[int, int | None], pid: int, status: int) -> None:
    children.pop(pid, None)
    _send(chan, {"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _detach(chan: socket.socket, selector: selectors.BaseSelector, children: dict[int, int | None],
            template: int) -> None:
    """In the forked child, before anything else: a session of its own (as ``start_new_session``),
    the parent-death signal (the template), and none of the template's descriptors."""
    os.setsid()
    if _set_pdeathsig is not None:
        _set_pdeathsig()
        if os.getppid() != template:  # the template died before prctl: the signal would never come
            os.kill(os.getpid(), signal.SIGKILL)
    for pidfd in children.values():
        if pidfd is not None:
            os.close(pidfd)
    selector.close()
    chan.close()


# -- in the forked child: become the worker ------------------------------------------------------


def _reset_process(job: Job) -> None:
    """What a fresh ``python -u`` would have: stdio, working directory, environment, signals."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(job.stdout_fd, 1)
    os.dup2(job.stderr_fd, 2)
    for fd in {devnull, job.stdout_fd, job.stderr_fd} - {0, 1, 2}:
        os.close(fd)
    os.chdir(job.worker.cwd)
    os.environ.clear()
    os.environ.update(job.worker.env)
    os.environ.update({name: str(fd) for name, fd in job.inherited})  # its own numbers for them
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        wanted = {signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN,
                  signal.SIGXFSZ: signal.SIG_IGN}.get(signum, signal.SIG_DFL)
        try:
            if signal.getsignal(signum) is not wanted:
                signal.signal(signum, wanted)
        except (OSError, ValueError):
            pass
    random = sys.modules.get("numpy.random")
    if random is not None:  # numpy seeds its global generator at import: a fork would share it
        random.seed()


def _fresh_main() -> dict[str, Any]:
    """``__main__``'s namespace, emptied as a new interpreter's is."""
    namespace = sys.modules["__main__"].__dict__
    namespace.clear()
    namespace.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None,
                     __annotations__={}, __builtins__=builtins)
    return namespace


def _exec(job: WorkerJob) -> None:
    """Run the job's code as ``python -u`` runs a script, ``-m`` a module, ``-c`` the run-path
    bootstrap; returns when it finishes (exceptions propagate)."""
    sys.path[0] = job.path0
    namespace = _fresh_main()
    if job.kind == "module":
        sys.argv = ["-m", *job.args]
        runpy._run_module_as_main(job.target, alter_argv=True)  # what ``python -m`` calls
        return
    if job.kind == "run_path":
        sys.argv = ["-c", job.target, *job.args]
        exec(compile(RUN_PATH_BOOTSTRAP, "<string>", "exec"), namespace)
        return
    sys.argv = [job.target, *job.args]
    filename = os.path.abspath(job.target)
    try:
        with open(filename, "rb") as source_file:
            source = source_file.read()
    except OSError as error:
        print(f"{sys.executable}: can't open file {filename!r}: [Errno {error.errno}] {error.strerror}",
              file=sys.stderr)
        raise SystemExit(2) from None
    namespace.update(__file__=filename, __cached__=None, __loader__=SourceFileLoader("__main__", filename))
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)


_interrupted = False


def _exit_by_sigint() -> None:
    """Registered before the user's code, so it runs after every ``atexit`` handler of theirs:
    an uncaught KeyboardInterrupt ends the process by SIGINT, as CPython does."""
    if _interrupted:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def run_job(job: Job) -> NoReturn:
    """Become the worker and run it; exit as ``python -u`` would: ``SystemExit`` codes, an
    uncaught exception's traceback (without this module's frames) and status 1, ``atexit``
    handlers and non-daemon threads as at any interpreter exit."""
    global _interrupted
    _reset_process(job)
    atexit.register(_exit_by_sigint)
    try:
        _exec(job.worker)
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - printed as the interpreter would
        _interrupted = isinstance(error, KeyboardInterrupt)
        error.__traceback__ = _user_traceback(error.__traceback__)  # the hook prints this one
        sys.excepthook(type(error), error, error.__traceback__)
        raise SystemExit(1) from None
    raise SystemExit(0)


def _user_traceback(tb):  # type: ignore[no-untyped-def]
    """The traceback from the first frame that is not this module's (it starts at run_job)."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def main() -> None:
    """The template's entry point (``BOOT``); in a forked child it never returns."""
    chan = socket.socket(fileno=int(sys.argv[1]))
    path0, modules = sys.argv[2], [m for m in sys.argv[3].split(",") if m]
    try:
        if not _prepare(chan, path0, modules):
            return
        job = serve(chan)
    except OSError:  # the agent is gone (its end closed): nothing left to serve
        return
    if job is None:  # the agent closed the socket: nothing to flush, skip tearing down its imports
        os._exit(0)  # (torch's takes a few tenths of a second, which the agent's exit would wait)
    run_job(job)
