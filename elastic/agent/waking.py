"""The agent's one way to wait: a self-pipe that worker exits, membership changes and signals wake.

A handled signal never raises where the main thread happens to be (half-way through stopping
a worker group, say). Its Python handler only records the signal number (one assignment, no
lock, no :class:`threading.Event`: a handler that took a lock the interrupted main thread held
would deadlock), and :func:`signal.set_wakeup_fd` makes the C-level handler write a byte to
the pipe, so a :meth:`Waker.wait` in ``select()`` returns at once. The agent looks at
:attr:`Waker.signalled` only at its own wait points (:meth:`Waker.check`) and stops there.

Threads wake the agent with :meth:`Waker.wake`: a non-blocking ``os.write``, safe from any
thread. A blocking call that cannot select on the pipe (a rendezvous join, the exit barrier)
runs in a helper thread through :meth:`Waker.call`; the main thread waits on the pipe, and when
a signal arrives it calls the given ``interrupt`` (e.g. ``Rendezvous.shutdown``) from normal
context, which ends the call. The main thread never waits for anything a signal handler holds,
and the helper never waits for the main thread, so nothing here can deadlock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
from typing import Callable, Iterator, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

INTERRUPT_JOIN_S = 2.0
"""How long an interrupted call's helper thread gets to unwind before the agent goes on without it."""


class Interrupted(Exception):
    """Raised by the agent's own wait points (never by a signal handler) once a handled signal arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


class _Outcome:
    """What a helper thread's call returned or raised; ``done`` is set last."""

    def __init__(self) -> None:
        self.done = False
        self.value: object = None
        self.error: BaseException | None = None


class Waker:
    """A self-pipe the agent's wait points select on, and the record of the first handled signal.

    Not thread-safe except :meth:`wake`: the other methods belong to the agent's main thread.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)  # set_wakeup_fd requires it; a full pipe is awake already
        self.signalled: int | None = None
        """The first handled signal received (None: none yet)."""

    def wake(self) -> None:
        """Make the current or next :meth:`wait` return. Any thread; never blocks, never raises."""
        try:
            os.write(self._write, b"\0")
        except OSError:  # full (a wake is pending anyway) or closed (the agent is gone)
            pass

    def wait(self, timeout: float | None) -> bool:
        """Block until a wake or a signal since the last wait, or ``timeout`` seconds (None: no
        limit); returns whether woken (False: the time ran out).

        A wake says only that something may have changed: callers look, and wait again.
        """
        if self.signalled is not None:
            return True
        # select() retries after EINTR only once the signal's Python handler has run, and the
        # wakeup byte keeps it readable: a signal is recorded by the time this returns.
        readable, _, _ = select.select([self._read], [], [], None if timeout is None else max(timeout, 0.0))
        if readable:
            self._drain()
        return bool(readable) or self.signalled is not None

    def check(self) -> None:
        """A safe point: raises :class:`Interrupted` once a handled signal has arrived."""
        if self.signalled is not None:
            raise Interrupted(self.signalled)

    def call(self, fn: Callable[[], T], *, what: str, interrupt: Callable[[], None] | None = None) -> T:
        """Run ``fn`` in a helper thread and wait for it on the pipe; returns what it returns,
        raises what it raises.

        Raises:
            Interrupted: a signal arrived before or during the call. ``interrupt`` (which must
                make ``fn`` return soon, and never raise) was called first, and the helper got
                :data:`INTERRUPT_JOIN_S` to unwind; without one, the helper is left to finish
                (a daemon thread). What it returns is dropped.
        """
        self.check()
        outcome = _Outcome()

        def run() -> None:
            try:
                outcome.value = fn()
            except BaseException as error:  # handed to the main thread
                outcome.error = error
            outcome.done = True
            self.wake()

        helper = threading.Thread(target=run, name=f"agent-{what}", daemon=True)
        helper.start()
        while not outcome.done:
            if self.signalled is not None:
                if interrupt is not None:  # without one, the call would not end any sooner
                    interrupt()
                    helper.join(INTERRUPT_JOIN_S)
                raise Interrupted(self.signalled)
            self.wait(None)
        helper.join()
        # The helper's own wake may still be in the pipe: take it (with any other wake since the
        # call began), or the caller's next wait would return at once for nothing. Callers look
        # at what they wait for after a call, so no change is missed.
        self._drain()
        if outcome.error is not None:
            raise outcome.error
        return outcome.value  # type: ignore[return-value]

    @contextlib.contextmanager
    def catching(self, names: tuple[str, ...]) -> Iterator[None]:
        """Record the signals ``names`` (e.g. ``("SIGTERM", "SIGINT")``) here while inside, and
        make each one wake the pipe; the previous handlers come back on exit.

        Only the main thread can handle signals: elsewhere this logs why and changes nothing.
        Names this platform does not know are logged and skipped.
        """
        if threading.current_thread() is not threading.main_thread():
            log.warning("The agent does not run in the main thread: it cannot handle signals %s", ", ".join(names))
            yield
            return

        def record(signum: int, _frame: object) -> None:
            if self.signalled is None:  # the first one decides the exit code
                self.signalled = signum

        previous: dict[signal.Signals, object] = {}
        old_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        try:
            for name in names:
                try:
                    signum = signal.Signals[name]
                    previous[signum] = signal.signal(signum, record)
                except (KeyError, OSError, ValueError):
                    log.warning("Cannot handle signal %s on this platform", name)
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)  # type: ignore[arg-type]
            signal.set_wakeup_fd(old_fd)

    def close(self) -> None:
        """Close the pipe (idempotent); later wakes are ignored."""
        fds = (self._read, self._write)
        self._read = self._write = -1  # first: a late wake() then fails instead of writing elsewhere
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    def _drain(self) -> None:
        while True:
            try:
                if not os.read(self._read, 4096):
                    return
            except BlockingIOError:
                return
