"""A write in flight when the etcd leader dies is given up as soon as its member says so.

Unit cases drive :class:`~backends.etcd.leader_watch.WriteWatch` with a scripted future, probe and
clock; the integration case kills the leader of a real 3-member etcd and sends a conditional
write to a follower right after: etcd answers it neither way, and without the watch the client
waits until the follower's own timeout (about 7 s) or its ``request_timeout``.
"""

from __future__ import annotations

import time

import grpc
import pytest

from backends.errors import BackendTimeoutError
from backends.etcd.leader_watch import LeaderWatchPolicy, MemberStatus, Verdict, WriteWatch, raft_term, verdict

# -- the decision ------------------------------------------------------------------------------
LEADER, OTHER = 0xA, 0xB


@pytest.mark.parametrize(
    ("sent_term", "status", "expected"),
    [
        (5, None, Verdict.WAIT),  # the member did not answer: nothing is known
        (5, MemberStatus(leader=LEADER, term=5), Verdict.WAIT),  # same leader, same term
        (5, MemberStatus(leader=OTHER, term=5), Verdict.WAIT),  # a new leader needs a new term
        (5, MemberStatus(leader=0, term=5), Verdict.LEADER_GONE),  # the member lost its leader
        (5, MemberStatus(leader=0, term=6), Verdict.LEADER_GONE),  # campaigning
        (5, MemberStatus(leader=OTHER, term=6), Verdict.NEW_TERM),  # elected after the write was sent
        (None, MemberStatus(leader=LEADER, term=9), Verdict.WAIT),  # no term seen yet: no baseline
        (None, MemberStatus(leader=0, term=9), Verdict.LEADER_GONE),
        (7, MemberStatus(leader=LEADER, term=6), Verdict.WAIT),  # an older term is not a change
    ],
)
def test_verdict_case_table(sent_term, status, expected):
    assert verdict(sent_term, status) is expected


# -- the wait, scripted ------------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class ScriptedFuture(grpc.Future):
    """Answers ``value`` once the clock reaches ``answer_at`` (never if None); waits move the clock."""

    def __init__(self, clock: FakeClock, answer_at: float | None, value: object = "response") -> None:
        self.clock, self.answer_at, self.value = clock, answer_at, value
        self.cancelled_at: float | None = None

    def _ready(self) -> bool:
        return self.answer_at is not None and self.clock.now >= self.answer_at

    def exception(self, timeout=None):
        if self.cancelled_at is not None:
            raise grpc.FutureCancelledError()
        if self.answer_at is not None and self.clock.now + (timeout or 0.0) >= self.answer_at:
            self.clock.now = max(self.clock.now, self.answer_at)
            return None
        self.clock.now += timeout or 0.0
        raise grpc.FutureTimeoutError()

    def result(self, timeout=None):
        assert self._ready(), "result() asked before the answer"
        return self.value

    def cancel(self):
        self.cancelled_at = self.clock.now
        return True

    # unused parts of the interface
    def cancelled(self):
        return self.cancelled_at is not None

    def running(self):
        return not self._ready()

    def done(self):
        return self._ready()

    def traceback(self, timeout=None):
        return None

    def add_done_callback(self, fn):
        raise NotImplementedError


class ScriptedMember:
    """The member's status as a function of the clock; records when it was asked."""

    def __init__(self, clock: FakeClock, changes: list[tuple[float, MemberStatus | None]]) -> None:
        self.clock, self.changes = clock, changes
        self.asked: list[float] = []

    def __call__(self, timeout: float) -> MemberStatus | None:
        self.asked.append(self.clock.now)
        status = None
        for since, value in self.changes:
            if self.clock.now >= since:
                status = value
        return status


POLICY = LeaderWatchPolicy(grace=0.25, period=0.2, probe_timeout=0.5, settle=0.3)


def watch(clock, member, sent_term=5):
    return WriteWatch("txn on 'k'", "127.0.0.1:2379", sent_term, member, POLICY, clock)


def test_a_quick_answer_asks_the_member_nothing():
    clock = FakeClock()
    member = ScriptedMember(clock, [(0, MemberStatus(LEADER, 5))])
    assert watch(clock, member).result(ScriptedFuture(clock, answer_at=100.1), deadline=105.0) == "response"
    assert member.asked == []


