"""KVState: the shared in-memory state machine, driven directly with an injected clock."""

import random

import pytest

from backends.api import EventType
from backends.errors import CompactedError, LeaseNotFoundError, ValueTooLargeError
from backends.kvstate import KVState, StateLimits
from backends.txn import Compare, Delete, Put, Range, Txn


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def state(clock):
    return KVState(clock=clock, rng=random.Random(7))


def kinds(events):
    return [(event.type, event.kv.key, event.revision) for event in events]


# -- revisions and reads ---------------------------------------------------------------------
def test_an_empty_store_is_at_revision_one_and_each_write_bumps_it_by_one(state):
    assert state.revision == 1
    assert state.put("a", b"1").result.revision == 2
    assert state.put("b", b"2").result.revision == 3
    assert state.get("a").revision == 3


def test_put_tracks_create_and_mod_revision_version_and_lease(state):
    state.put("k", b"1")
    kv = state.put("k", b"2").result.current
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) == (b"2", 2, 3, 2, 0)
    assert state.get("k").kv == kv


def test_get_prefix_returns_keys_in_order_and_only_under_the_prefix(state):
    for key in ("p/b", "p/a", "p/c/d", "p", "q/a", "p0"):
        state.put(key, key.encode())
    result = state.get_prefix("p/")
    assert [kv.key for kv in result.kvs] == ["p/a", "p/b", "p/c/d"]
    assert result.revision == state.revision
    assert len(state.get_prefix("").kvs) == 6


def test_get_of_a_missing_key_returns_none_with_the_current_revision(state):
    state.put("x", b"1")
    assert state.get("missing").kv is None and state.get("missing").revision == 2


def test_a_value_over_the_limit_is_refused_and_nothing_changes():
    state = KVState(limits=StateLimits(max_value_bytes=4))
    with pytest.raises(ValueTooLargeError):
        state.put("k", b"12345")
    with pytest.raises(ValueTooLargeError):  # checked in the branch that would not run, too
        state.txn(Txn((Compare.absent("k"),), (), (Put("k", b"12345"),)))
    assert state.revision == 1 and state.get("k").kv is None
    assert state.put("k", b"1234").result.applied


@pytest.mark.parametrize("kwargs", [{"max_value_bytes": 0}, {"history_limit": 0}])
def test_non_positive_limits_are_rejected(kwargs):
    with pytest.raises(ValueError):
        StateLimits(**kwargs)


# -- transactions ----------------------------------------------------------------------------
def test_a_txn_that_writes_bumps_the_revision_once_and_emits_its_events_in_order(state):
    state.put("gone", b"x")
    outcome = state.txn(Txn((Compare.absent("k"),), (Put("k", b"1"), Delete("gone"), Put("j", b"2"))))
    assert outcome.result.succeeded and outcome.result.revision == state.revision == 3
    assert kinds(outcome.events) == [(EventType.PUT, "k", 3), (EventType.DELETE, "gone", 3), (EventType.PUT, "j", 3)]


def test_a_txn_that_writes_nothing_keeps_the_revision_and_emits_nothing(state):
    revision = state.put("k", b"1").result.revision
    refused = state.txn(Txn((Compare.absent("k"),), (Put("k", b"2"),), (Range("k"), Delete("missing"))))
    assert not refused.result.succeeded and refused.events == () and state.revision == revision
    assert refused.result.revision == refused.result.responses[0].revision == revision


def test_a_txn_checks_leases_only_on_the_path_it_takes(state):
    state.put("k", b"1")
    assert not state.txn(Txn((Compare.absent("k"),), (Put("k", b"2", 12345),))).result.succeeded
    with pytest.raises(LeaseNotFoundError):
        state.txn(Txn((Compare.exists("k"),), (Put("j", b"2"), Txn((), (Put("i", b"3", 12345),)))))
    assert state.get("j").kv is None and state.revision == 2


