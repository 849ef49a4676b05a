"""Give up early on a write whose etcd leader went away while it was in flight.

A write sent to a follower is forwarded to the leader. When the leader dies before committing
it, etcd answers it neither way: the follower waits out its own timeout (5 s plus two election
timeouts) and the client its ``request_timeout``. The member knows much sooner, within about an
election timeout: it then reports no leader, or a newer raft term. So while a write that must
not be resent is in flight, its member's Status (answered by that member alone, without the
leader) is asked every ``period`` s once ``grace`` s have passed; when it reports no leader or a
term newer than the last one seen on that endpoint, the write's answer is given a moment to
arrive (an entry the new leader holds is committed right after its election) and then the write
is abandoned as of unknown outcome, the same as a timeout. Callers that cannot resend a write
already handle that: the rendezvous join reads the state before trying again.

An entry the new leader does not hold can never be committed later (a newer leader's committed
entry wins every later election), so a caller that reads after the abandon, on the new leader,
sees the final outcome.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from typing import Callable, Protocol, TypeVar

import grpc
from etcd3 import etcdrpc
from google.protobuf.message import Message

from backends.errors import BackendTimeoutError

__all__ = ["LeaderWatchPolicy", "MemberStatus", "Verdict", "WriteWatch", "member_status", "raft_term", "verdict"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class LeaderWatchPolicy:
    """When a write in flight asks its member about the leader.

    Attributes:
        grace: seconds a write runs before the first question (a healthy write is done by then).
        period: seconds between questions.
        probe_timeout: seconds one question may take; a question that fails decides nothing.
        settle: seconds the write still gets once its member reports the leader changed.
    """

    grace: float = 0.25
    period: float = 0.2
    probe_timeout: float = 0.5
    settle: float = 0.3


@dataclass(frozen=True)
class MemberStatus:
    """What one member says of the cluster: its leader's id (0: none) and the raft term."""

    leader: int
    term: int


class Verdict(enum.Enum):
    WAIT = "wait"
    """Nothing says the write was lost: keep waiting for its answer."""
    LEADER_GONE = "leader gone"
    """The member has no leader: an election is on, a forwarded write is likely lost."""
    NEW_TERM = "new term"
    """The member follows a leader elected after the write was sent."""


def verdict(sent_term: int | None, status: MemberStatus | None) -> Verdict:
    """Whether a write sent under ``sent_term`` may still get an answer, given ``status``.

    ``sent_term`` None: no term was seen on the endpoint yet (only "no leader" then decides).
    ``status`` None: the member did not answer the question (decides nothing).
    """
    if status is None:
        return Verdict.WAIT
    if status.leader == 0:
        return Verdict.LEADER_GONE
    if sent_term is not None and status.term > sent_term:
        return Verdict.NEW_TERM
    return Verdict.WAIT


def raft_term(response: object) -> int | None:
    """The raft term in an etcd response's header (None: not an etcd response, or no term)."""
    if not isinstance(response, Message) or "header" not in response.DESCRIPTOR.fields_by_name:
        return None
    return response.header.raft_term or None  # type: ignore[attr-defined]


def member_status(stub: etcdrpc.MaintenanceStub, metadata: tuple[tuple[str, str], ...],
                  timeout: float) -> MemberStatus | None:
    """What the member behind ``stub`` says of the leader and the term; None when it does not answer."""
    try:
        status = stub.Status(etcdrpc.StatusRequest(), timeout=max(timeout, 0.001), metadata=metadata,
                             wait_for_ready=False)
    except grpc.RpcError as error:
        log.debug("etcd: member status: %s", error)
        return None
    return MemberStatus(leader=status.leader, term=status.raftTerm)


class Probe(Protocol):
    def __call__(self, timeout: float) -> MemberStatus | None: ...


@dataclass(frozen=True)
class WriteWatch:
    """Waits for one write's answer, abandoning it once its member reports the leader changed.

    Attributes:
        operation: what is written, for the message (e.g. ``"txn on '/run/state/round'"``).
        endpoint: the member the write went to.
        sent_term: the last raft term seen on that endpoint before the write (None: none yet).
        probe: asks the member for its status; None when it did not answer.
        policy: when to ask.
        clock: monotonic seconds (injectable for tests).
    """

    operation: str
    endpoint: str
    sent_term: int | None
    probe: Probe
    policy: LeaderWatchPolicy = LeaderWatchPolicy()
    clock: Callable[[], float] = time.monotonic

    def result(self, future: grpc.Future, deadline: float) -> T:  # type: ignore[type-var]
        """The write's response, as ``future.result()`` would give it.

        Raises:
            grpc.RpcError: the write failed (as without the watch; ``deadline`` is the call's own).
            BackendTimeoutError: the leader changed and the write got no answer within
                ``policy.settle``; whether it applied is unknown (the call is cancelled).
        """
        policy = self.policy
        sent_term = self.sent_term
        asked_from = self.clock() + policy.grace
        while True:
            now = self.clock()
            wait = max(asked_from - now, 0.0) if now < asked_from else policy.period
            if _done(future, min(wait, max(deadline - now, 0.0))):
                return future.result()
            if self.clock() >= deadline:
                return future.result()  # the call's own deadline ends it (DEADLINE_EXCEEDED)
            if self.clock() < asked_from:
                continue
            status = self.probe(min(policy.probe_timeout, max(deadline - self.clock(), 0.0)))
            if sent_term is None and status is not None and status.leader != 0:
                sent_term = status.term  # the first answer is the baseline
                continue
            seen = verdict(sent_term, status)
            if seen is Verdict.WAIT:
                continue
            if _done(future, policy.settle):
                return future.result()
            future.cancel()
            log.info("etcd %s on %s: abandoned (%s, term %s -> %s)", self.operation, self.endpoint, seen.value,
                     sent_term, status.term if status else None)
            raise BackendTimeoutError(
                f"etcd {self.operation} on {self.endpoint} got no answer: the etcd leader changed while it was in "
                f"flight ({seen.value}); whether it applied is unknown."
            )


def _done(future: grpc.Future, timeout: float) -> bool:
    """Whether the future is done (answered, failed or cancelled) within ``timeout`` s."""
    try:
        future.exception(timeout=timeout)
    except grpc.FutureTimeoutError:
        return False
    except grpc.FutureCancelledError:
        pass
    return True
