"""What a layer over the training loop needs of the live group, beyond what the loop reads:
whether the next step boundary re-forms it, which group is in use, giving up its collectives
when a peer outside it saw it fail, and a call at every step boundary before a re-forming.

HSDP's shard group is such a layer (:mod:`elastic.worker.hsdp`): a replica's ranks must go to a
formation together and leave a failed step together. Reached as :attr:`LiveTraining.control`.
"""

from __future__ import annotations

from typing import Callable

from elastic.worker.channel import RoundMailbox
from elastic.worker.collectives import GroupInUse
from elastic.worker.regroup import GenerationWatch

__all__ = ["GroupControl"]


class GroupControl:
    """The live group as a layer over the loop sees it; no I/O but :meth:`abandon`'s."""

    def __init__(self, mailbox: RoundMailbox, watch: GenerationWatch | None, in_use: GroupInUse) -> None:
        self._mailbox = mailbox
        self._watch = watch
        self._in_use = in_use
        self.boundary_hook: Callable[[], None] | None = None
        """Called at every step boundary before the group is re-formed there."""

    @property
    def reform_due(self) -> bool:
        """Whether the next step boundary re-forms the group: a newer round is pending, or the
        round's generation moved past the group's (a rank joins)."""
        return self._mailbox.pending is not None or (self._watch is not None and self._watch.moved is not None)

    @property
    def identity(self) -> tuple[int, int] | None:
        """The group in use's round and generation (``None`` between groups)."""
        return self._in_use.identity

    def abandon(self, identity: tuple[int, int], reason: str) -> int:
        """Abandon the collectives in flight on the group in use if it is ``identity``, because a
        peer outside it saw it fail; they raise ``GroupLost`` and the step runs again. The
        number abandoned."""
        return self._in_use.abandon(identity, reason)
