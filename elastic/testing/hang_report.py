"""Where a process that should have exited is waiting: for a test's failure message.

Three views, each best effort (a view that cannot be had says why; nothing here raises):

1. its OS threads from ``/proc`` (:func:`~elastic.testing.os_threads.describe_threads`);
2. every thread's native and Python frames from ``py-spy dump --native``, when py-spy is
   installed (the ``test`` extra installs it). It is the one view that shows C and C++ frames,
   so it is the one that explains a hang in interpreter finalization or in a library's teardown;
3. SIGUSR1, which a process started under :mod:`elastic.testing.with_stacks` answers with
   faulthandler's dump of its Python threads in its own stderr (asked for last: a process
   stuck in finalization has no handler left and dies of it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

from elastic.testing.os_threads import describe_threads

__all__ = ["hang_report", "native_stacks"]

PY_SPY_TIMEOUT_S = 30.0
"""How long one py-spy dump may take (it attaches with ptrace and reads each thread)."""

_SIGUSR1_GRACE_S = 1.0
"""How long the process gets to write faulthandler's dump after SIGUSR1."""


def native_stacks(pid: int, timeout: float = PY_SPY_TIMEOUT_S) -> str:
    """``py-spy dump --native`` of ``pid``, or one line saying why there is none."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return "py-spy is not installed: no native stacks"
    try:
        done = subprocess.run([py_spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"py-spy dump of {pid} took more than {timeout:g}s"
    except OSError as error:
        return f"py-spy could not run: {error}"
    text = (done.stdout + done.stderr).strip()
    return text if done.returncode == 0 else f"py-spy dump of {pid} failed ({done.returncode}): {text[-2000:]}"


def hang_report(pid: int, *, sigusr1: bool = True) -> str:
    """The OS threads and native stacks of ``pid``; then, with ``sigusr1``, ask it for its
    Python stacks (they go to its stderr). Empty when the process is gone already."""
    try:
        os.kill(pid, 0)
    except OSError:
        return ""
    report = f"{describe_threads(pid)}\n--- native stacks of {pid} (py-spy):\n{native_stacks(pid)}"
    if sigusr1:
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            pass
        else:
            time.sleep(_SIGUSR1_GRACE_S)
    return report
