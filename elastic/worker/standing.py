"""What a worker knows about its own training state between formations, for the arrival it
tells its peers: the round and generation it last formed, and what it has seen since.

Pure bookkeeping (no I/O); the decision is :func:`elastic.worker.decisions.holds_newest`.
"""

from __future__ import annotations

from elastic.worker.decisions import Standing, holds_newest

__all__ = ["StandingBook"]


class StandingBook:
    """Updated as the worker forms, is left out, loses a group and leaves a round."""

    def __init__(self) -> None:
        self.formed_round = -1
        self.formed_generation = 0
        self._left_out = False
        self._unclean = False
        self._departed_clean = False

    def formed(self, round_number: int, generation: int) -> None:
        """It formed ``generation`` of ``round_number`` and healed: it holds what the group holds."""
        self.formed_round, self.formed_generation = round_number, generation
        self._left_out = self._unclean = self._departed_clean = False

    def left_out(self) -> None:
        """A generation formed without it."""
        self._left_out = True

    def lost(self, stalled: bool) -> None:
        """Its group was lost; ``stalled``: after a stall (see :class:`~elastic.worker.errors.CollectiveFailed`)."""
        self._unclean = self._unclean or stalled

    def departed(self, clean: bool) -> None:
        """It left its round for a newer one; ``clean``: it ended the round's generations and none
        had formed without it (:func:`elastic.worker.refill.leave_round`)."""
        self._departed_clean = clean

    def renumbered(self) -> None:
        """The rounds were numbered anew: the round it formed says nothing about the new numbering."""
        self.formed_round = -1

    def holds(self, target_round: int) -> bool:
        """Whether it arrives at a generation of ``target_round`` holding the newest state."""
        return holds_newest(Standing(target_round, self.formed_round, self._left_out, self._unclean,
                                     self._departed_clean))
