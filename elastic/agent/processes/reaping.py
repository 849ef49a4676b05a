"""Waiting for a helper process to exit, woken by the exit itself rather than by polling.

``Popen.wait(timeout)`` polls: it sleeps between looks, doubling the sleep up to 50 ms, so a
child that exits just after a look is noticed up to that much later. The agent waits like this
for its helpers (the store helper, the lifeline watchdog) on every exit, after its workers are
done. On Linux 5.3+ a pidfd becomes readable when the process exits, so :func:`wait_exited`
sleeps in ``poll`` on it and reaps at once; elsewhere it falls back to ``Popen.wait``.
"""

from __future__ import annotations

import os
import select
import subprocess

__all__ = ["wait_exited"]


def wait_exited(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``proc`` to exit, and reap it; whether it exited.

    Raises nothing: a pidfd that cannot be opened (an old kernel, no ``os.pidfd_open``, out of
    descriptors) means ``Popen.wait`` instead.
    """
    if proc.poll() is not None:
        return True
    try:
        pidfd = os.pidfd_open(proc.pid)  # an exited child stays a zombie until reaped here
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        waiter = select.poll()
        waiter.register(pidfd, select.POLLIN)
        exited = bool(waiter.poll(max(0.0, timeout) * 1000))
    finally:
        os.close(pidfd)
    if exited:
        proc.wait()  # it exited: returns at once
    return exited