def test_a_slow_answer_under_a_steady_leader_is_waited_for():
    clock = FakeClock()
    member = ScriptedMember(clock, [(0, MemberStatus(LEADER, 5))])
    assert watch(clock, member).result(ScriptedFuture(clock, answer_at=103.0), deadline=105.0) == "response"
    assert len(member.asked) >= 10  # asked every period, never gave up


def test_a_write_is_abandoned_soon_after_its_member_loses_the_leader():
    clock = FakeClock()
    member = ScriptedMember(clock, [(0, MemberStatus(LEADER, 5)), (101.2, MemberStatus(0, 6))])
    future = ScriptedFuture(clock, answer_at=None)
    with pytest.raises(BackendTimeoutError, match="leader changed.*whether it applied is unknown"):
        watch(clock, member).result(future, deadline=105.0)
    assert future.cancelled_at is not None
    assert 101.2 + POLICY.settle <= future.cancelled_at <= 101.2 + POLICY.period + POLICY.settle + 1e-9


def test_an_answer_within_the_settle_time_after_a_new_term_is_returned():
    clock = FakeClock()
    member = ScriptedMember(clock, [(0, MemberStatus(LEADER, 5)), (101.0, MemberStatus(OTHER, 6))])
    future = ScriptedFuture(clock, answer_at=101.3)  # the new leader held the entry and committed it
    assert watch(clock, member).result(future, deadline=105.0) == "response"
    assert future.cancelled_at is None


def test_without_a_term_seen_the_first_answer_is_the_baseline():
    clock = FakeClock()
    member = ScriptedMember(clock, [(0, MemberStatus(LEADER, 9)), (101.0, MemberStatus(OTHER, 10))])
    with pytest.raises(BackendTimeoutError):
        watch(clock, member, sent_term=None).result(ScriptedFuture(clock, answer_at=None), deadline=105.0)
    assert member.asked[0] == pytest.approx(100.25)


def test_a_member_that_does_not_answer_decides_nothing_and_the_deadline_ends_the_write():
    clock = FakeClock()
    member = ScriptedMember(clock, [(0, None)])
    future = ScriptedFuture(clock, answer_at=102.0)  # the call's own deadline: an error result, here "response"
    assert watch(clock, member).result(future, deadline=102.0) == "response"
    assert future.cancelled_at is None


def test_raft_term_reads_response_headers_only():
    from etcd3 import etcdrpc

    response = etcdrpc.PutResponse()
    response.header.raft_term = 7
    assert raft_term(response) == 7
    assert raft_term(etcdrpc.PutResponse()) is None  # no term
    assert raft_term("not a response") is None


# -- a real cluster ----------------------------------------------------------------------------
@pytest.mark.etcd
@pytest.mark.slow
def test_a_write_sent_to_a_follower_as_the_leader_dies_ends_long_before_request_timeout():
    from backends.etcd import EtcdBackend, EtcdConfig
    from backends.txn import Compare, Put, Txn
    from support.etcd_cluster import EtcdCluster

    cluster = EtcdCluster(3)
    try:
        leader = cluster.leader()
        follower = next(member for member in cluster.members if member != leader)
        # The follower alone: the write cannot fail over, so what ends it is the watch (or etcd).
        backend = EtcdBackend(EtcdConfig(endpoints=follower.client_url(), request_timeout=30.0))
        try:
            backend.put("/lw/warm", b"x")  # a response: the endpoint's term is known
            cluster.kill(leader)
            started = time.monotonic()
            outcome = "applied"
            try:
                backend.txn(Txn((Compare.absent("/lw/k"),), (Put("/lw/k", b"1"),), ()))
            except BackendTimeoutError as error:
                outcome = str(error)
            took = time.monotonic() - started
            assert "leader changed" in outcome, outcome  # not etcd's own "request timed out" (~7 s)
            # the election (1-2 s at a 1 s election timeout) and one period and settle after it
            assert took < 5.0, f"the write ended {took:.2f}s after the leader died"
            # the new leader's word is final: the write is there or it never will be
            present = backend.get("/lw/k").kv is not None
            time.sleep(1.0)
            assert (backend.get("/lw/k").kv is not None) == present
            print(f"write ended {took:.2f}s after the leader was killed ({'applied' if present else 'not applied'})")
            backend.txn(Txn((Compare.absent("/lw/again"),), (Put("/lw/again", b"1"),), ()))
        finally:
            backend.close()
    finally:
        cluster.close()
