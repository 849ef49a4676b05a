"""Membership (the session, the state/ watch, the master port) and the join's claim, on the fake store."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.api import EventType, KeyValue, WatchEvent
from backends.errors import BackendClosedError, CompactedError
from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.attempt import Claim, ClosedRound, JoinAttempt
from elastic.rendezvous.handler import NodeSpec, RendezvousHandler
from elastic.rendezvous.membership import Membership, StateWatch
from elastic.rendezvous.ports import reserve_port
from elastic.rendezvous.records import Member, RendezvousKeys, RoundRecord
from elastic.rendezvous.settings import RendezvousSettings
from elastic.testing.fake_store import FakeHarness

KEYS = RendezvousKeys("/membership-test", "run")


@pytest.fixture
def backend():
    harness = FakeHarness()
    client = harness.connect()
    yield harness.store, client
    client.close()
    harness.close()


def _compact(watch) -> None:
    """Fail ``watch`` as a backend does when it cannot resume it (its history is gone)."""
    watch.fail(CompactedError("history compacted (injected)", requested_revision=1, compact_revision=5))


# -- the state/ watch ----------------------------------------------------------------------------
def test_open_drops_what_is_queued_and_the_watch_lives_on_across_opens(backend):
    _, client = backend
    watch = StateWatch(client, KEYS.state_prefix, threading.Event())
    watch.open()
    client.put(KEYS.round, b"stale")  # a read after open() reflects it
    watch.open()
    revision = client.put(KEYS.closed, b"new")
    assert [event.revision for event in watch.get(timeout=1)] == [revision]


def test_a_compacted_watch_raises_once_and_the_next_open_watches_from_now(backend):
    _, client = backend
    watch = StateWatch(client, KEYS.state_prefix, threading.Event())
    watch.open()
    _compact(watch.ensure_open())
    with pytest.raises(CompactedError):
        watch.get(timeout=1)
    watch.open()
    revision = client.put(KEYS.closed, b"after")
    assert [event.revision for event in watch.get(timeout=1)] == [revision]


def test_a_subscriber_gets_the_events_handed_back_first_then_the_live_ones_and_one_failure(backend):
    _, client = backend
    watch = StateWatch(client, KEYS.state_prefix, threading.Event())
    watch.open()
    handed = WatchEvent(EventType.PUT, KeyValue(KEYS.closed, b"x", 3, 3))
    watch.hand_back([handed])
    seen, failures = [], []
    watch.subscribe(seen.extend, failures.append)
    revision = client.put(KEYS.round, b"live")
    assert [event.revision for event in seen] == [3, revision]
    _compact(watch.ensure_open())
    assert [type(error) for error in failures] == [CompactedError]
    reopened = watch.ensure_open()  # the owner re-opens it; the subscription follows
    again = client.put(KEYS.round, b"again")
    assert seen[-1].revision == again and reopened is watch.ensure_open()
    watch.unsubscribe()
    client.put(KEYS.round, b"unheard")
    assert seen[-1].revision == again


def test_an_interrupt_ends_a_blocked_get_and_refuses_new_watches(backend):
    _, client = backend
    interrupted = threading.Event()
    watch = StateWatch(client, KEYS.state_prefix, interrupted)
    watch.open()
    interrupted.set()
    threading.Timer(0.2, watch.cancel).start()
    with pytest.raises(BackendClosedError):
        watch.get(timeout=5)
    with pytest.raises(BackendClosedError):
        watch.open()


# -- the session and the port ------------------------------------------------------------------
def _membership(client, signals):
    settings = RendezvousSettings("run", 1, 1, namespace=KEYS.namespace, lease_ttl=2.0)
    return Membership(settings, client, KEYS.state_prefix, "me", "127.0.0.1", reserve_port,
                      lambda change, reason: signals.append((change, reason)))


def test_a_lease_is_reused_while_alive_and_replaced_after_the_server_expired_it(backend):
    store, client = backend
    signals: list = []
    membership = _membership(client, signals)
    first = membership.lease()
    assert first.new_session and not first.after_loss
    assert membership.lease().lease_id == first.lease_id and not membership.lease().new_session
    store.expire_lease(first.lease_id)
    deadline = time.monotonic() + 5
    while membership.alive and time.monotonic() < deadline:
        time.sleep(0.02)  # the keepalive thread hears it at its next renewal
    assert signals and signals[0][0] is MembershipChange.MEMBER_LOST and "lease was lost" in signals[0][1]
    second = membership.lease()
    assert second.new_session and second.after_loss and second.lease_id != first.lease_id
    membership.close()
    assert client.get_prefix("/").kvs == ()


def test_only_the_host_of_the_round_takes_the_listening_socket_and_the_port_is_closed_either_way(backend):
    _, client = backend
    membership = _membership(client, [])
    membership.reserve_port()
    assert membership.take_listener(host=False) is None
    port = membership.reserve_port()
    listener = membership.take_listener(host=True)
    try:
        assert listener.getsockname()[1] == port
        assert membership.take_listener(host=True) is None
    finally:
        listener.close()


# -- the closer claim ------------------------------------------------------------------------
def _attempt(claim: Claim, created: int = 10) -> JoinAttempt:
    return JoinAttempt(4, KEYS.node(4, "me"), b"me", 1, KeyValue(KEYS.closer(4), b"x", created, created), claim)


def _closed(round_number: int, revision: int) -> ClosedRound:
    return ClosedRound(RoundRecord(round_number, (Member("me", "h", 1),)), revision)


CLAIM = KeyValue(KEYS.closer(4), b"me", 12, 12)


@pytest.mark.parametrize("before, step, after", [
    (Claim.OTHER, lambda a: a.seen_closer(CLAIM, mine=True), Claim.HELD),  # took it over
    (Claim.OTHER, lambda a: a.seen_closer(CLAIM, mine=False), Claim.OTHER),  # someone else did
    (Claim.HELD, lambda a: a.seen_closer(CLAIM, mine=False), Claim.HELD),  # never HELD -> OTHER
    (Claim.RELEASED, lambda a: a.seen_closer(CLAIM, mine=True), Claim.RELEASED),  # final
    (Claim.HELD, lambda a: a.release(), Claim.RELEASED),
    (Claim.OTHER, lambda a: a.release(), Claim.OTHER),
    (Claim.HELD, lambda a: a.after_close(_closed(4, 20)), Claim.RELEASED),  # the close deleted it
    (Claim.HELD, lambda a: a.after_close(_closed(4, 5)), Claim.HELD),  # a close before our claim
    (Claim.HELD, lambda a: a.after_close(_closed(5, 20)), Claim.HELD),  # a round past ours: delete it
    (Claim.OTHER, lambda a: a.after_close(_closed(4, 20)), Claim.OTHER),
])
def test_the_claim_moves_only_along_its_legal_transitions(before, step, after):
    assert step(_attempt(before)).claim is after


# -- a join whose state/ watch was compacted ------------------------------------------------------
def test_a_join_whose_state_watch_was_compacted_starts_over_from_a_read_and_is_included(backend, caplog):
    store, _ = backend
    settings = RendezvousSettings("run", 3, 3, namespace="/compacted-join", lease_ttl=2.0, join_timeout=20.0)
    a, b, c = (RendezvousHandler(settings, store.client(), NodeSpec("127.0.0.1", node_id=name), owns_backend=True)
               for name in "abc")
    try:
        with ThreadPoolExecutor(3) as pool, caplog.at_level(logging.WARNING, logger="elastic.rendezvous.joining"):
            first = pool.submit(a.next_rendezvous)  # the closer: it watches the joins
            _wait_until(lambda: a.progress() is not None)
            second = pool.submit(b.next_rendezvous)  # waits on its state/ watch
            _wait_until(lambda: b.progress() is not None)
            _compact(b._membership.state.ensure_open())
            _wait_until(lambda: "starting over" in caplog.text)
            third = pool.submit(c.next_rendezvous)  # fills the round and closes it
            infos = [future.result(timeout=20) for future in (first, second, third)]
        assert sorted(info.group_rank for info in infos) == [0, 1, 2] and {info.round for info in infos} == {0}
    finally:
        for handler in (a, b, c):
            handler.shutdown()


def _wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
