"""The agent's handle on its lifeline watchdog (:mod:`.watchdog`): start it, arm it, release it.

The watchdog is started before the agent knows its PID file (the run's state directory comes
with the configuration the runner completes), as early as the command line is read: its
interpreter start then runs beside the agent's own imports, on a core the agent leaves idle,
instead of beside the workers' start. The PID file's path follows on the pipe
(:meth:`Watchdog.arm`). This module imports nothing heavy, so starting the watchdog is the
first thing the launcher can do; the watchdog itself starts without ``site``
(:func:`watchdog_program`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from typing import Mapping

from elastic.agent.processes.reaping import wait_exited
from elastic.agent.safe_path import PACKAGE_ROOT, isolated_program

log = logging.getLogger(__name__)

__all__ = ["Watchdog", "watchdog_program"]

_EXIT_TIMEOUT_S = 5.0
"""How long a released watchdog gets to exit before it is killed."""


def watchdog_program() -> str:
    """The watchdog's program for ``python -S -c``: nothing imported from the agent's working
    directory (:func:`isolated_program`), and, since ``-S`` skips ``site`` (its ``.pth`` files
    and their imports, a large part of an interpreter's start), the two directories it needs
    beyond the standard library appended to its path: this package's and psutil's, as the
    agent finds them."""
    directories = [PACKAGE_ROOT]
    try:
        spec = importlib.util.find_spec("psutil")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        directories.append(os.path.dirname(os.path.dirname(spec.origin)))  # .../site-packages/psutil/__init__.py
    appended = "".join(f"if {d!r} not in sys.path:\n    sys.path.append({d!r})\n" for d in directories)
    return isolated_program(appended + "from elastic.agent.lifeline.watchdog import main\nmain()")


class Watchdog:
    """One watchdog process and the write end of its pipe (the only one: the agent's).

    Use :meth:`start`; :meth:`arm` once the PID file exists; :meth:`close` at exit.
    """

    def __init__(self, proc: subprocess.Popen, pipe_w: int) -> None:
        self.proc = proc
        self._pipe_w: int | None = pipe_w
        self._armed = False

    @classmethod
    def start(cls, environ: Mapping[str, str] | None = None) -> Watchdog:
        """Start a watchdog (in its own session, its stdin the read end of a new pipe).

        Args:
            environ: its environment (default: the agent's).

        Raises:
            OSError: the pipe or the process cannot be created.
        """
        read_end, write_end = os.pipe()  # both close-on-exec; only the watchdog gets read_end
        try:
            proc = subprocess.Popen(
                [sys.executable, "-S", "-c", watchdog_program()], env=environ,
                stdin=read_end, stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True,
            )  # fmt: skip
        except OSError:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        return cls(proc, write_end)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def arm(self, path: str) -> None:
        """Tell the watchdog which PID file to act on when the pipe closes (once).

        Raises:
            OSError: the watchdog is gone (its pipe is broken) or was closed or armed already.
        """
        if self._pipe_w is None or self._armed:
            raise OSError(f"the lifeline watchdog (pid {self.pid}) was {'armed' if self._armed else 'closed'} already")
        message = os.fsencode(os.path.abspath(path)) + b"\n"
        while message:
            message = message[os.write(self._pipe_w, message):]
        self._armed = True

    def close(self, run_id: str = "") -> None:
        """Close the pipe (the watchdog acts on its PID file, if any is left, and exits) and
        reap it, killing it after 5 s (idempotent)."""
        if self._pipe_w is not None:
            os.close(self._pipe_w)
            self._pipe_w = None
        if self.proc.returncode is None and not wait_exited(self.proc, _EXIT_TIMEOUT_S):
            log.warning("Run %s: the lifeline watchdog (pid %d) did not exit; killing it.", run_id, self.proc.pid)
            self.proc.kill()
            self.proc.wait()
