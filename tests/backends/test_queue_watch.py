"""QueueWatch: the producer/consumer watch every backend feeds."""

import threading

import pytest

from backends.api import EventType, KeyValue, QueueWatch, WatchEvent
from backends.errors import BackendClosedError, CompactedError


def put(revision, key="k"):
    return WatchEvent(EventType.PUT, KeyValue(key, b"v", revision, revision))


def test_events_come_out_in_order_and_in_batches():
    watch = QueueWatch(start_revision=5)
    watch.deliver([put(5), put(6)])
    watch.deliver([put(7)])
    assert [event.revision for event in watch.get(timeout=1)] == [5, 6, 7]
    assert watch.last_revision == 7


def test_redelivered_events_after_a_resume_are_dropped():
    watch = QueueWatch(start_revision=1)
    watch.deliver([put(1), put(2)])
    watch.deliver([put(2), put(3)])
    assert [event.revision for event in watch.get(timeout=1)] == [1, 2, 3]
    assert watch.delivered_revision == 3


def test_get_returns_an_empty_list_when_the_timeout_passes():
    assert QueueWatch(start_revision=1).get(timeout=0.05) == []


def test_a_failure_is_raised_after_the_events_before_it_and_then_every_time():
    watch = QueueWatch(start_revision=1)
    watch.deliver([put(1)])
    watch.fail(CompactedError("gone", requested_revision=2, compact_revision=9))
    assert [event.revision for event in watch.get(timeout=1)] == [1]
    for _ in range(2):
        with pytest.raises(CompactedError):
            watch.get(timeout=1)


def test_cancel_wakes_a_blocked_reader_and_runs_the_hook_once():
    hooks = []
    watch = QueueWatch(start_revision=1, on_cancel=lambda: hooks.append(1))
    errors = []

    def reader():
        try:
            watch.get(timeout=10)
        except BackendClosedError as error:
            errors.append(error)

    thread = threading.Thread(target=reader)
    thread.start()
    watch.cancel()
    watch.cancel()
    thread.join(timeout=5)
    assert errors and hooks == [1]
    watch.deliver([put(9)])
    with pytest.raises(BackendClosedError):
        watch.get(timeout=0)


def test_a_listener_is_called_on_each_delivery_and_failure_and_at_once_if_events_wait():
    watch = QueueWatch(start_revision=1)
    watch.deliver([put(1)])
    calls = []
    watch.set_listener(lambda: calls.append(watch.get(timeout=0)))
    assert calls == [[put(1)]]  # already queued: called at once
    watch.deliver([put(2)])
    watch.deliver([put(2)])  # a redelivery queues nothing and calls nobody
    assert [[event.revision for event in batch] for batch in calls] == [[1], [2]]
    watch.set_listener(None)
    watch.deliver([put(3)])
    assert len(calls) == 2
    seen = []
    watch.set_listener(lambda: seen.append("called"))
    assert seen == ["called"]  # revision 3 was waiting
    watch.get(timeout=0)
    watch.fail(CompactedError("gone", requested_revision=4, compact_revision=9))
    assert seen == ["called", "called"]
    with pytest.raises(CompactedError):
        watch.get(timeout=0)


def test_begin_after_moves_the_start_of_a_watch_from_now():
    watch = QueueWatch(start_revision=0)
    watch.begin_after(41)
    assert (watch.last_revision, watch.delivered_revision) == (41, 41)
    watch.deliver([put(41), put(42)])  # the server reports only what follows its start
    assert [event.revision for event in watch.get(timeout=1)] == [42]
