"""The join, close and re-read transactions, run on the in-memory store (the shared KVState semantics)."""

from __future__ import annotations

import pytest

from backends.api import EventType
from backends.fake import InMemoryStore
from elastic.rendezvous.reconcile import RoundSnapshot
from elastic.rendezvous.errors import RendezvousStateError
from elastic.rendezvous.records import ClosedRecord, Member, RendezvousKeys, RoundRecord, encode_closed, encode_round
from elastic.rendezvous.transactions import (
    close_txn,
    join_txn,
    read_close,
    read_join,
    read_reread,
    reread_txn,
)

KEYS = RendezvousKeys("/ns", "job")


@pytest.fixture
def backend():
    store = InMemoryStore()
    client = store.client()
    yield client
    client.close()
    store.close()


def join(backend, node, forming=0, previous=None, expected=None):
    lease = backend.grant(30).id
    txn = join_txn(KEYS, forming, node, node.encode(), lease, previous, expected)
    return read_join(backend.txn(txn), KEYS.closer(forming), expected is not None)


def test_the_first_joiner_claims_the_closer_and_later_joiners_read_it_and_count_themselves(backend):
    first, second, third = join(backend, "a"), join(backend, "b"), join(backend, "c")
    assert [o.count for o in (first, second, third)] == [1, 2, 3]
    assert {o.closer.value for o in (first, second, third)} == {b"a"}
    assert first.closer.create_revision == first.revision  # created by that join
    assert backend.get(KEYS.node(0, "c")).kv.value == b"c"


@pytest.mark.parametrize("expected, joined", [(0, True), (7, False)])
def test_a_guarded_join_writes_only_when_the_round_record_is_the_one_expected_and_always_reads_state(
        backend, expected, joined):
    outcome = join(backend, "a", expected=expected)
    assert outcome.joined is joined
    assert outcome.state is not None
    assert (backend.get(KEYS.node(0, "a")).kv is not None) is joined
    assert [kv.key for kv in outcome.state.kvs] == ([KEYS.closer(0)] if joined else [])


def test_a_guarded_join_writes_nothing_once_the_rendezvous_is_closed(backend):
    backend.put(KEYS.closed, b"{}")
    outcome = join(backend, "a", expected=0)
    assert not outcome.joined and [kv.key for kv in outcome.state.kvs] == [KEYS.closed]


def test_joining_the_next_round_drops_the_key_of_the_previous_one_at_the_same_revision(backend):
    join(backend, "a")
    with backend.watch_prefix(KEYS.root) as watch:
        outcome = join(backend, "a", forming=1, previous=KEYS.node(0, "a"))
        events = watch.get(timeout=5)
    assert backend.get(KEYS.node(0, "a")).kv is None
    assert {(event.type, event.kv.key, event.revision) for event in events} == {
        (EventType.PUT, KEYS.node(1, "a"), outcome.revision),
        (EventType.PUT, KEYS.closer(1), outcome.revision),
        (EventType.DELETE, KEYS.node(0, "a"), outcome.revision),
    }


def test_a_close_writes_the_record_and_drops_the_claim_only_when_the_round_record_is_unchanged(backend):
    join(backend, "a")
    closed = read_close(backend.txn(close_txn(KEYS, 0, b"round-0", 0)))
    assert closed.applied and closed.current.value == b"round-0" and closed.current.mod_revision == closed.revision
    assert backend.get(KEYS.closer(0)).kv is None
    late = read_close(backend.txn(close_txn(KEYS, 0, b"other", 0)))
    assert not late.applied and late.current.value == b"round-0"


def test_a_re_read_shows_the_round_the_next_round_and_state_at_one_revision(backend):
    record = RoundRecord(3, (Member("a", "h", 1), Member("b", "h", 2), Member("c", "h", 3)))
    backend.put(KEYS.round, encode_round(record))
    for key in (KEYS.node(3, "a"), KEYS.node(3, "c"), KEYS.done(3, "c"), KEYS.node(4, "new"), KEYS.node(2, "old"),
                KEYS.node(5, "far")):
        backend.put(key, b"{}")
    result = backend.txn(reread_txn(KEYS, 3))
    snapshot = read_reread(KEYS, 3, result)
    assert snapshot == RoundSnapshot(result.revision, record, False, frozenset({"a", "c"}), frozenset({"c"}),
                                     frozenset({"new"}))
    backend.put(KEYS.closed, encode_closed(ClosedRecord("done")))
    assert read_reread(KEYS, 3, backend.txn(reread_txn(KEYS, 3))).closed


def test_a_re_read_of_a_corrupt_round_record_names_the_key(backend):
    backend.put(KEYS.round, b"garbage")
    with pytest.raises(RendezvousStateError, match="state/round"):
        read_reread(KEYS, 0, backend.txn(reread_txn(KEYS, 0)))
