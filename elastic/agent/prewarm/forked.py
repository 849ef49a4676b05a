"""A worker forked by a template, driven like the ``subprocess.Popen`` the rest of the agent knows."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import IO

__all__ = ["ForkedWorker"]


class ForkedWorker:
    """A worker forked by a template, driven like ``subprocess.Popen``.

    Its exit code comes from the template (which reaps it), in ``Popen.returncode``'s
    convention: ``-N`` for a signal. ``stdout``/``stderr`` are the read ends of piped streams.
    """

    def __init__(self, args: list[str], stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        self.args = args
        self.stdout = stdout
        self.stderr = stderr
        self.pid = -1
        self.returncode: int | None = None
        self._done = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, once the template reported it.

        Raises:
            subprocess.TimeoutExpired: not within ``timeout`` seconds.
        """
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._done.set()
