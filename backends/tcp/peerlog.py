"""The store server's log lines that peers cause: rate-limited, and written off the event loop.

A flood of bad connections once wrote one line each (215,867 lines, 30 MiB in 20 s), and with
the store's stderr a pipe nobody read, the event loop blocked in that write and every client
timed out. :class:`PeerLog` writes each kind of line (a bad handshake, a wrong token, a peer
dropped, ...) at most once per interval, saying how many like it it left out, and hands the
lines through a bounded queue to a daemon thread: a full pipe blocks that thread only, and
lines beyond the queue are dropped (the next line says how many).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

__all__ = ["LOG_INTERVAL_S", "PeerLog"]

LOG_INTERVAL_S = 10.0
"""Seconds between two lines of one kind."""

_QUEUE_LINES = 64


@dataclass
class _Kind:
    logged_at: float
    left_out: int = 0


class PeerLog:
    """Rate-limited, non-blocking log lines for one server; :meth:`note` from the event loop.

    Args:
        logger: where the lines go (from the writer thread).
        interval: seconds between two lines of one kind.
        clock: monotonic clock (injectable for tests).
    """

    def __init__(self, logger: logging.Logger, *, interval: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._kinds: dict[str, _Kind] = {}
        self._queue: queue.Queue[tuple[int, str, tuple[object, ...]] | None] = queue.Queue(_QUEUE_LINES)
        self._dropped = 0
        self._writer: threading.Thread | None = None
        self._lock = threading.Lock()

    def note(self, kind: str, level: int, message: str, *args: object) -> None:
        """Log ``message % args`` unless a line of ``kind`` went out less than an interval ago
        (then count it, for the next line of that kind). Never blocks."""
        if not self._logger.isEnabledFor(level):
            return
        now = self._clock()
        seen = self._kinds.get(kind)
        if seen is not None and now - seen.logged_at < self._interval:
            seen.left_out += 1
            return
        if seen is not None and seen.left_out:
            message += f" (and {seen.left_out} more like it in the last {self._interval:.0f} s)"
        self._kinds[kind] = _Kind(now)
        if self._dropped:
            message += f" ({self._dropped} earlier log lines dropped: the log is not being read fast enough)"
        try:
            self._queue.put_nowait((level, message, args))
            self._dropped = 0
        except queue.Full:
            self._dropped += 1
            return
        self._ensure_writer()

    def close(self, timeout: float = 1.0) -> None:
        """Write what is queued (waiting at most ``timeout`` seconds) and stop the writer."""
        writer = self._writer
        if writer is None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return  # the writer is stuck on a full pipe: it is a daemon, leave it
        writer.join(timeout)
        with self._lock:
            self._writer = None

    def _ensure_writer(self) -> None:
        with self._lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write, name="elastic-store-log", daemon=True)
                self._writer.start()

    def _write(self) -> None:
        while (item := self._queue.get()) is not None:
            level, message, args = item
            self._logger.log(level, message, *args)
