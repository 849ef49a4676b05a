"""The parent-death signal as a ready ctypes call (stdlib only: the worker templates import it).

Resolved once, at import of the caller, so a child between fork and exec (or a forked worker)
makes no ``dlsym`` and takes no lock to set it.
"""

from __future__ import annotations

import ctypes
import signal
import sys
from typing import Callable

__all__ = ["load_prctl"]

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
