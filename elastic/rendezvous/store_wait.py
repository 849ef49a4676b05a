"""Waiting for a built-in store that is not up yet: nodes start in any order.

A ``c10d`` node that does not host the store, or a ``tcp`` node whose ``elastic-store`` is
not running yet, may start before the store listens. torchrun's ``TCPStore`` client keeps
trying to connect until its ``read_timeout`` (60 s by default) and the job runs; ours keeps
trying until the join timeout, with backoff (:data:`STORE_WAIT`), saying what it waits for at
the first refusal and then every :data:`WAIT_LINE_INTERVAL` seconds, and fails after with one
line that names the endpoint and the fix. A store that refuses the connection, cannot be
reached or does not finish its handshake is retried; one that refuses our token or is not an
elastic-store is not (waiting cannot fix those).

The lines and the failure are pure functions (:func:`waiting_line`, :func:`gave_up_message`);
:func:`wait_for_store` runs the attempts under a :class:`~backends.retry.RetryPolicy` whose
sleep and clock tests inject.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable

from backends.errors import BackendConnectionError, BackendTimeoutError
from backends.retry import RetryPolicy
from elastic.rendezvous.errors import RendezvousConnectionError

__all__ = ["STORE_WAIT", "StoreWait", "WAIT_LINE_INTERVAL", "gave_up_message", "wait_for_store", "waiting_line"]

log = logging.getLogger(__name__)

STORE_WAIT = RetryPolicy(max_attempts=2**31, initial_backoff=0.1, max_backoff=1.0)
"""Backoff between tries to reach a store that is not up yet (the join timeout bounds them): a
node connects within about a second of the store coming up."""

WAIT_LINE_INTERVAL = 10.0
"""Seconds between two lines while the store stays down."""

WAITED_FOR = (BackendConnectionError, BackendTimeoutError)
"""Errors of a store that is not up (yet): refused, unreachable, handshake unanswered."""


@dataclass(frozen=True)
class StoreWait:
    """How a node waits for its store to come up.

    Attributes:
        run_id, node: name the waiting node in its lines.
        timeout: seconds to keep trying (the join timeout).
        policy: the backoff between tries; its ``sleep`` and ``clock`` are the wait's.
        interval: seconds between two waiting lines.

    Raises:
        ValueError: the timeout or the interval is not positive.
    """

    run_id: str
    node: str
    timeout: float
    policy: RetryPolicy = STORE_WAIT
    interval: float = WAIT_LINE_INTERVAL

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f"The store wait's timeout ({self.timeout}) must be positive.")
        if not self.interval > 0:
            raise ValueError(f"The store wait's line interval ({self.interval}) must be positive.")


def waiting_line(run_id: str, node: str, subject: str, reason: str, seconds_left: float) -> str:
    """``Rendezvous job-1 (node a): waiting for the c10d store host at h:29400 (is_host=0):
    connection refused; 595 s left before the join timeout``."""
    return (f"Rendezvous {run_id} (node {node}): waiting for {subject}: {reason}; "
            f"{max(seconds_left, 0.0):.0f} s left before the join timeout")


def gave_up_message(run_id: str, node: str, subject: str, reason: str, timeout: float, fix: str) -> str:
    """The one line a node fails with when its store never came up."""
    return (f"Rendezvous {run_id} (node {node}): {subject} did not answer within the join timeout "
            f"({timeout:g}s): {reason}. {fix}; to wait longer, raise --rdzv-conf join_timeout.")


def short_reason(error: BaseException) -> str:
    """``connection refused`` for a socket error underneath, else the error's own text."""
    cause = error.__cause__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror[0].lower() + cause.strerror[1:]
    return str(error).rstrip(".")


def wait_for_store(connect: Callable[[], None], subject: str, fix: str, wait: StoreWait,
                   emit: Callable[[str], None] = log.warning) -> None:
    """Call ``connect`` until it returns, for up to ``wait.timeout`` seconds.

    ``subject`` names what is waited for (``the c10d store host at h:p (is_host=0)``), ``fix``
    what to do when it never comes (a sentence without its full stop). ``emit`` gets the
    waiting lines: at the first failure, then every ``wait.interval`` seconds.

    Raises:
        RendezvousConnectionError: the store did not come up in time (one line; the last error
            is its cause).
        BackendError: ``connect`` failed in a way waiting cannot fix (auth, protocol): at once.
    """
    policy = dataclasses.replace(wait.policy, total_timeout=wait.timeout)
    started = policy.clock()
    last_line: float | None = None

    def waiting(attempt: int, error: BaseException) -> None:
        nonlocal last_line
        now = policy.clock()
        if last_line is None or now - last_line >= wait.interval:
            last_line = now
            emit(waiting_line(wait.run_id, wait.node, subject, short_reason(error), wait.timeout - (now - started)))

    try:
        policy.run(connect, retry_on=WAITED_FOR, on_retry=waiting)
    except WAITED_FOR as error:
        raise RendezvousConnectionError(
            gave_up_message(wait.run_id, wait.node, subject, short_reason(error), wait.timeout, fix)
        ) from error
