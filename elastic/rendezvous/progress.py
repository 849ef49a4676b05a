"""Progress lines while a node waits in a rendezvous: what it waits for, and for how long.

A node that waits for others used to say nothing until the join timeout. The handler now
takes a :class:`WaitSnapshot` as its counts change (and every interval, when it reads them)
and hands it to a :class:`ProgressReporter`, which decides when a line is due
(:func:`line_due`: after a short grace, on every change, at least every ``interval``) and
emits :func:`format_progress` of it. A member of the last round that is gone for good (its
key vanished: see :mod:`elastic.rendezvous.departures`) is no longer expected: the first line
after it is found names it as lost, with why, and the later ones do not. Pure functions and an
injectable clock; no I/O here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import AbstractSet, Callable

PROGRESS_INTERVAL = 10.0
"""Seconds between lines while nothing changes."""
PROGRESS_GRACE = 2.0
"""No line in the first seconds of a wait: most rounds close sooner, and say so themselves."""
CHANGE_GAP = 1.0
"""At most one line per this many seconds for changes (a burst of joins gives one line)."""
MAX_LISTED = 8
"""At most this many expected node ids are named; the rest are counted."""


@dataclass(frozen=True)
class LostNode:
    """A member of the last round that is gone for good, and why (a sentence)."""

    node_id: str
    why: str


@dataclass(frozen=True)
class WaitSnapshot:
    """What a waiting node knows about the round it waits for.

    Attributes:
        run_id: the run.
        node_id: the waiting node.
        round: the round being formed.
        joined: nodes joined so far (None: not known to this node right now).
        min_nodes, max_nodes: the round closes at ``min_nodes`` (after the last call) to ``max_nodes``.
        expected: members of the previous round that have not joined yet and still may (their
            key of that round exists; None: unknown, e.g. the first round, or a node that does
            not see the joiners).
        seconds_left: until the join timeout (``math.inf``: none, e.g. a spare).
        lost: members of the previous round whose key is gone (not expected any more).
        closes_in: once ``min_nodes`` joined, seconds until the closer closes the round (the end
            of the last call, or of the rejoin window): known to the closer only (None).
        last_call: the last call's length: the most a non-closer waits once ``min_nodes`` joined.
    """

    run_id: str
    node_id: str
    round: int
    joined: int | None
    min_nodes: int
    max_nodes: int
    expected: tuple[str, ...] | None
    seconds_left: float
    lost: tuple[LostNode, ...] = ()
    closes_in: float | None = None
    last_call: float | None = None

    @property
    def counts(self) -> tuple[int, int | None, tuple[str, ...] | None, frozenset[str]]:
        """What a change is judged on (not the time left, which always changes)."""
        return self.round, self.joined, self.expected, frozenset(node.node_id for node in self.lost)

    def counts_text(self) -> str:
        """``J of MIN`` (or ``? of MIN`` when the count is unknown)."""
        return f"{'?' if self.joined is None else self.joined} of {self.min_nodes}"


def format_progress(snapshot: WaitSnapshot, named: AbstractSet[str] = frozenset()) -> str:
    """The progress line, e.g. ``Rendezvous job-1 round 0 (node a): waiting for nodes: 1 of at
    least 2 nodes joined (at most 4); still expected: b; 587 s left before the join timeout``.

    Lost members not in ``named`` (said by an earlier line) are named with why:
    ``...; lost: c (its agent shut down); 587 s left ...``. Once ``min_nodes`` joined, the round
    closes at the end of the last call, not at the join timeout: the line ends with that
    (``the round closes in 27 s, at the end of the last call``).
    """
    s = snapshot
    size = f"{s.min_nodes}" if s.min_nodes == s.max_nodes else f"at least {s.min_nodes}"
    most = "" if s.min_nodes == s.max_nodes else f" (at most {s.max_nodes})"
    if s.joined is None:
        counts = f"waiting for {size} nodes{most} to join"
    elif s.joined >= s.min_nodes:
        counts = f"{s.joined} of {size} nodes joined{most}"
    else:
        counts = f"waiting for nodes: {s.joined} of {size} nodes joined{most}"
    parts = [f"Rendezvous {s.run_id} round {s.round} (node {s.node_id}): {counts}"]
    if s.expected:
        listed = ", ".join(s.expected[:MAX_LISTED])
        more = f" and {len(s.expected) - MAX_LISTED} more" if len(s.expected) > MAX_LISTED else ""
        parts.append(f"still expected: {listed}{more}")
    news = [node for node in s.lost if node.node_id not in named]
    if news:
        shown = ", ".join(f"{node.node_id} ({node.why})" for node in news[:MAX_LISTED])
        more = f" and {len(news) - MAX_LISTED} more" if len(news) > MAX_LISTED else ""
        parts.append(f"lost: {shown}{more}")
    parts.append(_when(s))
    return "; ".join(parts)


def _when(s: WaitSnapshot) -> str:
    """What ends the wait, and when: the last call once enough joined, else the join timeout."""
    if s.joined is not None and s.joined >= s.min_nodes and not math.isinf(s.seconds_left):
        if s.closes_in is not None:
            return f"the round closes in {max(s.closes_in, 0.0):.0f} s, at the end of the last call"
        within = f" (within {s.last_call:g} s)" if s.last_call is not None else ""
        return f"the round closes at the end of the last call{within}"
    if math.isinf(s.seconds_left):
        return "no join timeout (a spare waits for room)"
    return f"{max(s.seconds_left, 0.0):.0f} s left before the join timeout"


def line_due(now: float, started: float, last_line_at: float | None, changed: bool, *,
             interval: float = PROGRESS_INTERVAL, grace: float = PROGRESS_GRACE,
             gap: float = CHANGE_GAP) -> bool:
    """Whether a progress line is due now.

    ``started``: when the wait began; ``last_line_at``: when the last line was emitted (None:
    none yet); ``changed``: the counts differ from the last line's.
    """
    if now < started + grace:
        return False
    if last_line_at is None:
        return True
    if changed:
        return now >= last_line_at + gap
    return now >= last_line_at + interval


class ProgressReporter:
    """Emits progress lines for one wait; give it every snapshot, it decides when to speak.

    Args:
        emit: called with each line (e.g. ``log.info``).
        clock: monotonic clock (injectable).
    """

    def __init__(self, emit: Callable[[str], None], *, clock: Callable[[], float] = time.monotonic,
                 interval: float = PROGRESS_INTERVAL, grace: float = PROGRESS_GRACE,
                 gap: float = CHANGE_GAP) -> None:
        self._emit = emit
        self._clock = clock
        self._interval, self._grace, self._gap = interval, grace, gap
        self._started = clock()
        self._last_line_at: float | None = None
        self._last_line_counts: tuple | None = None
        self._named: set[str] = set()  # lost members a line already named
        self.last: WaitSnapshot | None = None
        """The latest snapshot given (also when no line was emitted)."""

    def update(self, snapshot: WaitSnapshot) -> bool:
        """Note ``snapshot``; emit its line if one is due. Returns whether a line was emitted."""
        self.last = snapshot
        now = self._clock()
        changed = snapshot.counts != self._last_line_counts
        if not line_due(now, self._started, self._last_line_at, changed,
                        interval=self._interval, grace=self._grace, gap=self._gap):
            return False
        self._last_line_at = now
        self._last_line_counts = snapshot.counts
        self._emit(format_progress(snapshot, self._named))
        self._named.update(node.node_id for node in snapshot.lost)
        return True

    def next_due(self) -> float:
        """The clock time by which the waiter should look again (wake up from its watch)."""
        if self._last_line_at is None:
            return self._started + self._grace
        pending_change = self.last is not None and self.last.counts != self._last_line_counts
        return self._last_line_at + (self._gap if pending_change else self._interval)

    def due(self) -> bool:
        """Whether a line could be due now (so fresh counts are worth a read)."""
        return self._clock() >= self.next_due()
