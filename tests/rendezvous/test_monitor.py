"""MembershipMonitor: classifies a closed round's changes from its rounds/ watch and the
node's state/ watch (owned by Membership), on the backend's delivering thread (no thread of its
own); re-reads once when a watch's history was compacted."""

import logging
import threading
import time

import pytest

from backends.api import EventType, KeyValue, QueueWatch, WatchEvent
from backends.errors import CompactedError
from elastic.rendezvous import records
from elastic.rendezvous.api import MembershipChange
from elastic.rendezvous.round_events import RoundView
from elastic.rendezvous.membership import StateWatch
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
    state_watch = StateWatch(backend, KEYS.state_prefix, threading.Event())
    state_watch.open()
    record_revision = backend.put(KEYS.round, records.encode_round(record))
    return RoundView(KEYS, record, "a", 4, record_revision), state_watch


def _wait(event: threading.Event) -> bool:
    return event.wait(timeout=5)


def test_a_closed_flag_left_in_the_joins_batch_is_not_lost(backend):
    view, state_watch = _closed_round(backend)
    closed = WatchEvent(EventType.PUT, KeyValue(KEYS.closed, records.encode_closed(ClosedRecord("done")), 99, 99))
    state_watch.get(timeout=1)  # the join took the batch with the close (its own round record) ...
    state_watch.hand_back([closed])  # ... and handed back what followed it
    monitor = MembershipMonitor.open(backend, view, state_watch)
    assert monitor.changed.is_set() and monitor.change is MembershipChange.CLOSED
    monitor.stop()


def test_changes_arrive_through_listeners_without_a_thread_of_the_monitors_own(backend):
    view, state_watch = _closed_round(backend)
    threads_before = threading.active_count()
    monitor = MembershipMonitor.open(backend, view, state_watch)
    assert threading.active_count() == threads_before
    assert not monitor.changed.is_set()  # its own round record (replayed by the state watch) is not news
    backend.put(KEYS.node(1, "c"), b"{}")  # a newcomer waits for round 1
    assert _wait(monitor.changed) and monitor.change is MembershipChange.NODES_WAITING
    assert monitor.status.waiting == 1
    monitor.stop()


@pytest.mark.parametrize("waiter, rejoining", [("b", 1), ("c", 0)])  # a member that restarted; a newcomer
def test_the_change_wakes_the_agent_with_its_counts_already_published(backend, waiter, rejoining):
    # The agent reads the status the moment it is woken: a member's rejoin seen there without
    # its count looked like a newcomer's and restarted workers that were finishing the job.
    view, state_watch = _closed_round(backend)
    seen = []
    woken = threading.Event()

    def on_change():
        seen.append(monitor.status)
        woken.set()

    monitor = MembershipMonitor.open(backend, view, state_watch, on_change=lambda: on_change())
    backend.put(KEYS.node(1, waiter), b"{}")
    assert _wait(woken)
    assert (seen[0].change, seen[0].waiting, seen[0].rejoining) == (MembershipChange.NODES_WAITING, 1, rejoining)
    monitor.stop()


def test_a_member_that_leaves_is_lost_even_when_the_monitor_starts_after_it_left(backend):
    view, state_watch = _closed_round(backend)
    monitor = MembershipMonitor.open(backend, view, state_watch)
    backend.delete(KEYS.node(0, "b"))
    assert _wait(monitor.changed) and monitor.change is MembershipChange.MEMBER_LOST
    monitor.stop()
    later = MembershipMonitor.open(backend, view, state_watch)
    assert _wait(later.changed) and later.change is MembershipChange.MEMBER_LOST  # replayed from rounds/
    later.stop()


def test_the_closed_flag_is_seen_on_the_state_watch(backend):
    view, state_watch = _closed_round(backend)
    monitor = MembershipMonitor.open(backend, view, state_watch)
    backend.put(KEYS.closed, records.encode_closed(ClosedRecord("done")))
    assert _wait(monitor.changed) and monitor.change is MembershipChange.CLOSED
    monitor.stop()


def test_stop_leaves_the_state_watch_open_and_cancels_its_own(backend):
    view, state_watch = _closed_round(backend)
    monitor = MembershipMonitor.open(backend, view, state_watch)
    monitor.stop()
    monitor.stop()
    backend.put(KEYS.closed, records.encode_closed(ClosedRecord("done")))
    assert not monitor.changed.is_set()
    keys = [event.kv.key for event in state_watch.get(timeout=1)]
    assert KEYS.closed in keys  # the node's watch still works, and the monitor no longer reads it


# -- a compacted watch: one re-read at one revision ------------------------------------------------
def _compact(watch) -> None:
    watch.fail(CompactedError("history compacted (injected)", requested_revision=1, compact_revision=99))


