"""Store calls in tracked daemon threads (elastic/worker/leftover.py): their outcome, the
tracking set (only calls still running), and the bounded wait for those left behind. Unit tests:
plain Python calls stand for store calls; the clock is faked where the bound is checked."""

from __future__ import annotations

import itertools
import threading

import pytest

from elastic.worker.leftover import leftovers, start_call, wait_for_leftovers


@pytest.fixture
def release():
    """An event the blocked calls of one test wait for; set at the end, and their threads waited for."""
    gate = threading.Event()
    yield gate
    gate.set()
    assert wait_for_leftovers(10.0) == 0


def _raise(error: Exception):
    raise error


@pytest.mark.parametrize("fn, value, error", [
    (lambda: 7, 7, None),
    (lambda: None, None, None),
    (lambda: _raise(RuntimeError("store gone")), None, RuntimeError),
    (lambda: _raise(ValueError("garbage")), None, ValueError),
], ids=["returns a value", "returns None", "raises a store error", "raises on garbage"])
def test_a_call_that_ends_gives_its_value_or_its_error_and_is_tracked_no_more(fn, value, error):
    call = start_call(fn, name="test-call")
    assert call.wait(10.0)
    assert call.done
    if error is None:
        assert call.error is None and call.value == value
    else:
        assert isinstance(call.error, error)
        with pytest.raises(RuntimeError, match="raised"):
            call.value
    call.thread.join(10.0)
    assert leftovers() == 0


def test_a_call_still_running_is_tracked_until_its_thread_ends(release):
    call = start_call(release.wait, name="test-blocked")
    assert not call.wait(0.01)
    assert not call.done
    assert call.thread.daemon and call.thread.name == "test-blocked"
    with pytest.raises(RuntimeError, match="still runs"):
        call.value
    assert leftovers() == 1
    release.set()
    assert wait_for_leftovers(10.0) == 0
    assert leftovers() == 0
    assert call.value is True


def test_the_tracking_set_holds_only_running_calls_however_many_were_started(release):
    for _ in range(200):
        start_call(lambda: None, name="test-quick").thread.join(10.0)
    start_call(release.wait, name="test-blocked")
    assert leftovers() == 1


@pytest.mark.parametrize("blocked, timeout, running", [
    (0, 0.0, 0),
    (0, 5.0, 0),
    (1, 0.0, 1),
    (2, 0.0, 2),
    (2, 3.0, 2),
], ids=["nothing, no wait", "nothing, a wait", "one, no wait", "two, no wait", "two, a wait that ends"])
def test_the_wait_returns_how_many_still_run_once_its_fake_clock_passes_the_bound(release, blocked, timeout, running):
    for _ in range(blocked):
        start_call(release.wait, name="test-blocked")
    ticks = itertools.count(0.0, 0.5)  # every look at the clock: half a second later
    reads: list[float] = []

    def clock() -> float:
        reads.append(next(ticks))
        return reads[-1]

    assert wait_for_leftovers(timeout, clock) == running
    if running and timeout:
        assert reads[-1] >= reads[0] + timeout  # waited until the fake clock passed the bound
        assert reads[-2] < reads[0] + timeout  # and no longer
    if running and not timeout:
        assert len(reads) == 2  # no join at all


def test_the_wait_ends_as_soon_as_the_calls_left_behind_end(release):
    calls = [start_call(release.wait, name="test-blocked") for _ in range(3)]
    threading.Timer(0.2, release.set).start()
    assert wait_for_leftovers(60.0) == 0
    assert all(call.done and not call.thread.is_alive() for call in calls)


def test_a_negative_wait_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"The wait for store calls left behind \(-1\) must not be negative\."):
        wait_for_leftovers(-1)
