"""What a worker tells about its recoveries: a :class:`Recovery` value per re-formed group (kept
and logged by the :class:`Reporter`), and (optionally) one line per event on ``ELASTIC_READY_FD``
for the agent (the format and what each event means: :mod:`elastic.worker.rounds`,
:class:`~elastic.worker.rounds.ReadyEvent`).

Writes never block training: the pipe is non-blocking, a full pipe drops the line (with one
warning), and a closed one (the agent is gone) is ignored.
"""

from __future__ import annotations

import collections
import enum
import logging
import os
from dataclasses import dataclass

from elastic.worker.heal import HealRole
from elastic.worker.rounds import Ready, ReadyEvent, Round, encode_ready_line

log = logging.getLogger(__name__)

__all__ = ["Cause", "ReadyWriter", "Recovery", "Reporter"]

KEPT_RECOVERIES = 1000


class Cause(enum.Enum):
    """Why a group was formed."""

    START = "start"
    ROUND = "round"
    """A newer round arrived and the group in use was healthy."""
    LOST = ReadyEvent.LOST.value
    """The group in use was lost (a collective failed or was abandoned): the worker told the
    agent so on the ready pipe, and names the recovery after it with the same word."""
    REGROUP = "regroup"
    """A rank arrived after the group in use formed without it, and moved the round to a new
    generation to join (:mod:`elastic.worker.regroup`): the healthy group was left at a step boundary."""


@dataclass(frozen=True)
class Recovery:
    """One formed group as this worker saw it. Times are ``time.monotonic()`` seconds.

    ``began`` is when this worker started forming (for :attr:`Cause.LOST`, when it learnt the
    group was lost); ``round_arrived`` when the round it formed reached the pipe (``None`` for
    the round from the environment).
    """

    round: int
    cause: Cause
    step: int
    steps_before: tuple[int, ...]
    role: HealRole
    nbytes: int
    began: float
    round_arrived: float | None
    formed: float
    healed: float
    attempts: int
    hung_works: int
    """Works of abandoned groups still running (hung on a frozen peer) after this recovery."""
    generation: int = 0
    """The round's generation formed (:mod:`elastic.worker.refill`; 0: as the agent published it)."""
    members: tuple[int, ...] = ()
    """The round ranks that formed the group (all of the round's, or the subset that was there)."""


class ReadyWriter:
    """Non-blocking ready lines to the agent on ``fd``."""

    def __init__(self, fd: int, label: str) -> None:
        self._fd = fd
        self._label = label
        self._warned = False
        os.set_blocking(fd, False)
        os.set_inheritable(fd, False)

    def write(self, ready: Ready) -> None:
        try:
            os.write(self._fd, encode_ready_line(ready))
        except BlockingIOError:
            if not self._warned:
                log.warning("%s: the ready pipe is full; dropped the %s line for round %d", self._label, ready.event.value,
                            ready.round)
                self._warned = True
        except OSError:  # EPIPE/EBADF: the agent is gone; the round pipe will say so
            pass

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


class Reporter:
    """Keeps the last :data:`KEPT_RECOVERIES` recoveries, logs each, and writes the ready lines
    (when the worker has a ready pipe, ``ready_fd``)."""

    def __init__(self, ready_fd: int | None, label: str) -> None:
        self.recoveries: collections.deque[Recovery] = collections.deque(maxlen=KEPT_RECOVERIES)
        """The last groups this worker formed, oldest first."""
        self._ready = None if ready_fd is None else ReadyWriter(ready_fd, label)

    def tell(self, event: ReadyEvent, round_: Round, step: int) -> None:
        """Tell the agent ``event`` for ``round_`` (this worker's rank there) at ``step``."""
        if self._ready is not None:
            self._ready.write(Ready(event, round_.round, round_.rank, step))

    def formed(self, recovery: Recovery, round_: Round, where: str) -> None:
        """Keep and log ``recovery``, of ``round_``, and tell the agent (``where`` names the worker)."""
        self.recoveries.append(recovery)
        log.info("%s: formed round %d generation %d (%s) with %d of %d ranks at step %d in %.3fs; heal: %s, %d bytes; "
                 "%d abandoned work(s) still run", where, recovery.round, recovery.generation, recovery.cause.value,
                 len(recovery.members) or round_.world_size, round_.world_size, recovery.step,
                 recovery.healed - recovery.began, recovery.role.value, recovery.nbytes, recovery.hung_works)
        self.tell(ReadyEvent.FORMED, round_, recovery.step)

    def close(self) -> None:
        if self._ready is not None:
            self._ready.close()
