"""Notice, while training, that the round's generation moved past the group in use.

A rank that arrives after its generation formed without it (a replacement that took long to
start, a survivor that was slow) opens the next generation as a regroup
(:mod:`elastic.worker.refill`). Nothing fails on the members' side, so they learn of it from
the store: one daemon thread per worker reads the round's generation key every
:data:`WATCH_INTERVAL` seconds (one store round trip) while a group is in use, and the training
loop's check at a step boundary is an attribute read (:attr:`GenerationWatch.moved`). The
members then leave their group at that boundary and form the new generation with the joiner.

Also :func:`within`, a store call bounded in time, for the looks a worker takes at a round's
store outside a formation (its master may be frozen or gone). Torch-free.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, TypeVar

from elastic.worker.leftover import start_call
from elastic.worker.refill import GenerationState, read_generation

log = logging.getLogger(__name__)

__all__ = ["GenerationWatch", "WATCH_INTERVAL", "within"]

WATCH_INTERVAL = 0.1
"""Seconds between two reads of the generation key while a group is in use."""

T = TypeVar("T")


class GenerationWatch:
    """Reads the generation key of the group in use (``watch``) until it moves past that group's
    generation; then :attr:`moved` holds the newer state until :meth:`clear`. A round left for a
    newer one (a peer ended its generations) is not a move: the agent publishes that round."""

    def __init__(self, label: str, interval: float = WATCH_INTERVAL) -> None:
        self._label = label
        self._interval = interval
        self._cond = threading.Condition()
        self._target: tuple[Any, int] | None = None
        self._failed: Any = None  # the store whose last read failed
        self._stopped = False
        self.moved: GenerationState | None = None
        """The newer generation seen (None: none, or no group in use)."""
        self._thread = threading.Thread(target=self._run, name="elastic-generation-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def watch(self, store: Any, generation: int) -> None:
        """Watch ``store``'s generation key (a round's store, under its prefix) past ``generation``."""
        with self._cond:
            self._target, self.moved = (store, generation), None
            if self._failed is not store:  # only the store in use is asked about; keep no other alive
                self._failed = None

    def clear(self) -> None:
        """No group is in use: watch nothing, forget what was seen."""
        with self._cond:
            self._target, self.moved = None, None

    def unreachable(self, store: Any) -> bool:
        """Whether the last read of ``store`` failed (its master is gone: no need to look again;
        torch prints a warning with a stack for every failed store call). Known for the store
        watched last only: watching another forgets it."""
        return store is not None and self._failed is store

    def stop(self) -> None:
        with self._cond:
            self._stopped, self._target = True, None
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait(self._interval)
                if self._stopped:
                    return
                target = self._target
            if target is not None and self.moved is None:
                self._look(target)
            # Hold no store between looks: a store no longer watched (its client's socket) is
            # released when its user drops it, not at this thread's next look.
            target = None

    def _look(self, target: tuple[Any, int]) -> None:
        """One read of the watched generation key; sets :attr:`moved` if it moved past ``target``."""
        store, generation = target
        if self._failed is store:
            return
        try:
            state = read_generation(store)
        except (RuntimeError, ValueError) as error:  # the store is gone or holds garbage: a collective will tell
            with self._cond:
                if self._target is target or self._target is None:  # not for a store no longer watched
                    self._failed = store
            log.info("%s: cannot read the round's generation (%s); not watching it", self._label,
                     str(error).splitlines()[0] if str(error) else type(error).__name__)
            return
        if state.left_for is None and state.number > generation:
            with self._cond:
                if self._target is target:
                    self.moved = state
                    log.info("%s: the round moved to generation %d (%s); leaving generation %d at the next "
                             "step boundary", self._label, state.number, state.move.value, generation)


def within(seconds: float, call: Callable[[], T], what: str, label: str) -> T | None:
    """``call()``'s value if it returns within ``seconds``; None (logged) if it raises or takes longer
    (it then runs on in a tracked daemon thread, bounded by the store's own timeout, and is waited
    for at close: :mod:`elastic.worker.leftover`)."""
    look = start_call(call, name="elastic-store-look")
    if not look.wait(seconds):
        log.warning("%s: %s took over %gs; going on without it", label, what, seconds)
        return None
    if look.error is not None:
        error = look.error
        log.warning("%s: %s failed: %s", label, what, str(error).splitlines()[0] if str(error) else type(error).__name__)
        return None
    return look.value
