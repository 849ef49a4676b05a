"""The round a live worker last formed, seen from the moment it loses or leaves it: its store
(the generation key), whether that store still answers, and what this worker's standing is.

A loss is a failure to report only when no peer left the group on purpose: the round's
generation moved (a peer already repairs it) or its generations were ended for a newer round
(:func:`elastic.worker.refill.leave_round`). Every look at the store here is bounded
(:data:`STORE_LOOK`): its master may be frozen or gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elastic.worker.refill import leave_round, read_generation
from elastic.worker.regroup import GenerationWatch, within
from elastic.worker.rounds import Round
from elastic.worker.standing import StandingBook

__all__ = ["STORE_LOOK", "FormedRound", "Settled"]

STORE_LOOK = 0.25
"""The longest a look at a round's store outside a formation may take: the generation after a
loss, the end of a round's generations when leaving it."""


@dataclass(frozen=True)
class Settled:
    """What the round's store says of a lost group: ``moved`` to a newer generation, or ``left``
    for a newer round (either: not a failure to report)."""

    moved: bool = False
    left: bool = False


class FormedRound:
    """The store and generation of the round last formed, the watch on its generation key, and
    this worker's standing (:class:`~elastic.worker.standing.StandingBook`)."""

    def __init__(self, watch: GenerationWatch | None) -> None:
        self.watch = watch
        self.standing = StandingBook()
        self.store: Any = None

    def formed(self, round_number: int, generation: int, store: Any) -> None:
        """A generation of ``round_number`` formed on ``store`` and healed; watch its key."""
        self.store = store
        self.standing.formed(round_number, generation)
        if self.watch is not None and store is not None:
            self.watch.watch(store, generation)

    def reachable(self) -> bool:
        """Whether the round last formed has a store that did not fail the watcher's last look."""
        return self.store is not None and not (self.watch is not None and self.watch.unreachable(self.store))

    def settle(self, round_: Round, superseded: bool, where: str) -> Settled:
        """What the store of ``round_`` (the round in use, whose group was lost) says now; nothing
        when it is not the round formed, the loss was a newer round's, or the store is gone."""
        formed = self.standing
        if superseded or not self.reachable() or formed.formed_round != round_.round:
            return Settled()
        state = within(STORE_LOOK, lambda: read_generation(self.store), "reading the round's generation", where)
        if state is None:
            return Settled()
        left = state.left_for is not None
        return Settled(moved=not left and state.number > formed.formed_generation, left=left)

    def depart(self, round_: Round, pending_round: int | None, where: str) -> None:
        """Before leaving ``round_`` for ``pending_round``: end the round's generations in its
        store, so the peers left behind wait for the newer round rather than train on without this
        rank, and learn whether one formed without it meanwhile."""
        standing = self.standing
        if pending_round is None or not self.reachable() or standing.formed_round != round_.round:
            standing.departed(False)
            return
        store, generation = self.store, standing.formed_generation
        clean = within(STORE_LOOK, lambda: leave_round(store, generation, round_.rank, round_.world_size,
                                                        pending_round),
                       f"ending round {round_.round}'s generations", where)
        standing.departed(clean is True)
