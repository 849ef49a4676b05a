"""The parent-death signal: a ``preexec_fn`` that makes a child die with the agent, and the
``prctl`` call under it (stdlib only: the worker templates import it).

The first of the lifeline's mechanisms (:mod:`elastic.agent.lifeline`), used by everything that
starts a process for the agent (workers, templates, the store helper, the ``--logs-specs``
helper), so it sits below all of them. ``prctl`` is resolved once, at import, so a child between
fork and exec (or a forked worker) makes no ``dlsym`` and takes no lock to set it.

Why a ``preexec_fn`` despite Python's warning about threads: ours makes one foreign call
prepared in the parent (``prctl`` through a ctypes function pointer resolved at import, so no
``dlsym`` in the child), then ``getppid`` and at worst ``kill``; it takes no lock another thread
could hold (CPython disables the garbage collector around the fork, so no finalizer runs, and
glibc resets malloc's locks in the child). An exec wrapper (util-linux's ``setpriv
--pdeathsig``) costs an exec per worker and does not re-check the parent; a Python wrapper
costs an interpreter start. The cost of ours: CPython forks instead of vforking (docs/failure-behaviour.md).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from typing import Callable

log = logging.getLogger(__name__)

__all__ = ["PDEATHSIG_AVAILABLE", "load_prctl", "parent_death_preexec"]

_PR_SET_PDEATHSIG = 1


def load_prctl() -> Callable[[], int] | None:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)`` as a ready ctypes call, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    args = (ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL),
            ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))  # fmt: skip
    return lambda: prctl(*args)


_set_pdeathsig = load_prctl()
PDEATHSIG_AVAILABLE = _set_pdeathsig is not None
"""Whether this platform has the parent-death signal (Linux)."""

_warned_thread = False


def parent_death_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` making the child die by SIGKILL when the calling thread's process dies.

    ``None`` (no ``preexec_fn``) off Linux, or when called from a thread other than the main
    one: the signal would fire when that thread exits (logged once).
    """
    global _warned_thread
    set_pdeathsig = _set_pdeathsig
    if set_pdeathsig is None:
        return None
    if threading.current_thread() is not threading.main_thread():
        if not _warned_thread:
            _warned_thread = True
            log.warning("Workers started from thread %s get no parent-death signal (it follows the "
                        "forking thread); the lifeline watchdog still stops them if the agent dies.",
                        threading.current_thread().name)
        return None
    parent = os.getpid()

    def die_with_parent() -> None:  # runs in the child between fork and exec: keep it minimal
        set_pdeathsig()
        if os.getppid() != parent:  # the parent died before prctl: the signal will never come
            os.kill(os.getpid(), signal.SIGKILL)

    return die_with_parent
