"""The fake's fault injection and fake-clock mode, and Session's loss detection."""

import threading
import time

import pytest

from backends.api import EventType
from backends.errors import BackendConnectionError
from backends.fake import InMemoryStore
from backends.session import Session


class ManualClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_with_a_manual_clock_leases_expire_only_when_the_test_says_so():
    clock = ManualClock()
    store = InMemoryStore(clock=clock, auto_expire=False)
    client = store.client()
    lease = client.grant(10)
    client.put("/k", b"v", lease=lease.id)
    watch = client.watch_prefix("/")
    clock.now += 9.9
    store.expire_due()
    assert client.get("/k").kv is not None
    clock.now += 0.2
    store.expire_due()
    assert client.get("/k").kv is None
    assert [event.type for event in watch.get(timeout=1)] == [EventType.DELETE]


def test_expire_lease_deletes_the_keys_at_once_and_tells_watchers():
    store = InMemoryStore()
    client = store.client()
    lease = client.grant(60)
    client.put("/a", b"v", lease=lease.id)
    with client.watch_prefix("/") as watch:
        store.expire_lease(lease.id)
        assert [(e.type, e.kv.key) for e in watch.get(timeout=1)] == [(EventType.DELETE, "/a")]
    store.close()


def test_a_stopped_store_fails_calls_until_started_again_and_its_watches_carry_on():
    store = InMemoryStore()
    client = store.client()
    client.put("/k", b"v")
    watch = client.watch_prefix("/")
    store.stop()
    with pytest.raises(BackendConnectionError):
        client.get("/k")
    assert watch.get(timeout=0.5) == []  # an outage is not the watch's end (the contract: it resumes)
    store.start()
    assert client.get("/k").kv.value == b"v"
    revision = client.put("/k", b"w")
    assert [event.revision for event in watch.get(timeout=1)] == [revision]
    store.close()


def test_a_session_outlives_an_outage_longer_than_its_ttl_when_the_server_kept_the_lease():
    store = InMemoryStore()
    client = store.client()
    with Session(client, ttl=0.6, keepalive_interval=0.1) as session:
        store.stop()
        assert not session.wait_lost(timeout=1.5)  # 2.5 TTLs without an answer: an outage, not a loss
        assert session.alive and session.outage >= 1.0
        store.start(renew_leases=True)  # as a new etcd leader after a quorum loss
        deadline = time.monotonic() + 5
        while session.outage and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session.outage == 0.0 and session.alive
        assert client.get("/").revision > 0
    store.close()


def test_a_session_is_lost_when_the_server_answers_that_its_lease_expired_during_the_outage():
    store = InMemoryStore()
    client = store.client()
    session = Session(client, ttl=0.6, keepalive_interval=0.1)
    reasons = []
    session.on_lost(reasons.append)
    store.stop()
    assert not session.wait_lost(timeout=1.0)
    store.start()  # the store's clock ran on: the lease is overdue and expires now
    assert session.wait_lost(timeout=2.0)
    assert "the server says" in reasons[0]
    late = []
    session.on_lost(late.append)
    assert late == [session.lost_reason]
    session.close()
    store.close()


def test_a_session_knows_until_when_the_server_cannot_have_expired_its_lease():
    store = InMemoryStore()
    client = store.client()
    before = time.monotonic()
    with Session(client, ttl=2.0, keepalive_interval=0.1) as session:
        granted = session.valid_until
        assert before + 2.0 <= granted <= time.monotonic() + 2.0  # counted from before the grant
        time.sleep(0.35)
        renewed = session.valid_until
        assert renewed > granted and renewed <= time.monotonic() + 2.0  # from the renewal's sending
        store.stop()
        time.sleep(0.3)  # a renewal in flight at the stop has ended by now
        stopped = session.valid_until
        time.sleep(0.35)
        assert session.valid_until == stopped  # no answer: no proof
    store.close()


def test_a_session_survives_a_brief_outage_shorter_than_its_ttl():
    store = InMemoryStore()
    client = store.client()
    with Session(client, ttl=2.0, keepalive_interval=0.1) as session:
        store.stop()
        threading.Event().wait(0.4)
        store.start()
        assert not session.wait_lost(timeout=2.5)
        assert session.alive
    store.close()


def test_closing_a_session_revokes_its_lease_and_deletes_its_keys():
    store = InMemoryStore()
    client = store.client()
    session = Session(client, ttl=5)
    client.put("/member", b"v", lease=session.lease_id)
    session.close()
    session.close()
    assert client.get("/member").kv is None
    assert not session.alive and not session.lost.is_set()
    store.close()


@pytest.mark.parametrize("kwargs", [{"ttl": 0}, {"ttl": 1, "keepalive_interval": 0}])
def test_a_session_rejects_nonsense_timing(kwargs):
    with pytest.raises(ValueError):
        Session(InMemoryStore().client(), **kwargs)


def test_every_session_of_a_client_is_renewed_by_one_thread_that_ends_with_the_last_session():
    store = InMemoryStore()
    client = store.client()
    renewed = []
    original = client.keepalive

    def counting_keepalive(lease_id):
        renewed.append((lease_id, threading.current_thread().name))
        return original(lease_id)

    client.keepalive = counting_keepalive
    threads_before = threading.active_count()
    sessions = [Session(client, ttl=0.9) for _ in range(20)]  # renewed every 0.3 s
    assert threading.active_count() == threads_before + 1
    deadline = time.monotonic() + 5
    while len({lease for lease, _ in renewed}) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {lease for lease, _ in renewed} == {session.lease_id for session in sessions}
    assert len({name for _, name in renewed}) == 1
    time.sleep(1.2)  # longer than the TTL: only the renewals keep them alive
    assert all(session.alive for session in sessions)
    for session in sessions:
        session.close()
    deadline = time.monotonic() + 5
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == threads_before
    assert not any(session.lost.is_set() for session in sessions)


def test_renewals_slower_than_the_interval_follow_each_other_so_the_lease_sees_one_per_round_trip():
    # Issue 27 item 3: a renewal due an interval after the previous one *ended* reached etcd an
    # interval + a round trip after the previous one: at 1 s of latency each way a 3 s lease lapsed.
    store = InMemoryStore()
    client = store.client()
    sent = []
    original = client.keepalive

    def slow_keepalive(lease_id):
        sent.append(time.monotonic())
        time.sleep(0.4)  # the round trip, longer than the 0.3 s interval
        return original(lease_id)

    client.keepalive = slow_keepalive
    session = Session(client, ttl=0.9)
    time.sleep(2.0)
    session.close(revoke=False)
    gaps = [later - earlier for earlier, later in zip(sent, sent[1:])]
    assert len(gaps) >= 3 and max(gaps) < 0.55, gaps  # one round trip apart, not interval + round trip (0.7 s)


def test_an_outage_that_reaches_the_limit_is_reported_once_and_the_session_stays_alive():
    store = InMemoryStore()
    client = store.client()
    reported = []
    with Session(client, ttl=2.0, keepalive_interval=0.1, outage_limit=0.5) as session:
        session.on_outage_limit(reported.append)
        store.stop()
        time.sleep(1.2)
        assert len(reported) == 1 and reported[0] >= 0.5
        assert session.alive
        store.start(renew_leases=True)
    store.close()