def test_delete_reports_whether_it_applied_and_bumps_the_revision_only_when_it_does(state):
    revision = state.put("k", b"v").result.revision
    removed = state.delete("k")
    assert removed.result.applied and kinds(removed.events) == [(EventType.DELETE, "k", revision + 1)]
    missing = state.delete("k")
    assert not missing.result.applied and missing.events == () and state.revision == revision + 1


def test_put_if_with_expected_zero_means_absent_like_etcd(state):
    assert state.txn(Txn((Compare.mod_revision("k", 0),), (Put("k", b"1"),))).result.succeeded
    assert not state.txn(Txn((Compare.mod_revision("k", 0),), (Put("k", b"2"),))).result.succeeded



def test_delete_prefix_removes_all_keys_in_one_revision(state):
    for key in ("x/1", "x/2", "y"):
        state.put(key, b"v")
    outcome = state.delete_prefix("x/")
    assert outcome.result == 2
    assert kinds(outcome.events) == [(EventType.DELETE, "x/1", 5), (EventType.DELETE, "x/2", 5)]
    assert state.delete_prefix("x/").result == 0 and state.revision == 5
    assert [kv.key for kv in state.get_prefix("").kvs] == ["y"]


def test_a_recreated_key_starts_a_new_life(state):
    state.put("k", b"1")
    state.put("k", b"2")
    state.delete("k")
    kv = state.put("k", b"3").result.current
    assert (kv.create_revision, kv.version) == (5, 1)


# -- leases ----------------------------------------------------------------------------------
def test_lease_ids_are_unique_and_non_zero(state):
    ids = {state.grant(10).id for _ in range(500)}
    assert len(ids) == 500 and 0 not in ids


def test_a_non_positive_ttl_is_rejected(state):
    with pytest.raises(ValueError):
        state.grant(0)


def test_an_expired_lease_deletes_its_keys_in_one_revision_when_swept(state, clock):
    lease = state.grant(5)
    state.put("a", b"1", lease=lease.id)
    state.put("b", b"2", lease=lease.id)
    state.put("free", b"3")
    assert state.next_expiry() == pytest.approx(clock.now + 5)
    clock.advance(4.9)
    assert state.expire_due() == ()
    clock.advance(0.2)
    events = state.expire_due()
    assert kinds(events) == [(EventType.DELETE, "a", 5), (EventType.DELETE, "b", 5)]
    assert [kv.key for kv in state.get_prefix("").kvs] == ["free"]
    assert state.next_expiry() is None
    with pytest.raises(LeaseNotFoundError):
        state.keepalive(lease.id)


def test_keepalive_pushes_the_deadline_back_by_the_full_ttl(state, clock):
    lease = state.grant(5)
    state.put("k", b"v", lease=lease.id)
    clock.advance(4)
    assert state.keepalive(lease.id) == 5
    assert state.next_expiry() == pytest.approx(clock.now + 5)
    clock.advance(4)
    assert state.expire_due() == () and state.get("k").kv is not None


def test_each_expired_lease_gets_its_own_revision_in_deadline_order(state, clock):
    late, early = state.grant(3), state.grant(2)
    state.put("late", b"v", lease=late.id)
    state.put("early", b"v", lease=early.id)
    clock.advance(10)
    assert kinds(state.expire_due()) == [(EventType.DELETE, "early", 4), (EventType.DELETE, "late", 5)]


def test_keepalive_of_lease_zero_or_an_unknown_lease_is_refused(state):
    for lease_id in (0, 12345):
        with pytest.raises(LeaseNotFoundError):
            state.keepalive(lease_id)


def test_a_lease_past_its_deadline_is_refused_even_before_the_sweep(state, clock):
    lease = state.grant(1)
    clock.advance(1)
    with pytest.raises(LeaseNotFoundError):
        state.put("k", b"v", lease=lease.id)
    with pytest.raises(LeaseNotFoundError):
        state.keepalive(lease.id)


