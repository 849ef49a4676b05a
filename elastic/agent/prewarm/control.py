"""The agent's end of one template process: start it, fork workers through it, read what it says.

The template (:mod:`elastic.agent.prewarm.template`) answers on a socket pair: ``ready`` or
``refused`` once, ``forked``/``error`` per fork request, ``exited`` per worker it reaped. A
reader thread applies them; a fork waits for its answer with a deadline.
"""

from __future__ import annotations

import collections
import enum
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import IO, Mapping

import psutil

from elastic.agent.errors import TemplateError
from elastic.agent.pdeathsig import parent_death_preexec
from elastic.agent.prewarm.forked import ForkedWorker
from elastic.agent.prewarm.template import BOOT
from elastic.agent.prewarm.wire import FrameReader, TemplateWireError, WorkerJob, encode, fork_request
from elastic.agent.safe_path import isolated_program

__all__ = ["Template", "TemplateSpec", "TemplateState"]

log = logging.getLogger(__name__)

# How long a fork waits for the template's answer, and a close for the template to exit.
FORK_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0
# After a template dies, how long its forked workers get to die of their parent-death signal.
ORPHAN_WAIT_S = 5.0
# The template's program: the agent's working directory is not on its path (safe_path); the
# template puts the workers' sys.path[0] first itself.
_ISOLATED_BOOT = isolated_program(BOOT, package_root=True)


class TemplateState(enum.Enum):
    """Where a template stands: ``STARTING`` → ``READY`` | ``REFUSED`` | ``DEAD``; ``READY`` →
    ``DEAD``. ``REFUSED`` and ``DEAD`` are final."""

    STARTING = "starting"
    READY = "ready"
    REFUSED = "refused"
    DEAD = "dead"


@dataclass(frozen=True)
class TemplateSpec:
    """How to start one template: the workers' interpreter, the modules to import, the
    environment's fixed part, and the ``sys.path[0]`` the workers get."""

    python: str
    modules: tuple[str, ...]
    env: Mapping[str, str]
    path0: str


