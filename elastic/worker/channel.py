"""The round pipe: split its bytes into bounded lines, keep the newest round, watch it in a thread.

Torch-free. The watcher is one daemon thread blocked in ``select`` on the pipe, so the training
loop's check at a step boundary is an attribute read (:attr:`RoundMailbox.pending`); the thread
is also what wakes a worker hung in a collective on a frozen peer: while a newer round is
pending it asks the current :class:`~elastic.worker.guard.OpRegistry` to abandon collectives
in flight for longer than the grace (:func:`elastic.worker.decisions.interrupt_due`). It keeps
the agent's lease renewals (:class:`~elastic.worker.rounds.Held`) and notices when this process
was frozen (it wakes at least every :data:`_TICK` s; a wake much later than that is a freeze),
for the commit fence (:mod:`elastic.worker.fence`).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from elastic.worker.decisions import RoundAction, decide_round
from elastic.worker.errors import RoundLineError
from elastic.worker.rounds import MAX_LINE_BYTES, Held, Round, parse_pipe_line

log = logging.getLogger(__name__)

__all__ = ["Arrival", "LineSplitter", "Overlong", "RoundMailbox", "RoundWatcher"]

_READ_BYTES = 64 * 1024
_PENDING_POLL = 0.02
"""While a round is pending, how often the watcher looks for collectives to abandon."""
_TICK = 0.25
"""The longest the watcher sleeps, so that a late wake shows a freeze of the process."""
FROZEN_AFTER = 1.0
"""A wake this much later than asked for means the process was frozen (SIGSTOP, a suspended VM)."""


@dataclass(frozen=True)
class Overlong:
    """A line longer than the bound was dropped (its bytes up to the next newline)."""

    size: int


class LineSplitter:
    """Bytes in, complete lines out, never holding more than ``limit`` bytes of one line.

    A line over the limit is dropped up to its newline and reported once as :class:`Overlong`.
    """

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._dropping = 0  # bytes dropped of the current overlong line; 0 when not dropping

    def feed(self, data: bytes) -> list[bytes | Overlong]:
        out: list[bytes | Overlong] = []
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            piece = data[start:end]
            if self._dropping:
                self._dropping += len(piece)
            elif len(self._buffer) + len(piece) > self._limit:
                self._dropping = len(self._buffer) + len(piece)
                self._buffer.clear()
            else:
                self._buffer += piece
            if newline < 0:
                break
            if self._dropping:
                out.append(Overlong(self._dropping))
                self._dropping = 0
            elif self._buffer.strip():
                out.append(bytes(self._buffer))
            self._buffer.clear()
            start = newline + 1
        return out


@dataclass(frozen=True)
class Arrival:
    """A round read from the pipe, and when (``time.monotonic()``)."""

    record: Round
    at: float


def _identity(round_: Round) -> tuple[int, tuple[str, int]]:
    return round_.round, (round_.master_addr, round_.master_port)


class RoundMailbox:
    """The newest round published and not yet adopted, and whether the pipe reached EOF.

    ``pending`` is read without the lock (one attribute read, for the hot path); every change
    happens under the condition, which :meth:`wait` sleeps on.
    """

    def __init__(self, current: int, store: tuple[str, int] | None = None) -> None:
        self._cond = threading.Condition()
        self.current = current
        self._current_id = (current, store)  # a round is its number and its store's address
        self.pending: Arrival | None = None
        self.eof = False
        self.held: float | None = None
        """Before when the store cannot have dropped this node (the agent's newest lease renewal)."""
        self.froze_at: float | None = None
        """When this process was last seen waking from a freeze."""

    def offer(self, round_: Round, now: float) -> RoundAction:
        with self._cond:
            pending = None if self.pending is None else self.pending.record
            incoming = _identity(round_)
            known = incoming == self._current_id or (pending is not None and incoming == _identity(pending))
            action = decide_round(self.current, None if pending is None else pending.round, round_.round, known)
            if action in (RoundAction.NEWER, RoundAction.RENUMBERED):
                self.pending = Arrival(round_, now)
                self._cond.notify_all()
            return action

    def offer_held(self, held: Held) -> None:
        """The agent renewed its lease: keep the newest ``until``."""
        with self._cond:
            if self.held is None or held.until > self.held:
                self.held = held.until
                self._cond.notify_all()

    def note_freeze(self, at: float) -> None:
        with self._cond:
            self.froze_at = at
            self._cond.notify_all()

    def wait_news(self, timeout: float) -> None:
        """Sleep until anything is offered (a round, a renewal, EOF) or ``timeout`` seconds passed."""
        with self._cond:
            self._cond.wait(timeout)

    def close(self) -> None:
        """The pipe is at EOF (or there never was one): no round will come."""
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    def take(self) -> Arrival | None:
        """The pending round, now the current one; ``None`` when none is pending."""
        with self._cond:
            arrival = self.pending
            if arrival is not None:
                self.current, self._current_id = arrival.record.round, _identity(arrival.record)
                self.pending = None
            return arrival

    def wait(self, timeout: float) -> None:
        """Sleep until a round is pending, the pipe is at EOF, or ``timeout`` seconds passed."""
        with self._cond:
            if self.pending is None and not self.eof:
                self._cond.wait(timeout)


class Interruptible(Protocol):
    def interrupt_older_than(self, cutoff: float, round_number: int) -> int: ...


class RoundWatcher:
    """A daemon thread that reads round lines from ``fd`` into ``mailbox``.

    Garbage gets one warning per line and is ignored; EOF closes the mailbox (the agent is
    gone; training goes on until a collective fails). ``registry`` returns the registry of the
    group in use (or ``None``), whose collectives are abandoned while a newer round is pending.
    """

    def __init__(
        self,
        fd: int,
        mailbox: RoundMailbox,
        registry: Callable[[], Interruptible | None],
        grace: float,
        label: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fd = fd
        self._mailbox = mailbox
        self._registry = registry
        self._grace = grace
        self._label = label
        self._clock = clock
        self._splitter = LineSplitter()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="elastic-round-watcher", daemon=True)
        os.set_inheritable(fd, False)  # exec'd children must not hold the agent's pipe open

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and close the pipe's read end (idempotent)."""
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass
        if self._thread.is_alive():
            self._thread.join(5.0)
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def _run(self) -> None:
        watching = [self._fd, self._wake_r]
        last = self._clock()
        try:
            while True:
                timeout = _PENDING_POLL if self._mailbox.pending is not None else _TICK
                ready, _, _ = select.select(watching, [], [], timeout)
                woke = self._clock()
                if woke - last > _TICK + FROZEN_AFTER:
                    self._mailbox.note_freeze(woke)
                last = woke
                if self._wake_r in ready:
                    return
                if self._fd in ready and not self._read():
                    watching.remove(self._fd)
                if self._mailbox.pending is not None:
                    self._interrupt()
        except Exception:  # never die silently: a dead watcher means hung collectives stay hung
            log.exception("%s: the round watcher failed; new rounds will not be seen", self._label)
            self._mailbox.close()
        finally:
            try:
                os.close(self._fd)
            except OSError:
                pass

    def _read(self) -> bool:
        """Read what is there; ``False`` at EOF."""
        try:
            data = os.read(self._fd, _READ_BYTES)
        except BlockingIOError:
            return True
        except OSError as error:
            log.warning("%s: reading the round pipe failed (%s); treating it as closed", self._label, error)
            data = b""
        if not data:
            log.warning("%s: the round pipe reached EOF (the agent is gone); training goes on until a collective fails", self._label)
            self._mailbox.close()
            return False
        for item in self._splitter.feed(data):
            self._handle(item)
        return True

    def _handle(self, item: bytes | Overlong) -> None:
        if isinstance(item, Overlong):
            log.warning("%s: ignored a %d-byte line on the round pipe (over the %d-byte limit)", self._label, item.size, MAX_LINE_BYTES)
            return
        try:
            parsed = parse_pipe_line(item)
        except RoundLineError as error:
            log.warning("%s: ignored a bad line on the round pipe (%s): %r", self._label, error, item[:200])
            return
        if isinstance(parsed, Held):
            self._mailbox.offer_held(parsed)
            return
        round_ = parsed
        action = self._mailbox.offer(round_, self._clock())
        if action is RoundAction.NEWER:
            log.info("%s: round %d published (rank %d of %d)", self._label, round_.round, round_.rank, round_.world_size)
        elif action is RoundAction.RENUMBERED:
            log.warning("%s: round %d published, a lower number than round %d in use: the rendezvous numbers its "
                        "rounds anew (were the job's keys deleted?); forming it", self._label, round_.round,
                        self._mailbox.current)

    def _interrupt(self) -> None:
        pending = self._mailbox.pending
        registry = self._registry()
        if pending is None or registry is None:
            return
        count = registry.interrupt_older_than(self._clock() - self._grace, pending.record.round)
        if count:
            log.warning("%s: abandoned %d collective(s) in flight for over %.1fs: round %d is pending",
                        self._label, count, self._grace, pending.record.round)