def test_revoke_deletes_the_keys_and_reports_whether_the_lease_was_live(state, clock):
    lease = state.grant(30)
    state.put("a", b"v", lease=lease.id)
    outcome = state.revoke(lease.id)
    assert outcome.result is True and kinds(outcome.events) == [(EventType.DELETE, "a", 3)]
    assert state.revoke(lease.id).result is False
    stale = state.grant(1)
    state.put("b", b"v", lease=stale.id)
    clock.advance(2)
    outcome = state.revoke(stale.id)
    assert outcome.result is False and kinds(outcome.events) == [(EventType.DELETE, "b", 5)]


def test_rebinding_a_key_moves_it_to_the_new_lease(state, clock):
    first, second = state.grant(2), state.grant(60)
    state.put("k", b"1", lease=first.id)
    state.put("k", b"2", lease=second.id)
    state.put("unbound", b"1", lease=first.id)
    state.put("unbound", b"2")
    clock.advance(3)
    assert state.expire_due() == ()
    assert state.get("k").kv.lease == second.id and state.get("unbound").kv.lease == 0


# -- history ---------------------------------------------------------------------------------
def test_events_since_replays_matching_events_from_a_revision(state):
    state.put("w/a", b"1")
    state.put("other", b"x")
    state.put("w/b", b"2")
    state.delete("w/a")
    events = state.events_since("w/", 3)
    assert kinds(events) == [(EventType.PUT, "w/b", 4), (EventType.DELETE, "w/a", 5)]
    assert events[0].kv.value == b"2" and events[1].kv.value == b""
    assert state.events_since("w/", 6) == []


def test_explicit_compaction_drops_older_history(state):
    for value in (b"1", b"2", b"3"):
        state.put("k", value)
    state.compact(4)
    assert [event.kv.value for event in state.events_since("", 4)] == [b"3"]
    with pytest.raises(CompactedError) as raised:
        state.events_since("", 3)
    assert (raised.value.requested_revision, raised.value.compact_revision) == (3, 4)
    state.compact(2)
    assert state.compact_revision == 4
    with pytest.raises(ValueError):
        state.compact(99)


def test_the_history_is_bounded_and_never_keeps_part_of_a_revision(clock):
    state = KVState(clock=clock, limits=StateLimits(history_limit=3))
    state.put("a", b"1")
    state.put("b", b"1")
    state.put("c", b"1")
    outcome = state.delete_prefix("")  # three DELETEs at revision 5
    assert len(outcome.events) == 3
    assert state.compact_revision == 5
    assert [event.revision for event in state.events_since("", 5)] == [5, 5, 5]
    state.put("d", b"1")
    assert state.compact_revision == 6
    with pytest.raises(CompactedError):
        state.events_since("", 5)


@pytest.mark.parametrize("sizes, limit, compact_revision", [
    ((100, 100, 100), 10_000, 1),  # all fit
    ((1000, 1000, 1000), 2_500, 3),  # two revisions fit: revision 2 goes
    ((1000, 1000, 5000), 2_500, 4),  # the newest alone is over the limit: it stays, alone
])
def test_the_history_is_bounded_in_bytes_and_keeps_the_newest_revision(clock, sizes, limit, compact_revision):
    state = KVState(clock=clock, limits=StateLimits(history_bytes=limit))
    for size in sizes:
        state.put("k", b"x" * size)
    assert state.compact_revision == compact_revision
    assert state.events_since("", compact_revision)[-1].revision == state.revision


def test_keys_over_the_key_limit_are_refused_and_name_the_limit(clock):
    state = KVState(clock=clock, limits=StateLimits(max_key_bytes=8))
    state.put("12345678", b"v")
    with pytest.raises(ValueTooLargeError, match="at most 8 bytes"):
        state.put("é" * 5, b"v")  # 5 characters, 10 bytes
    with pytest.raises(ValueTooLargeError):
        state.txn(Txn((), (), (Put("c" * 9, b"v"),)))


def test_a_start_revision_below_one_is_rejected(state):
    with pytest.raises(ValueError):
        state.events_since("", 0)
