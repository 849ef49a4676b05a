"""The commit fence: a collective that completes after a stall is used only once its peers
cannot have gone on without this rank.

A rank cut off (or frozen) inside a step's collective completes it when the link heals, with
the work its peers abandoned for a newer round (gloo cannot cancel it); without a fence it
would commit that step in the abandoned round while its peers ran the step again without it.
The fence judges only suspect completions (:func:`elastic.worker.decisions.suspect_completion`:
in flight for the interrupt grace, or a freeze since the last clean one), so a step that ran
normally asks nothing, and an unreachable store stops nobody who is not stalled. A suspect
completion waits for the agent's word (:func:`elastic.worker.decisions.fence_verdict`): a lease
renewal that covers it (committed), a newer round or the agent's end (dropped), or the
collective timeout (dropped). Torch-free.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from elastic.worker.channel import RoundMailbox
from elastic.worker.decisions import FenceVerdict, FenceView, fence_verdict, suspect_completion

log = logging.getLogger(__name__)

__all__ = ["CommitFence"]

_LOOK = 0.1
"""Longest sleep between two looks while a suspect completion waits (offers wake it sooner)."""


class CommitFence:
    """Judges the completions of one worker's collectives against its mailbox.

    Args:
        mailbox: the round pipe's mailbox (rounds, lease renewals, freezes, EOF).
        stall: the interrupt grace: peers abandon nothing in flight for less.
        timeout: the collective timeout: the longest a suspect completion waits.
        label: for logs.
    """

    def __init__(self, mailbox: RoundMailbox, stall: float, timeout: float, label: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._mailbox = mailbox
        self._stall = stall
        self._timeout = timeout
        self._label = label
        self._clock = clock

    def suspect(self, started: float, now: float, last_ok: float) -> bool:
        """Whether a collective launched at ``started`` that completed at ``now`` must be judged."""
        return suspect_completion(started, now, last_ok, self._mailbox.froze_at, self._stall)

    def judge(self, round_number: int, suspected_at: float) -> FenceVerdict:
        """Wait for the agent's word on a completion at ``suspected_at``: COMMIT or ABANDON."""
        deadline = suspected_at + self._timeout
        logged = False
        while True:
            mailbox = self._mailbox
            view = FenceView(suspected_at, mailbox.held, newer_round=mailbox.pending is not None,
                             agent_gone=mailbox.eof, now=self._clock(), deadline=deadline)
            verdict = fence_verdict(view)
            if verdict is not FenceVerdict.WAIT:
                if logged or verdict is FenceVerdict.ABANDON:
                    log.warning("%s: round %d: a collective that completed after a stall %s", self._label,
                                round_number, "is used: the agent renewed its lease" if verdict is FenceVerdict.COMMIT
                                else "is dropped: the round may have gone on without this rank")
                return verdict
            if not logged:
                logged = True
                log.warning("%s: round %d: a collective completed after a stall while the agent's lease is not "
                            "known to be held; waiting for the agent's word before using it", self._label,
                            round_number)
            mailbox.wait_news(min(_LOOK, max(deadline - view.now, 0.0)))
