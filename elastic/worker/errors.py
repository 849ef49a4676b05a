"""The ``elastic.worker`` error tree. Foreign errors (torch, sockets, JSON) reach callers
wrapped with ``raise ... from``.

Two branches matter to a training loop:

* :class:`GroupLost` is *recoverable*: the current process group cannot be used any more (a
  collective failed, or a newer round abandoned it). :meth:`LiveTraining.run` and
  :meth:`LiveTraining.train_step` catch it, so the step that was not committed runs again on
  the next group.
* :class:`RecoveryFailed` is *terminal*: the worker cannot rejoin (no newer round came in
  time, or the agent closed the round pipe). It propagates, the process exits non-zero, and
  the agent falls back to a group restart.

``elastic.worker`` exports the errors a training loop may catch (the base, the options', the
training state's and the environment's errors, :class:`StateTransferError`, :class:`GroupLost`,
:class:`RecoveryFailed` and :class:`FailingRoundsError`); the finer kinds below them, and the pipes' line errors, are
internal and importable from this module.
"""

from __future__ import annotations


class LiveRecoveryError(Exception):
    """Base of every error ``elastic.worker`` raises."""


class WorkerEnvError(LiveRecoveryError, ValueError):
    """The worker environment is missing a variable or holds a bad value; the message names it."""


class LiveOptionsError(LiveRecoveryError, ValueError):
    """An option of :class:`elastic.worker.LiveOptions` is out of range; the message says which."""


class RoundLineError(LiveRecoveryError, ValueError):
    """A line read from the round pipe is not a valid round; the watcher logs it and goes on."""


class ReadyLineError(LiveRecoveryError, ValueError):
    """A line read from the ready pipe is not a valid answer; the agent skips it (one warning)."""


class UnsupportedBackendError(LiveRecoveryError, SystemExit):
    """The process group backend this worker would use is not one live recovery supports (NCCL,
    unless opted in), or cannot run here; the message names it and the way out. Raised by
    :meth:`LiveTraining.start` before anything is formed (:mod:`elastic.worker.backend`).

    It is a :class:`LiveRecoveryError` to catch, and also a ``SystemExit`` whose code is the
    message: left uncaught it ends the worker as ``sys.exit(message)`` does, with that one line
    on stderr, exit status 1 and no traceback.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = message


class StateTransferError(LiveRecoveryError):
    """A state could not be encoded (an unsupported value in ``state_dict()``) or a received
    header is malformed or over its bounds; the message names the entry or the bound. Also a
    received state or a checkpoint that is not a LiveTraining state, or that an object refused."""


class TrainingStateError(LiveRecoveryError, ValueError):
    """The training state given to ``LiveTraining`` is malformed: both or neither of ``state=``
    and the ``state_dict``/``load_state_dict`` pair, or an object without both methods."""


class GroupLost(LiveRecoveryError):
    """The current process group is unusable; recoverable at the next step boundary.

    Attributes:
        round: the round whose group was lost.
    """

    def __init__(self, message: str, round_number: int) -> None:
        super().__init__(message)
        self.round = round_number


class CollectiveFailed(GroupLost):
    """A collective of the group failed (a peer closed its connection, or the collective timed out).

    Attributes:
        stalled: it failed after a stall (in flight for the interrupt grace, or this process
            froze meanwhile): the peer it lost may be cut off rather than dead.
    """

    def __init__(self, message: str, round_number: int, stalled: bool = False) -> None:
        super().__init__(message, round_number)
        self.stalled = stalled


class Superseded(GroupLost):
    """A newer round arrived while this group was forming or a collective was hung on it."""


class RecoveryFailed(LiveRecoveryError):
    """The worker cannot rejoin the job; it should exit non-zero so the agent restarts the group."""


class NoRoundError(RecoveryFailed):
    """The group was lost and no newer round arrived (or formed) before the deadline."""


class AgentGoneError(RecoveryFailed):
    """The group was lost and the round pipe is at EOF: the agent is gone, no round can come."""


class FailingRoundsError(RecoveryFailed):
    """Too many groups in a row failed without a committed step (``LiveOptions.max_failed_rounds``)."""


class DataPlanError(LiveRecoveryError, ValueError):
    """The data a rank should use cannot be planned: a batch size, rank or world out of range, a
    saved position that does not fit the dataset, or a global batch the world does not divide;
    the message says which."""
