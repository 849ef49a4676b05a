"""What a worker has committed: its step counter, the round of its last commit, and the groups
that failed since.

Torch-free and pure (no I/O). The step and the round make the worker's
:class:`~elastic.worker.decisions.Mark`, which a heal compares across ranks; the failures count
towards ``LiveOptions.max_failed_rounds``.
"""

from __future__ import annotations

from elastic.worker.decisions import Mark
from elastic.worker.errors import GroupLost, Superseded

__all__ = ["Commits"]


class Commits:
    """The commit bookkeeping of one worker; see the module docstring."""

    def __init__(self) -> None:
        self._step = 0
        self._round = -1  # the round the last step was committed in (see decisions.Mark)
        self._failed = 0

    @property
    def step(self) -> int:
        """Steps committed so far."""
        return self._step

    @property
    def mark(self) -> Mark:
        return Mark(self._step, self._round)

    @property
    def failed_in_a_row(self) -> int:
        """Groups that failed since the last committed step."""
        return self._failed

    def commit(self, round_number: int) -> None:
        """One more step, committed in round ``round_number``."""
        self._step += 1
        self._round = round_number
        self._failed = 0

    def lose(self, lost: GroupLost) -> None:
        """The group in use was lost; a newer round (:class:`Superseded`) is not a failure of it."""
        if not isinstance(lost, Superseded):
            self._failed += 1

    def adopt(self, mark: Mark) -> None:
        """Stand where a heal left every rank of the group."""
        self._step, self._round = mark.step, mark.round

    def renumbered(self) -> None:
        """The rounds were numbered anew (the job's keys were deleted): commit rounds of the old
        numbering say nothing against the new one, so every rank that lived through it forgets them."""
        self._round = -1
