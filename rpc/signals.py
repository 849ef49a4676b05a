"""Exit on SIGTERM within a bound, even while the main thread waits inside an RPC.

The agent stops a worker group with SIGTERM, then SIGKILL after its shutdown timeout. A plain
Python handler is no good here: CPython runs it in the main thread only between bytecodes, so
a worker blocked in ``rpc_sync`` (a C++ wait) runs it only when the RPC returns or times out
(measured with torch 2.13: a 12 s remote call delayed the handler by 12 s). So the handler is
installed together with a *wakeup fd*: CPython's C-level handler writes the signal number to a
pipe as the signal arrives, and a watcher thread reading it shuts RPC down non-gracefully
(bounded by ``timeout``) and exits with ``128 + SIGTERM``. The Python handler does the same if
it happens to run first; whichever comes first wins, once.

If another wakeup fd is already set (an asyncio loop in the main thread owns it), only the
Python handler is installed and the limitation above applies; that is logged.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Callable

log = logging.getLogger(__name__)

__all__ = ["SigtermGuard"]


class SigtermGuard:
    """On SIGTERM: run ``on_signal`` for at most ``timeout`` seconds, then ``os._exit(128 + 15)``.

    Args:
        on_signal: the local shutdown (must not wait for other workers).
        timeout: seconds ``on_signal`` may take before the process exits regardless.
        describe: who we are, for the log line (e.g. ``"run job-1 worker trainer0"``).
        exit: how to leave (``os._exit``; injectable for tests).
    """

    def __init__(
        self,
        on_signal: Callable[[], None],
        timeout: float,
        describe: str = "",
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        self._on_signal = on_signal
        self._timeout = timeout
        self._describe = describe
        self._exit = exit
        self._fired = threading.Lock()
        self._installed = False
        self._previous_handler: signal.Handlers | Callable | int | None = None
        self._previous_fd = -1
        self._pipe: tuple[int, int] | None = None
        self._watcher: threading.Thread | None = None

    @property
    def installed(self) -> bool:
        return self._installed

    def install(self) -> bool:
        """Install the handler; returns False (and does nothing) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("%s: not in the main thread; SIGTERM will not shut RPC down first", self._describe)
            return False
        self._previous_handler = signal.signal(signal.SIGTERM, self._python_handler)
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        if previous != -1:
            signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            log.warning("%s: a wakeup fd is already set; SIGTERM is handled between bytecodes only",
                        self._describe)
        else:
            self._pipe = (read_fd, write_fd)
            self._watcher = threading.Thread(target=self._watch, args=(read_fd,), name="rpc-sigterm", daemon=True)
            self._watcher.start()
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Restore the previous handler and wakeup fd (main thread only; no-op if not installed)."""
        if not self._installed or threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, self._previous_handler if self._previous_handler is not None else signal.SIG_DFL)
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous_fd)
            read_fd, write_fd = self._pipe
            os.close(write_fd)  # the watcher reads EOF and returns; it closes the read end
            self._pipe = None
        self._installed = False

    # -- the two paths to _terminate ------------------------------------------------------------
    def _python_handler(self, signum: int, frame: object) -> None:
        self._terminate()

    def _watch(self, read_fd: int) -> None:
        try:
            while True:
                data = os.read(read_fd, 64)
                if not data:
                    return
                if int(signal.SIGTERM) in data:
                    self._terminate()
        except OSError:
            return
        finally:
            try:
                os.close(read_fd)
            except OSError:
                pass

    def _terminate(self) -> None:
        if not self._fired.acquire(blocking=False):
            return  # the other path got here first and is exiting
        log.warning("%s: SIGTERM; shutting RPC down without waiting for peers (at most %.1fs), then exiting",
                    self._describe, self._timeout)
        worker = threading.Thread(target=self._run_on_signal, name="rpc-sigterm-shutdown", daemon=True)
        worker.start()
        worker.join(self._timeout)
        if worker.is_alive():
            log.warning("%s: the local RPC shutdown took longer than %.1fs; exiting anyway",
                        self._describe, self._timeout)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        self._exit(128 + signal.SIGTERM)

    def _run_on_signal(self) -> None:
        try:
            self._on_signal()
        except Exception:  # the process is exiting; the failure is only worth a line
            log.exception("%s: the local RPC shutdown failed", self._describe)
