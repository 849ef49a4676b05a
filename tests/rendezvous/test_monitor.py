"""MembershipMonitor: classifies a closed round's changes from the rounds/ watch and the
handler's state/ watch, on the backend's delivering thread (no thread of its own)."""

import threading

import pytest

from backends.api import EventType, KeyValue, WatchEvent
from elastic.rendezvous import records
from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.decisions import RoundView
from elastic.rendezvous.monitor import MembershipMonitor
from elastic.rendezvous.records import ClosedRecord, Member, RendezvousKeys, RoundRecord
from elastic.testing.fake_store import FakeHarness

KEYS = RendezvousKeys("/monitor-test", "run")


@pytest.fixture
def backend():
    harness = FakeHarness()
    client = harness.connect()
    yield client
    client.close()
    harness.close()


def _closed_round(backend):
    """Round 0 with members a and b (both joined), recorded in state/; returns the view and a state watch."""
    backend.put(KEYS.node(0, "a"), b"{}")
    members_revision = backend.put(KEYS.node(0, "b"), b"{}")
    record = RoundRecord(0, (Member("a", "h", 1), Member("b", "h", 2)), members_revision)
    state_watch = backend.watch_prefix(KEYS.state_prefix)
    record_revision = backend.put(KEYS.round, records.encode_round(record))
    return RoundView(KEYS, record, "a", 4, record_revision), state_watch


def _wait(event: threading.Event) -> bool:
    return event.wait(timeout=5)


def test_a_closed_flag_left_in_the_joins_batch_is_not_lost(backend):
    view, state_watch = _closed_round(backend)
    closed = WatchEvent(EventType.PUT, KeyValue(KEYS.closed, records.encode_closed(ClosedRecord("done")), 99, 99))
    monitor = MembershipMonitor(backend, view, view.record.members_revision + 1, state_watch, [closed])
    assert monitor.changed.is_set() and monitor.change is MembershipChange.CLOSED
    monitor.stop()


def test_changes_arrive_through_listeners_without_a_thread_of_the_monitors_own(backend):
    view, state_watch = _closed_round(backend)
    threads_before = threading.active_count()
    monitor = MembershipMonitor(backend, view, view.record.members_revision + 1, state_watch)
    assert threading.active_count() == threads_before
    assert not monitor.changed.is_set()  # its own round record (replayed by the state watch) is not news
    backend.put(KEYS.node(1, "c"), b"{}")  # a newcomer waits for round 1
    assert _wait(monitor.changed) and monitor.change is MembershipChange.NODES_WAITING
    assert monitor.num_nodes_waiting == 1
    monitor.stop()


def test_a_member_that_leaves_is_lost_even_when_the_monitor_starts_after_it_left(backend):
    view, state_watch = _closed_round(backend)
    monitor = MembershipMonitor(backend, view, view.record.members_revision + 1, state_watch)
    backend.delete(KEYS.node(0, "b"))
    assert _wait(monitor.changed) and monitor.change is MembershipChange.MEMBER_LOST
    monitor.stop()
    later = MembershipMonitor(backend, view, view.record.members_revision + 1, state_watch)
    assert _wait(later.changed) and later.change is MembershipChange.MEMBER_LOST  # replayed from rounds/
    later.stop()


def test_the_closed_flag_is_seen_on_the_state_watch(backend):
    view, state_watch = _closed_round(backend)
    monitor = MembershipMonitor(backend, view, view.record.members_revision + 1, state_watch)
    backend.put(KEYS.closed, records.encode_closed(ClosedRecord("done")))
    assert _wait(monitor.changed) and monitor.change is MembershipChange.CLOSED
    monitor.stop()


def test_stop_hands_the_state_watch_back_open_and_cancels_its_own(backend):
    view, state_watch = _closed_round(backend)
    monitor = MembershipMonitor(backend, view, view.record.members_revision + 1, state_watch)
    monitor.stop()
    monitor.stop()
    backend.put(KEYS.closed, records.encode_closed(ClosedRecord("done")))
    assert not monitor.changed.is_set()
    keys = [event.kv.key for event in state_watch.get(timeout=1)]
    assert KEYS.closed in keys  # the handler's watch still works, and the monitor no longer reads it
