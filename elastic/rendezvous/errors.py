"""The rendezvous error tree. Backend errors reach callers wrapped, with ``raise ... from``."""

from __future__ import annotations


class RendezvousError(Exception):
    """Base of every error the rendezvous engine raises."""


class RendezvousConfigError(RendezvousError, ValueError):
    """A setting or ``--rdzv-conf`` option is invalid; the message names it and the valid forms."""


class RendezvousStateError(RendezvousError):
    """State read from the store is corrupt or of an unknown version; the message names the key."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous was closed (the job finished or failed for good); no new round will form.

    Attributes:
        reason: the reason recorded by the node that closed it ("" if unknown).
        job_finished: the job ended successfully (an agent arriving late has nothing to do).
    """

    JOB_FINISHED = "the job finished"
    """The reason an agent records when every member's workers succeeded."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(f"{message} (reason: {reason})" if reason else message)
        self.reason = reason

    @property
    def job_finished(self) -> bool:
        return self.reason == self.JOB_FINISHED


class RendezvousTimeoutError(RendezvousError):
    """A round did not include this node before the join timeout."""


class RendezvousConnectionError(RendezvousError):
    """The backend could not be reached; the message names the endpoint and the cause."""


class RendezvousSessionLostError(RendezvousError):
    """This node's lease was lost (it was silent for longer than the lease TTL)."""


class JobFinishedError(RendezvousClosedError):
    """The job already finished: a node's workers all succeeded (``state/finished``), so no
    round forms any more. A subclass of :class:`RendezvousClosedError` with the job-finished
    reason, for callers that only know that one.

    Attributes:
        node_id: the node whose workers finished first.
        round: the round they finished in.
        joined: whether this node had joined a round of the job (written its join key, as a
            member or a waiting node) before it met the end; False: it arrived after the job
            had finished and took no part in it (:func:`~elastic.rendezvous.job.arrival_outcome`).
    """

    def __init__(self, message: str, node_id: str, round_number: int, *, joined: bool = True) -> None:
        super().__init__(message, RendezvousClosedError.JOB_FINISHED)
        self.node_id = node_id
        self.round = round_number
        self.joined = joined


class JobMismatchError(RendezvousError):
    """This node runs another job than the one that owns the run id (``state/job``): it is
    refused before it writes anything. The message names both commands."""