class _Recording:
    """A backend that keeps every watch it opens, so a test can fail one as a backend would.

    ``cut``: the first rounds/ watch is cut off from the store (it never delivers), as a
    watch is between losing its stream and failing to resume from compacted history.
    """

    def __init__(self, backend, cut=False):
        self._backend = backend
        self._cut = cut
        self.watches = []

    def watch_prefix(self, prefix, start_revision=None):
        if self._cut and prefix == KEYS.rounds_prefix:
            self._cut = False
            watch = QueueWatch(start_revision or 1)
        else:
            watch = self._backend.watch_prefix(prefix, start_revision)
        self.watches.append((prefix, watch))
        return watch

    def rounds_watch(self):
        return [watch for prefix, watch in self.watches if prefix == KEYS.rounds_prefix][-1]

    def __getattr__(self, name):
        return getattr(self._backend, name)


def _wait_for(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_compacted_rounds_watch_with_nothing_changed_is_no_change_and_watching_goes_on(backend, caplog):
    view, state_watch = _closed_round(backend)
    recording = _Recording(backend)
    monitor = MembershipMonitor.open(recording, view, state_watch)
    with caplog.at_level(logging.WARNING, logger="elastic.rendezvous.monitor"):
        _compact(recording.rounds_watch())
        _wait_for(lambda: "re-read at revision" in caplog.text)
    assert "watch history was compacted" in caplog.text and "nothing changed" in caplog.text
    assert monitor.status.change is None and not monitor.changed.is_set()
    backend.delete(KEYS.node(0, "b"))  # the new rounds/ watch carries on from the re-read
    assert _wait(monitor.changed) and monitor.change is MembershipChange.MEMBER_LOST
    monitor.stop()


def test_a_member_lost_while_the_history_was_compacted_is_named(backend):
    view, state_watch = _closed_round(backend)
    recording = _Recording(backend, cut=True)
    monitor = MembershipMonitor.open(recording, view, state_watch)
    backend.delete(KEYS.node(0, "b"))  # in the gap: the cut watch never delivers it
    backend.put(KEYS.node(1, "spare"), b"{}")
    assert not monitor.changed.is_set()
    _compact(recording.rounds_watch())
    assert _wait(monitor.changed)
    assert monitor.change is MembershipChange.MEMBER_LOST and "member lost: b" in monitor.reason
    assert monitor.status.waiting == 1  # the waiting node the re-read found is counted too
    monitor.stop()


def test_a_compacted_state_watch_is_re_opened_by_its_owner_and_the_round_closed_later_is_seen(backend):
    view, state_watch = _closed_round(backend)
    monitor = MembershipMonitor.open(backend, view, state_watch)
    old = state_watch.ensure_open()
    _compact(old)
    _wait_for(lambda: state_watch.ensure_open() is not old)
    _wait_for(lambda: monitor._held is None)  # the re-read is done
    assert monitor.change is None
    backend.put(KEYS.closed, records.encode_closed(ClosedRecord("done")))
    assert _wait(monitor.changed) and monitor.change is MembershipChange.CLOSED
    monitor.stop()


def test_a_re_read_that_finds_corrupt_state_reports_it_once_and_watching_goes_on(backend):
    view, state_watch = _closed_round(backend)
    recording = _Recording(backend, cut=True)
    monitor = MembershipMonitor.open(recording, view, state_watch)
    backend.put(KEYS.round, b"garbage")
    _compact(recording.rounds_watch())
    _wait_for(lambda: monitor._held is None and len(recording.watches) >= 2)
    assert KEYS.round in monitor.problem and monitor.change is None
    backend.delete(KEYS.node(0, "b"))  # watched from the re-read on
    assert _wait(monitor.changed) and monitor.change is MembershipChange.MEMBER_LOST
    monitor.stop()


@pytest.mark.parametrize(("change", "key", "member", "reason"), [
    (MembershipChange.MEMBER_LOST, "/elastic/job/rounds/3/nodes/host-a-12-ab", True,
     "member lost: host-a-12-ab in round 3 (its lease expired: its agent was killed, hung or cut off from the store)"),
    (MembershipChange.NODES_WAITING, "/elastic/job/rounds/4/nodes/host-b-34-cd", False,
     "a node is waiting to join: host-b-34-cd (round 4)"),
    (MembershipChange.NODES_WAITING, "/elastic/job/rounds/4/nodes/host-b-34-cd", True,  # a member of round 3
     "a member rejoins: host-b-34-cd (round 4)"),
    (MembershipChange.MEMBER_LOST, "/elastic/job/other", False, "member lost (/elastic/job/other vanished)"),
])
def test_a_change_seen_on_a_node_key_names_the_node_and_the_round(change, key, member, reason):
    from elastic.rendezvous.round_events import MonitorState
    from elastic.rendezvous.monitor import _describe

    node = records.RendezvousKeys("/elastic", "job").parse_node_key(key)
    assert _describe(change, key, MonitorState(), node, member) == reason
