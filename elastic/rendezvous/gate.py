"""Whether a node may join a round at all: the job's end and the job's identity.

A join is for a job that runs: :class:`JoinGate` raises when ``state/`` shows the job finished
(a node's workers all succeeded: ``state/finished``), the rendezvous closed, or the run id
owned by another job (``state/job``; :mod:`elastic.rendezvous.job`). Before its first join a
node with an identity checks it, creating the record when there is none; the join transaction
then compares the record it checked (:func:`~elastic.rendezvous.transactions.join_txn`), so a
node of another job never writes a key that the running job would see.
"""

from __future__ import annotations

from backends.api import ABSENT
from elastic.rendezvous.context import RendezvousContext
from elastic.rendezvous.attempt import OwnedJob, StateView
from elastic.rendezvous.errors import JobMismatchError, RendezvousClosedError, RendezvousError
from elastic.rendezvous.job import decode_job, encode_job
from elastic.rendezvous.reads import finished_error

__all__ = ["JoinGate"]


class JoinGate:
    """The checks every join of one node passes first (see the module docstring)."""

    def __init__(self, ctx: RendezvousContext) -> None:
        self._ctx = ctx
        self._job: OwnedJob | None = None  # the job record this node checked its identity against

    @property
    def job_created(self) -> int | None:
        """The create revision of the job record this node checked (None: no identity check)."""
        return self._job.created if self._job is not None else None

    def check_open(self, state: StateView, joined: bool = True) -> None:
        """Raise when ``state`` says no round may form for this node; ``joined``: this node has
        joined a round of the job before (the job's end then is not news to it).

        Raises:
            JobFinishedError: the job finished.
            RendezvousClosedError: the rendezvous was closed for good.
            JobMismatchError: another job owns the run id now.
            RendezvousStateError: a record is corrupt.
        """
        if state.finished is not None:
            raise finished_error(self._ctx.settings.run_id, self._ctx.node_id, state.finished, joined)
        if state.closed:
            raise RendezvousClosedError(
                f"The rendezvous {self._ctx.settings.run_id} is closed; no new round will form", state.closed_reason
            )
        if self._ctx.settings.job is not None and (state.job is None or state.job != self._job):
            self.check_job(state.job)

    def check_job(self, seen: OwnedJob | None) -> None:
        """Check this node's job against the one that owns the run id (``seen``: as read; None:
        read it), creating the record if there is none. Writes nothing when another job owns it.

        Raises:
            JobMismatchError: another job owns the run id.
            RendezvousStateError: its record is corrupt.
            BackendError: the store failed.
        """
        ours = self._ctx.settings.job
        if ours is None:
            return
        if seen is None:
            result = self._ctx.backend.put_if(self._ctx.keys.job, encode_job(ours), ABSENT)
            if result.current is None:
                raise RendezvousError(f"Rendezvous {self._ctx.settings.run_id}: the store returned no job record.")
            seen = OwnedJob(decode_job(result.current.key, result.current.value), result.current.create_revision)
        if not seen.identity.matches(ours):
            raise JobMismatchError(
                f"Rendezvous {self._ctx.settings.run_id}: node {self._ctx.node_id} is refused: this --rdzv-id "
                f"belongs to another job ({seen.identity.command!r}, fingerprint {seen.identity.fingerprint}); this node runs "
                f"{ours.command!r} (fingerprint {ours.fingerprint}). Use another --rdzv-id, or give every node of "
                f"one job the same --rdzv-conf job_fingerprint=NAME.")
        self._job = seen
