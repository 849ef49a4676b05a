"""Why a member of the last round is gone: who is still expected, who is lost, and why.

Case tables for the pure parts; :class:`LostNodes` and the departure notes on the in-process
store; real handlers for the notes a shutdown, an exclusion and a finished node leave.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from elastic.rendezvous import records
from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.departures import (
    LEASE_EXPIRED, Departure, DepartureRecord, LostNodes, absent_members, decode_departure, departed_key,
    encode_departure, say_departure, why_lost,
)
from elastic.rendezvous.errors import RendezvousStateError
from elastic.rendezvous.handler import NodeSpec, RendezvousHandler
from elastic.rendezvous.progress import LostNode
from elastic.rendezvous.records import Member, RendezvousKeys, RoundRecord
from elastic.rendezvous.settings import RendezvousSettings
from elastic.testing.fake_store import FakeHarness


def round_of(number: int, *nodes: str) -> RoundRecord:
    return RoundRecord(number, tuple(Member(node, "127.0.0.1", 29500 + i) for i, node in enumerate(nodes)), 1)


@pytest.mark.parametrize("previous, forming, joined, alive, expected, lost", [
    (None, 0, [], None, None, ()),  # the first round: nobody is expected
    (round_of(0, "a", "b", "c"), 1, ["a"], {"b", "c"}, ("b", "c"), ()),  # alive: about to rejoin
    (round_of(0, "a", "b", "c"), 1, ["a"], {"c"}, ("c",), ("b",)),  # b's key is gone: lost
    (round_of(0, "a", "b", "c"), 1, ["a", "b"], set(), (), ("c",)),  # b rejoined (its old key went with it)
    (round_of(0, "a", "b"), 1, ["a"], None, ("b",), ()),  # alive not known: still expected
    (round_of(0, "a", "b"), 3, ["a"], set(), None, ()),  # not the round before: nothing known
])
def test_absent_members_are_expected_while_their_key_lives_and_lost_after(previous, forming, joined, alive,
                                                                           expected, lost):
    assert absent_members(previous, forming, joined, alive) == (expected, lost)


@pytest.mark.parametrize("departure, exclusion, why", [
    (None, None, LEASE_EXPIRED),
    (DepartureRecord(4, Departure.LEFT), None, "its agent shut down"),
    (DepartureRecord(5, Departure.FINISHED), None, "its workers finished and its agent left"),
    (DepartureRecord(4, Departure.TIMED_OUT), None, "it gave up at its join timeout"),
    (DepartureRecord(4, Departure.EXCLUDED, "3 failures in a row"), "3 failures in a row",
     "it was excluded: 3 failures in a row"),
    (None, "3 failures in a row", "it was excluded: 3 failures in a row"),  # the mark, without a note
    (None, "", "it was excluded"),
    (DepartureRecord(2, Departure.LEFT), None, LEASE_EXPIRED),  # a note of an earlier round is stale
])
def test_why_a_member_is_lost(departure, exclusion, why):
    assert why_lost(departure, exclusion, previous_round=4) == why


def test_a_departure_note_round_trips_and_a_corrupt_one_is_a_state_error():
    record = DepartureRecord(7, Departure.EXCLUDED, "bad GPU")
    assert decode_departure("k", encode_departure(record)) == record
    for raw in (b"{", b'{"v": 1, "round": 1, "why": "left"}', b'{"v": 2, "round": -1, "why": "left"}',
                b'{"v": 2, "round": 1, "why": "bored"}', b"[]"):
        with pytest.raises(RendezvousStateError, match="departure note"):
            decode_departure("k", raw)


@pytest.fixture
def store():
    harness = FakeHarness()
    backend = harness.connect()
    yield backend
    backend.close()
    harness.close()


def test_lost_nodes_reads_why_once_and_never_names_a_node_that_rejoined(store):
    keys = RendezvousKeys(f"/dep-{uuid.uuid4().hex[:6]}", "job")
    say_departure(store, keys, "b", DepartureRecord(1, Departure.LEFT))
    store.put(keys.excluded("c"), records.encode_exclusion("2 failures in a row", 60))
    store.put(keys.node(2, "e"), b"joined")  # e rejoined between the reads: not lost
    lost = LostNodes(store, keys)
    assert lost.lost(["b", "c", "d", "e"], 1, 2) == (
        LostNode("b", "its agent shut down"), LostNode("c", "it was excluded: 2 failures in a row"),
        LostNode("d", LEASE_EXPIRED))
    store.delete(departed_key(keys, 1, "b"))
    assert lost.lost(["b"], 1, 2) == (LostNode("b", "its agent shut down"),)  # read once per join
    lost.reset()
    assert lost.lost(["b"], 1, 2) == (LostNode("b", LEASE_EXPIRED),)
    say_departure(store, keys, "f", DepartureRecord(2, Departure.TIMED_OUT))  # it rejoined round 2, then left it
    assert lost.lost(["f"], 1, 2) == (LostNode("f", "it gave up at its join timeout"),)


def test_a_departure_note_expires_with_its_lease(store):
    keys = RendezvousKeys(f"/dep-{uuid.uuid4().hex[:6]}", "job")
    say_departure(store, keys, "b", DepartureRecord(1, Departure.LEFT))
    kv = store.get(departed_key(keys, 1, "b")).kv
    assert kv is not None and kv.lease != 0  # bound to a lease of its own


def test_handlers_leave_notes_saying_whether_they_left_finished_or_were_excluded():
    harness = FakeHarness()
    settings = RendezvousSettings("job", 3, 3, namespace=f"/dep-{uuid.uuid4().hex[:8]}", lease_ttl=2.0,
                                  join_timeout=10.0, last_call_timeout=0.5)
    handlers = [RendezvousHandler(settings, harness.connect(), NodeSpec("127.0.0.1", node_id=name), owns_backend=True)
                for name in ("a", "b", "c")]
    keys, reader = handlers[0].keys, harness.connect()
    try:
        with ThreadPoolExecutor(3) as pool:
            assert {info.round for info in pool.map(lambda h: h.next_rendezvous(), handlers)} == {0}
        handlers[0].shutdown()
        handlers[1].exclude(30.0, "2 failures in a row")
        handlers[2].finish(0.1)
        handlers[2].shutdown()

        def note(node: str) -> DepartureRecord:
            kv = reader.get(departed_key(keys, 0, node)).kv
            return decode_departure(kv.key, kv.value)

        assert note("a") == DepartureRecord(0, Departure.LEFT)
        assert note("b") == DepartureRecord(0, Departure.EXCLUDED, "2 failures in a row")
        assert note("c") == DepartureRecord(0, Departure.FINISHED)
    finally:
        for handler in handlers:
            handler.shutdown()
        reader.close()
        harness.close()


def test_a_node_that_closed_the_rendezvous_leaves_no_note():
    harness = FakeHarness()
    settings = RendezvousSettings("job", 1, 1, namespace=f"/dep-{uuid.uuid4().hex[:8]}", lease_ttl=2.0)
    handler = RendezvousHandler(settings, harness.connect(), NodeSpec("127.0.0.1", node_id="a"), owns_backend=True)
    reader = harness.connect()
    try:
        handler.next_rendezvous()
        handler.set_closed()
        handler.shutdown()
        assert reader.get(departed_key(handler.keys, 0, "a")).kv is None  # nobody waits for it
    finally:
        reader.close()
        harness.close()


@pytest.mark.parametrize("leave, why", [
    (lambda handler: handler.shutdown(), "its agent shut down"),
    (lambda handler: handler.exclude(30.0, "2 failures in a row"), "it was excluded: 2 failures in a row"),
])
def test_a_member_names_why_a_peer_left_as_soon_as_its_key_goes(leave, why):
    """The note lies beside the join key, under the ``rounds/`` watch: the survivor's monitor sees
    it before the DELETE and names why in its first line, not "its lease expired, or it left"."""
    harness = FakeHarness()
    settings = RendezvousSettings("job", 1, 2, namespace=f"/dep-{uuid.uuid4().hex[:8]}", lease_ttl=2.0,
                                  join_timeout=10.0, last_call_timeout=0.5)
    a, b = (RendezvousHandler(settings, harness.connect(), NodeSpec("127.0.0.1", node_id=name), owns_backend=True)
            for name in ("a", "b"))
    try:
        with ThreadPoolExecutor(2) as pool:
            assert {info.group_world_size for info in pool.map(lambda h: h.next_rendezvous(), (a, b))} == {2}
        leave(b)
        deadline = time.monotonic() + 10
        while a.membership().change is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert a.membership().change is MembershipChange.MEMBER_LOST
        assert a.membership().reason == f"member lost: b in round 0 ({why})"
    finally:
        a.shutdown()
        b.shutdown()
        harness.close()
