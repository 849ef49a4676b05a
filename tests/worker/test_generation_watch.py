"""The generation watch (elastic/worker/regroup.py) keeps no round's store alive that it no longer
watches: a store held there is a client socket to a round's master held open (a fake store here;
the live-recovery end-to-end tests count the real fds)."""

from __future__ import annotations

import time
import weakref

import pytest

from elastic.worker.regroup import GenerationWatch


class _Store:
    """A round's store under its prefix whose generation key is absent (generation 0)."""

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.reads = 0

    def check(self, keys):
        self.reads += 1
        if self.fails:
            raise RuntimeError("Connection reset by peer")
        return False

    def get(self, key):
        raise AssertionError("the key is absent")


def _until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.fixture
def watch():
    watch = GenerationWatch("test", interval=0.01)
    watch.start()
    yield watch
    watch.stop()


def test_a_store_no_longer_watched_is_released_by_the_watch_thread(watch):
    store = _Store()
    watch.watch(store, 0)
    assert _until(lambda: store.reads >= 2)
    watch.clear()
    gone = weakref.ref(store)
    del store
    assert _until(lambda: gone() is None), "the watch thread still holds the store it no longer watches"


def test_a_store_whose_read_failed_is_known_unreachable_until_another_is_watched(watch):
    dead, next_one = _Store(fails=True), _Store()
    watch.watch(dead, 0)
    assert _until(lambda: watch.unreachable(dead))
    watch.clear()
    assert watch.unreachable(dead)  # a loss after the group was left still skips the dead store
    watch.watch(next_one, 0)
    assert not watch.unreachable(dead) and not watch.unreachable(next_one)
    gone = weakref.ref(dead)
    del dead
    assert _until(lambda: gone() is None), "the watch keeps a failed store alive after another is watched"
