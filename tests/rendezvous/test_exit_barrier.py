"""The exit barrier (:mod:`elastic.rendezvous.barrier`) when a peer finishes first and leaves.

Found end to end (two ``elasticrun`` agents, about one run in twenty): B marks itself done, A
marks itself done, B sees both and leaves (its lease revoke deletes its done key), and only
then does A read the done keys. A must still count B, from the DELETE its watch replays.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from elastic.rendezvous.handler import NodeSpec, RendezvousHandler
from elastic.rendezvous.settings import RendezvousSettings
from elastic.testing.agents import wait_until
from elastic.testing.fake_store import FakeHarness
from elastic.testing.tcp_store import TcpStoreHarness


class _GatedReads:
    """A backend whose reads of done keys wait for ``gate``; everything else passes through."""

    def __init__(self, backend, gate: threading.Event) -> None:
        self._backend = backend
        self._gate = gate

    def get_prefix(self, prefix: str):
        if "/done/" in prefix:
            assert self._gate.wait(timeout=30), "the test never opened the gate"
        return self._backend.get_prefix(prefix)

    def __getattr__(self, name: str):
        return getattr(self._backend, name)


@pytest.fixture(params=["fake", "tcp"])
def harness(request):
    harness = FakeHarness() if request.param == "fake" else TcpStoreHarness()
    yield harness
    harness.close()


def test_a_peer_that_finished_and_left_before_our_read_still_counts_as_done(harness):
    settings = RendezvousSettings("job", 2, 2, namespace=f"/barrier-{uuid.uuid4().hex[:8]}",
                                  lease_ttl=2.0, last_call_timeout=1.0)
    gate = threading.Event()
    a = RendezvousHandler(settings, _GatedReads(harness.connect(), gate), NodeSpec("127.0.0.1", node_id="a"),
                          owns_backend=True)
    b = RendezvousHandler(settings, harness.connect(), NodeSpec("127.0.0.1", node_id="b"), owns_backend=True)
    observer = harness.connect()
    try:
        with ThreadPoolExecutor(2) as pool:
            info, _ = pool.map(lambda handler: handler.next_rendezvous(), [a, b], timeout=30)
            done_prefix = a.keys.done_prefix(info.round)

            b_finished = pool.submit(b.finish, 10.0)
            wait_until(lambda: len(observer.get_prefix(done_prefix).kvs) == 1, 10, "b's done key", 0.01)
            a_finished = pool.submit(a.finish, 10.0)  # a marks itself done, then waits at the gate
            assert b_finished.result(timeout=10) is True
            b.shutdown()  # b leaves: its done key goes with its lease
            wait_until(lambda: len(observer.get_prefix(done_prefix).kvs) == 1, 10, "only a's done key", 0.01)
            started = time.monotonic()
            gate.set()
            assert a_finished.result(timeout=15) is True
            assert time.monotonic() - started < 5.0
    finally:
        gate.set()
        a.shutdown()
        b.shutdown()
        observer.close()


def test_a_member_whose_lease_lapses_before_it_is_done_ends_the_barrier_at_once(harness):
    # The peer's agent restarts into the next round; it will never finish this one, so the
    # barrier must not hold the others until its timeout.
    settings = RendezvousSettings("job", 2, 2, namespace=f"/barrier-{uuid.uuid4().hex[:8]}",
                                  lease_ttl=2.0, last_call_timeout=1.0)
    a = RendezvousHandler(settings, harness.connect(), NodeSpec("127.0.0.1", node_id="a"), owns_backend=True)
    b = RendezvousHandler(settings, harness.connect(), NodeSpec("127.0.0.1", node_id="b"), owns_backend=True)
    observer = harness.connect()
    try:
        with ThreadPoolExecutor(2) as pool:
            info, _ = pool.map(lambda handler: handler.next_rendezvous(), [a, b], timeout=30)
            a_finished = pool.submit(a.finish, 60.0)
            done_prefix = a.keys.done_prefix(info.round)
            wait_until(lambda: len(observer.get_prefix(done_prefix).kvs) == 1, 10, "a's done key (a waits for b)",
                       0.01)
            started = time.monotonic()
            observer.revoke(b._membership.lease_id)  # b's lease lapses before b is done
            assert a_finished.result(timeout=10) is False
            assert time.monotonic() - started < 3.0
    finally:
        a.shutdown()
        b.shutdown()
        observer.close()


@pytest.mark.parametrize(
    ("present", "done", "expected"),
    [
        ({"a", "b"}, set(), "WAIT"),
        ({"a", "b"}, {"a"}, "WAIT"),
        ({"a", "b"}, {"a", "b"}, "ALL_DONE"),
        ({"a"}, {"a", "b"}, "ALL_DONE"),  # b was done, then left
        ({"a"}, {"a"}, "MEMBER_LOST"),  # b left before it was done
        (set(), set(), "MEMBER_LOST"),
        ({"a", "b", "c"}, {"a", "b"}, "ALL_DONE"),  # c is not a member of this round
    ],
)
def test_barrier_outcome_case_table(present, done, expected):
    from elastic.rendezvous.round_events import BarrierOutcome, barrier_outcome

    outcome = barrier_outcome(frozenset({"a", "b"}), frozenset(present), frozenset(done))
    assert outcome is BarrierOutcome[expected]
