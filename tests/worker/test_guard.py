"""The registry of collectives in flight and the graveyard, with works we complete by hand."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from elastic.worker.errors import CollectiveFailed, Superseded
from elastic.worker.guard import Graveyard, OpRegistry
from fake_works import Clock, FutureWork


class BlockingWork:
    """A work without a future (like a gloo send/recv): wait() blocks until released."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.error: Exception | None = None

    def get_future(self):
        raise RuntimeError("Work::getFuture not implemented.")

    def wait(self):
        self.released.wait(10)
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return self.released.is_set()


def test_an_op_settles_with_its_value_when_the_work_succeeds():
    registry = OpRegistry(3, "run t")
    work = FutureWork()
    op = registry.launch([work], lambda: "value")
    work.future.set_result(None)
    assert op.wait() == "value" and registry.failure is None


def test_a_failed_work_becomes_collective_failed_and_marks_the_group():
    registry = OpRegistry(3, "run t")
    work = FutureWork()
    op = registry.launch([work])
    work.future.set_exception(RuntimeError("[pair.cc:553] Connection closed by peer\nmore"))
    with pytest.raises(CollectiveFailed, match="round 3: a collective failed: .*Connection closed by peer$") as caught:
        op.wait()
    assert registry.failure is caught.value and caught.value.round == 3
    with pytest.raises(CollectiveFailed):  # the group is lost: a new launch fails at once
        registry.launch([FutureWork()]).wait()


def test_a_failed_work_is_not_kept_alive_by_the_error_that_reports_it():
    # The error outlives the group (DDP's reducer and the caller hold it); were its cause's
    # traceback kept, its frame would hold the op and the works, and with them the group's
    # sockets and threads, until a full garbage collection that may never come.
    registry = OpRegistry(3, "run t")
    work = FutureWork()
    released = []
    weakref.finalize(work, released.append, True)
    op = registry.launch([work])
    work.future.set_exception(RuntimeError("Connection reset by peer"))
    with pytest.raises(CollectiveFailed) as caught:
        op.wait()
    error = caught.value
    assert error.__cause__.__traceback__ is None
    gc.disable()  # only reference counting may free the work: no cycle may hold it
    try:
        del work, op, caught
        registry.close("left")
        del registry
        assert released == [True], [type(r).__name__ for r in gc.get_referrers(error)]
    finally:
        gc.enable()
    assert "Connection reset by peer" in str(error)


def test_works_without_a_future_are_waited_on_by_a_helper_thread():
    registry = OpRegistry(1, "run t")
    works = [BlockingWork(), BlockingWork()]
    op = registry.launch(works, lambda: 7)
    assert not op.future.done()
    for work in works:
        work.released.set()
    assert op.wait() == 7


def test_a_blocking_work_that_fails_fails_the_op():
    registry = OpRegistry(1, "run t")
    work = BlockingWork()
    work.error = RuntimeError("Connection reset by peer")
    op = registry.launch([work])
    work.released.set()
    with pytest.raises(CollectiveFailed, match="Connection reset"):
        op.wait()


def test_an_interrupt_abandons_only_ops_older_than_the_cutoff():
    clock = Clock()
    registry = OpRegistry(4, "run t", clock)
    old = registry.launch([FutureWork()])
    clock.now = 101.0
    young = registry.launch([FutureWork()])
    assert registry.interrupt_older_than(100.5, 5) == 1
    with pytest.raises(Superseded, match="round 5 is pending"):
        old.wait()
    assert not young.future.done()
    assert isinstance(registry.failure, Superseded)


def test_an_interrupt_wakes_a_thread_blocked_on_the_op():
    registry = OpRegistry(4, "run t")
    op = registry.launch([FutureWork()])
    threading.Timer(0.05, lambda: registry.interrupt_older_than(time.monotonic(), 5)).start()
    started = time.monotonic()
    with pytest.raises(Superseded):
        op.wait()
    assert time.monotonic() - started < 2.0


def test_a_late_result_after_an_interrupt_is_ignored():
    registry = OpRegistry(4, "run t")
    work = FutureWork()
    op = registry.launch([work])
    registry.interrupt_older_than(time.monotonic(), 5)
    work.future.set_result(None)
    with pytest.raises(Superseded):
        op.wait()


def test_a_peer_outside_the_group_can_abandon_every_op_in_flight_as_a_failure():
    registry = OpRegistry(4, "run t")
    first, second = registry.launch([FutureWork()]), registry.launch([FutureWork()])
    assert registry.abandon("shard partner 1 saw the group fail") == 2
    for op in (first, second):
        with pytest.raises(CollectiveFailed, match="round 4: shard partner 1 saw the group fail"):
            op.wait()
    assert isinstance(registry.failure, CollectiveFailed)


def test_close_fails_ops_in_flight_and_returns_the_works_still_running():
    registry = OpRegistry(2, "run t")
    running, finished = FutureWork(), FutureWork()
    op = registry.launch([running])
    registry.launch([finished])
    finished.future.set_result(None)
    assert registry.close("a newer round") == [running]
    with pytest.raises(Superseded, match="the group was left"):
        op.wait()
    with pytest.raises(Superseded):
        registry.launch([FutureWork()]).wait()


def test_the_graveyard_keeps_a_group_until_its_works_end():
    clock = Clock()
    graveyard = Graveyard(clock)
    group = object()
    work = FutureWork()
    graveyard.bury(group, [work])
    graveyard.bury(object(), [])  # nothing running: not kept
    assert graveyard.reap() == 1
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        clock.now += seconds

    assert graveyard.drain(0.2, sleep) == 1 and sum(slept) >= 0.2
    work.future.set_result(None)
    assert graveyard.reap() == 0 and graveyard.drain(5.0, sleep) == 0
