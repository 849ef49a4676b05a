"""Collectives in flight on one group, each completed by the collective or by an interrupt.

Every collective that live recovery waits on (its own, the user's through
:meth:`LiveTraining.all_reduce`, DDP's buckets through the comm hook) is launched with
``async_op=True`` and handed to the group's :class:`OpRegistry`, which returns a
:class:`torch.futures.Future` that completes with whichever comes first:

* the collective's own result or error (an error becomes :class:`CollectiveFailed`), or
* an interrupt from the round watcher (:class:`Superseded`), when a newer round is pending and
  the collective has been in flight for longer than the grace.

A collective that completes after a stall is first judged by the :class:`CommitFence` (on a
thread of its own, not gloo's): its result is used only once the peers cannot have gone on
without this rank (see :mod:`elastic.worker.fence`).

Waiting on that future releases the GIL and returns as soon as either happens, so a worker
never stays hung on a frozen peer once the agent has published the next round. The gloo work
left behind keeps its thread and sockets until the group's own timeout ends it; the registry
hands such works to a :class:`Graveyard`, which keeps them referenced until they end (dropping
the last reference of a running gloo work joins its thread) and waits for them at exit
(gloo aborts a process that exits with one still running).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any, Callable, Sequence

import torch

from elastic.worker.decisions import FenceVerdict
from elastic.worker.errors import CollectiveFailed, GroupLost, Superseded
from elastic.worker.fence import CommitFence

log = logging.getLogger(__name__)

__all__ = ["Graveyard", "GuardedOp", "OpRegistry", "failed_future"]


def failed_future(error: BaseException) -> torch.futures.Future:
    """A future that is already failed with ``error``."""
    future: torch.futures.Future = torch.futures.Future()
    future.set_exception(error)
    return future


class GuardedOp:
    """One launch (one or more works) and the future that settles first."""

    def __init__(self, works: Sequence[Any], started: float) -> None:
        self.works = tuple(works)
        self.started = started
        self.future: torch.futures.Future = torch.futures.Future()
        self._lock = threading.Lock()
        self._settled = False

    def settle(self, value: Any = None, error: BaseException | None = None) -> bool:
        """Complete the future unless it is already complete; ``True`` when this call did."""
        with self._lock:
            if self._settled:
                return False
            self._settled = True
        if error is None:
            self.future.set_result(value)
        else:
            self.future.set_exception(error)
        return True

    @property
    def settled(self) -> bool:
        return self._settled

    def wait(self) -> Any:
        """The result; raises the :class:`GroupLost` the op settled with."""
        return self.future.wait()


class OpRegistry:
    """The collectives in flight on one group, and the first loss seen on it.

    Args:
        round_number: the group's round (named in the errors).
        label: names the run and rank in log lines.
    """

    def __init__(self, round_number: int, label: str, clock: Callable[[], float] = time.monotonic,
                 fence: CommitFence | None = None) -> None:
        self.round = round_number
        self._label = label
        self._clock = clock
        self._fence = fence
        self._last_ok = clock()  # when the last collective completed unsuspected (or the group formed)
        self._lock = threading.Lock()
        self._ops: set[GuardedOp] = set()
        self._closed: GroupLost | None = None
        self.failure: GroupLost | None = None
        """The first loss of this group: set before any waiter sees an error."""

    def launch(self, works: Sequence[Any], value: Callable[[], Any] = lambda: None) -> GuardedOp:
        """Guard ``works`` (already launched, ``async_op=True``); the op's value is ``value()`` once all succeed.

        A single work with a future completes through its callback; works without one (gloo's
        point-to-point works) are waited on by a helper thread.
        """
        op = GuardedOp(works, self._clock())
        with self._lock:
            closed = self._closed or self.failure
            if closed is None:
                self._ops.add(op)
        if closed is not None:
            op.settle(error=closed)
            return op
        future = None
        if len(op.works) == 1:
            try:
                future = op.works[0].get_future()
            except RuntimeError:  # "Work::getFuture not implemented" (gloo send/recv)
                future = None
        if future is not None:
            future.add_done_callback(lambda done: self._finish(op, value, done.value))
        else:
            threading.Thread(target=self._finish, args=(op, value, lambda: [w.wait() for w in op.works]),
                             name="elastic-op-waiter", daemon=True).start()
        return op

    def _finish(self, op: GuardedOp, value: Callable[[], Any], outcome: Callable[[], Any]) -> None:
        try:
            outcome()
        except Exception as error:  # the collective's own failure: a peer closed, or it timed out
            fence = self._fence
            stalled = fence is not None and fence.suspect(op.started, self._clock(), self._last_ok)
            lost = CollectiveFailed(f"round {self.round}: a collective failed: {_first_line(error)}", self.round, stalled)
            # Its traceback is this frame, which holds the op and its works, and so the group's
            # sockets and threads for as long as anything holds the error: drop it.
            lost.__cause__ = error.with_traceback(None)
            self._record(lost)
            op.settle(error=lost)
        else:
            now = self._clock()
            fence = self._fence
            if fence is not None and not op.settled and fence.suspect(op.started, now, self._last_ok):
                threading.Thread(target=self._fenced, args=(fence, op, value, now), name="elastic-commit-fence",
                                 daemon=True).start()
                return
            self._last_ok = now
            _settle_value(op, value)
        with self._lock:
            self._ops.discard(op)

    def _fenced(self, fence: CommitFence, op: GuardedOp, value: Callable[[], Any], completed: float) -> None:
        """Settle a collective that completed after a stall as the fence judges it."""
        if fence.judge(self.round, completed) is FenceVerdict.COMMIT:
            self._last_ok = self._clock()
            _settle_value(op, value)
        else:
            lost = Superseded(f"round {self.round}: a collective completed after a stall and the round may have "
                              "gone on without this rank; its result is dropped", self.round)
            self._record(lost)
            op.settle(error=lost)
        with self._lock:
            self._ops.discard(op)

    def _record(self, lost: GroupLost) -> None:
        with self._lock:
            if self.failure is None:
                self.failure = lost

    def interrupt_older_than(self, cutoff: float, round_number: int) -> int:
        """Abandon the ops launched at or before ``cutoff`` because round ``round_number`` is pending."""
        with self._lock:
            due = [op for op in self._ops if op.started <= cutoff]
        if not due:
            return 0
        lost = Superseded(f"round {self.round}: abandoned a collective hung for over the grace; round {round_number} is pending", self.round)
        self._record(lost)
        return sum(op.settle(error=lost) for op in due)

    def abandon(self, reason: str) -> int:
        """Fail the ops in flight with :class:`CollectiveFailed` (``reason``: who saw the group
        fail); the number abandoned. For a peer that cannot reach this group's collectives."""
        lost = CollectiveFailed(f"round {self.round}: {reason}", self.round)
        self._record(lost)
        with self._lock:
            due = list(self._ops)
        return sum(op.settle(error=lost) for op in due)

    def close(self, reason: str) -> list[Any]:
        """Fail every op still in flight (no new launch succeeds) and return the works still running."""
        lost = Superseded(f"round {self.round}: the group was left ({reason})", self.round)
        with self._lock:
            self._closed = lost
            ops, self._ops = list(self._ops), set()
        for op in ops:
            op.settle(error=lost)
        if self.failure is not None:
            # Raised in the training thread, the failure's traceback holds frames that hold this
            # group: a reference cycle that would keep its threads and sockets until the next GC.
            self.failure.__traceback__ = None
        return [work for op in ops for work in op.works if not _completed(work)]