class Template:
    """One template process and its control socket.

    Args:
        spec: how to start it.
        label: how log lines name it (``Run <id> local rank <n>``).
    """

    def __init__(self, spec: TemplateSpec, label: str) -> None:
        self.spec = spec
        self.label = label
        self.state = TemplateState.STARTING
        self.reason = ""
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.ready_after: float | None = None
        self.ready_info: dict = {}  # the ready message: the thread counts of the check
        self._chan: socket.socket | None = None
        self._cond = threading.Condition()
        self._fork_lock = threading.Lock()
        self._pending: collections.deque[ForkedWorker] = collections.deque()
        self._answers: collections.deque[dict] = collections.deque()
        self._children: dict[int, ForkedWorker] = {}
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> Template:
        """Start the process (it imports in the background); returns self.

        Raises:
            TemplateError: the interpreter could not be started.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.started_at = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                [self.spec.python, "-u", "-c", _ISOLATED_BOOT, str(theirs.fileno()), self.spec.path0, ",".join(self.spec.modules)],
                env=dict(self.spec.env), stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                start_new_session=True, close_fds=True, preexec_fn=parent_death_preexec(),
            )  # fmt: skip
        except OSError as error:
            ours.close()
            self._set(TemplateState.DEAD, str(error))
            raise TemplateError(f"{self.label}: cannot start a worker template ({self.spec.python}): {error}") from error
        finally:
            theirs.close()
        self._chan = ours
        self._reader = threading.Thread(target=self._read, name=f"template-{self.proc.pid}", daemon=True)
        self._reader.start()
        return self

    def wait_ready(self, timeout: float) -> TemplateState:
        """Wait until the template is no longer starting, at most ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self.state is not TemplateState.STARTING, timeout)
            return self.state

    def fork(self, job: WorkerJob, stdio: Mapping[str, object], *, argv: list[str],
             timeout: float = FORK_TIMEOUT_S, inherited: tuple[int, ...] = ()) -> ForkedWorker:
        """Fork a worker for ``job``. ``stdio`` holds ``Popen``-style ``stdout``/``stderr``
        values (a file, a descriptor, ``subprocess.DEVNULL`` or ``subprocess.PIPE``); ``argv``
        is the command line a normal start would have used (for messages); ``inherited`` the
        descriptors named by ``job.inherited``, in its order (sent, not closed here).

        Raises:
            TemplateError: the template is not ready, died, refused the request, or did not
                answer within ``timeout`` (then it is killed, and replaced at the next start).
        """
        with self._fork_lock:
            if self.state is not TemplateState.READY or self._chan is None:
                raise TemplateError(f"{self.label}: the template is {self.state.value}")
            if len(inherited) != len(job.inherited):
                raise TemplateError(f"{self.label}: {len(inherited)} descriptors for {len(job.inherited)} inherited names")
            fds, mine, parent_ends = _stdio_fds(stdio)
            fds = [*fds, *inherited]
            worker = ForkedWorker(argv, parent_ends.get("stdout"), parent_ends.get("stderr"))
            message = fork_request(job, len(fds))
            try:
                with self._cond:
                    self._pending.append(worker)
                frame = encode(message)
                sent = socket.send_fds(self._chan, [frame], fds)  # the descriptors ride on the first byte
                if sent < len(frame):
                    self._chan.sendall(frame[sent:])
                answer = self._answer(timeout)
            except (OSError, TemplateWireError) as error:
                self._abandon(worker, parent_ends)
                raise TemplateError(f"{self.label}: cannot send the fork request: {error}") from error
            finally:
                for fd in mine:
                    os.close(fd)
            if answer is None or answer.get("op") != "forked":
                self._abandon(worker, parent_ends)
                if answer is None:
                    self._kill(f"no answer to a fork request within {timeout:g}s")
                why = answer.get("error", "no answer") if answer else f"no answer within {timeout:g}s"
                raise TemplateError(f"{self.label}: the template could not fork: {why}")
            return worker

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Close the socket (the template exits, its forked children die with it) and reap it."""
        chan, self._chan = self._chan, None
        if chan is not None:
            try:
                chan.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            chan.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=timeout)

    def rss_bytes(self) -> int:
        """The template's resident memory (0 when it is gone)."""
        try:
            return psutil.Process(self.pid).memory_info().rss if self.pid else 0
        except psutil.Error:
            return 0

    # -- internals ---------------------------------------------------------------------------

    def _abandon(self, worker: ForkedWorker, parent_ends: Mapping[str, IO[bytes]]) -> None:
        with self._cond:
            if worker in self._pending:
                self._pending.remove(worker)
        for end in parent_ends.values():
            end.close()

    def _answer(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._answers:
                if self.state is TemplateState.DEAD:
                    return {"op": "error", "error": f"the template died ({self.reason})"}
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return self._answers.popleft()

    def _set(self, state: TemplateState, reason: str = "") -> None:
        with self._cond:
            if self.state in (TemplateState.REFUSED, TemplateState.DEAD):
                return
            self.state, self.reason = state, reason
            if state is TemplateState.READY:
                self.ready_after = time.monotonic() - self.started_at
            self._cond.notify_all()

    def _kill(self, why: str) -> None:
        log.warning("%s: killing the worker template (pid %s): %s", self.label, self.pid, why)
        self._set(TemplateState.DEAD, why)
        if self.proc is not None:
            self.proc.kill()

    def _read(self) -> None:
        """The reader thread: applies the template's messages until its socket closes."""
        reader = FrameReader()
        chan = self._chan
        while chan is not None:
            try:
                data = chan.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            try:
                for message in reader.feed(data):
                    self._apply(message)
            except TemplateWireError as error:
                self._kill(str(error))
                break
        self._died()

    def _apply(self, message: dict) -> None:
        """Apply one message of the template.

        Raises:
            TemplateWireError: a field has the wrong type (the template speaks nonsense).
        """
        try:
            self._apply_checked(message)
        except (KeyError, TypeError, ValueError) as error:
            raise TemplateWireError(f"A malformed {str(message.get('op'))[:40]!r} message from the template: "
                                    f"{type(error).__name__}: {str(error)[:100]}") from error

    def _apply_checked(self, message: dict) -> None:
        op = message.get("op")
        if op == "ready":
            self.ready_info = message
            self._set(TemplateState.READY)
        elif op == "refused":
            self._set(TemplateState.REFUSED, str(message.get("reason", "no reason given"))[:2000])
        elif op in ("forked", "error"):
            with self._cond:
                if op == "forked" and self._pending:
                    worker = self._pending.popleft()
                    worker.pid = int(message["pid"])
                    self._children[worker.pid] = worker
                elif self._pending:
                    self._pending.popleft()
                self._answers.append(message)
                self._cond.notify_all()
        elif op == "exited":
            with self._cond:
                worker = self._children.pop(int(message.get("pid", -1)), None)
            if worker is not None:
                worker._exited(int(message.get("code", 1)))

    def _died(self) -> None:
        """The socket closed: the template exited (or was closed). Its forked workers die of
        their parent-death signal; report each as killed once it is gone."""
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=1.0)  # its socket closed: it is exiting
            except subprocess.TimeoutExpired:
                pass
        why = f"it exited ({code})" if code is not None else "its socket closed"
        if self.state is TemplateState.STARTING:  # it never got ready: a new one would not either
            self._set(TemplateState.REFUSED, f"{why} before it was ready (its stderr is the agent's)")
        self._set(TemplateState.DEAD, why)
        with self._cond:
            orphans, self._children = list(self._children.values()), {}
            self._cond.notify_all()
        deadline = time.monotonic() + ORPHAN_WAIT_S
        for worker in orphans:
            while time.monotonic() < deadline and _alive(worker.pid):
                time.sleep(0.02)
            worker._exited(-signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _stdio_fds(stdio: Mapping[str, object]) -> tuple[list[int], list[int], dict[str, IO[bytes]]]:
    """The descriptors to send (stdout, stderr), those to close once sent, and the
    read ends of piped streams."""
    fds, mine, parents = [], [], {}
    for name in ("stdout", "stderr"):
        value = stdio[name]
        if value == subprocess.PIPE:
            read_end, write_end = os.pipe()
            parents[name] = open(read_end, "rb", buffering=0)  # noqa: SIM115 - the pump closes it
            fds.append(write_end)
            mine.append(write_end)
        elif value == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_WRONLY)
            fds.append(fd)
            mine.append(fd)
        elif isinstance(value, int):
            fds.append(value)
        else:
            fds.append(value.fileno())  # type: ignore[attr-defined]
    return fds, mine, parents
