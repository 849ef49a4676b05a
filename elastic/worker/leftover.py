"""Store calls run in a tracked daemon thread, and the wait at exit for those left behind.

A live worker never blocks training on a slow store: a call to a round's store (a connect, a
bounded look) runs in a daemon thread that the caller waits for with a bound
(:func:`start_call`, :meth:`StoreCall.wait`). A call the caller stops waiting for runs on, left
behind, until the store's own timeout ends it. One that comes back from torch's C++ into a
finalizing interpreter aborts the process (SIGABRT, "terminate called without an active
exception") after a run that succeeded; so every call is tracked until its thread ends, and a
worker that closes waits (bounded) for them all (:func:`wait_for_leftovers`). A call to a frozen
store may never end: the wait gives up, and its daemon thread blocks nothing.

Only running calls are tracked: a thread that ended drops out at the next start or wait.
Torch-free.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Generic, TypeVar

__all__ = ["StoreCall", "leftovers", "start_call", "wait_for_leftovers"]

T = TypeVar("T")

_SLICE = 0.05
"""The longest one join lasts in :func:`wait_for_leftovers` before the clock is read again."""

_LOCK = threading.Lock()
_RUNNING: set[threading.Thread] = set()
"""The threads of the calls started and not yet seen ended."""


class StoreCall(Generic[T]):
    """One store call running in a tracked daemon thread: its value or its error once it ends."""

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        self._fn = fn
        self._done = threading.Event()
        self._value: T | None = None
        self.error: Exception | None = None
        """What the call raised (None: it returned, or it still runs)."""
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def wait(self, timeout: float) -> bool:
        """Whether the call ended (returned or raised) within ``timeout`` seconds."""
        return self._done.wait(timeout)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def value(self) -> T:
        """What the call returned.

        Raises:
            RuntimeError: the call still runs or raised (see :attr:`error`).
        """
        if not self._done.is_set() or self.error is not None:
            raise RuntimeError(f"the store call {self.thread.name} "
                               + ("still runs" if not self._done.is_set() else "raised") + ": it has no value")
        return self._value  # type: ignore[return-value]

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except Exception as error:  # kept for the caller, who translates it
            self.error = error
        finally:
            self._done.set()


def start_call(fn: Callable[[], T], *, name: str) -> StoreCall[T]:
    """Start ``fn()`` in a daemon thread named ``name``, tracked until that thread ends."""
    call = StoreCall(fn, name)
    with _LOCK:  # started under the lock, so that no prune sees it not yet alive
        _prune()
        _RUNNING.add(call.thread)
        call.thread.start()
    return call


def leftovers() -> int:
    """How many store calls started here still run."""
    with _LOCK:
        _prune()
        return len(_RUNNING)


def wait_for_leftovers(timeout: float, clock: Callable[[], float] = time.monotonic) -> int:
    """Wait up to ``timeout`` seconds (by ``clock``) for every store call still running to end
    (its thread, not only its call); how many still run then. ``timeout`` 0: do not wait.

    Raises:
        ValueError: ``timeout`` is negative.
    """
    if timeout < 0:
        raise ValueError(f"The wait for store calls left behind ({timeout!r}) must not be negative.")
    deadline = clock() + timeout
    while True:
        with _LOCK:
            _prune()
            running = list(_RUNNING)
        left = deadline - clock()
        if not running or left <= 0:
            return len(running)
        running[0].join(min(left, _SLICE))


def _prune() -> None:
    """Drop the threads that ended (under ``_LOCK``)."""
    _RUNNING.difference_update([thread for thread in _RUNNING if not thread.is_alive()])