def _settle_value(op: GuardedOp, value: Callable[[], Any]) -> None:
    try:
        op.settle(value=value())
    except Exception as error:  # value() itself failed: report it to the waiter as it is
        op.settle(error=error)


def _completed(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except RuntimeError:
        return False


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:300]


class Graveyard:
    """Abandoned groups whose works still run (hung on a frozen peer), kept until those end.

    The group is kept too: dropping the last reference of a gloo group joins its worker
    threads, which would block the caller until the hung work times out. A grave is dropped
    (in :meth:`reap`, on the training thread) once all its works ended, when the join is
    immediate. Each work ends by the group's collective timeout at the latest, so at most a
    timeout's worth of abandoned groups is alive at once.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._graves: list[tuple[Any, list[Any]]] = []

    def bury(self, group: Any, works: Sequence[Any]) -> None:
        if works:
            self._graves.append((group, list(works)))
        self.reap()

    def reap(self) -> int:
        """Drop the groups whose works all ended; the number of works still running."""
        running = [(group, [work for work in works if not _completed(work)]) for group, works in self._graves]
        ended = len(self._graves) - sum(1 for _, works in running if works)
        self._graves = [(group, works) for group, works in running if works]
        if ended:
            del running
            gc.collect()  # a released group may still sit in a cycle; free its threads and sockets now
        return sum(len(works) for _, works in self._graves)

    def drain(self, timeout: float, sleep: Callable[[float], None] = time.sleep) -> int:
        """Wait up to ``timeout`` seconds for every work to end; the number still running."""
        deadline = self._clock() + timeout
        while self.reap() and self._clock() < deadline:
            sleep(0.05)
        return self.reap()
