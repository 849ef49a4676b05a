"""The commit fence: a collective that completes after a stall is used only on the agent's word.

The decisions are case tables; the fence, the watcher's freeze and renewal handling and the
registry's hook run against a real mailbox, a real pipe and works completed by hand. The
chaos suite's partition row (tests/chaos, ``elasticrun-live``) is the whole-job check: a node
cut off inside a step's collective must not commit that step in the round its peer abandoned.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from elastic.worker.channel import FROZEN_AFTER, RoundMailbox, RoundWatcher
from elastic.worker.decisions import FenceVerdict, FenceView, fence_verdict, suspect_completion
from elastic.worker.errors import Superseded
from elastic.worker.fence import CommitFence
from elastic.worker.guard import OpRegistry
from elastic.worker.rounds import Held, Round, encode_held_line, encode_round_line, parse_pipe_line
from elastic.worker.errors import RoundLineError
from fake_works import Clock, FutureWork

STALL = 1.0


@pytest.mark.parametrize(
    ("started", "now", "last_ok", "froze_at", "suspect"),
    [
        (10.0, 10.2, 9.0, None, False),  # a normal collective
        (10.0, 10.99, 9.0, None, False),  # just under the stall
        (10.0, 11.0, 9.0, None, True),  # in flight for the stall: peers may have abandoned it
        (10.0, 16.0, 9.0, None, True),  # a cut link healed
        (10.0, 10.1, 9.0, 9.5, True),  # frozen since the last clean completion (before launching)
        (10.0, 10.1, 9.0, 8.0, False),  # a freeze before the last clean completion is judged already
        (10.0, 10.1, 9.0, 9.0, True),  # at the same instant: suspect
    ],
)
def test_suspect_completion_case_table(started, now, last_ok, froze_at, suspect):
    assert suspect_completion(started, now, last_ok, froze_at, STALL) is suspect


def view(held, newer=False, gone=False, now=20.0, suspected_at=16.0, deadline=76.0):
    return FenceView(suspected_at, held, newer_round=newer, agent_gone=gone, now=now, deadline=deadline)


@pytest.mark.parametrize(
    ("fence_view", "verdict"),
    [
        (view(held=17.0), FenceVerdict.COMMIT),  # the lease is held past the completion
        (view(held=16.0), FenceVerdict.WAIT),  # held only up to it: it may have expired then
        (view(held=12.0), FenceVerdict.WAIT),  # the agent's renewals stopped (cut off, or etcd down)
        (view(held=None), FenceVerdict.COMMIT),  # an agent that publishes no renewals: no fence
        (view(held=17.0, newer=True), FenceVerdict.ABANDON),  # a newer round: the group may be gone
        (view(held=None, newer=True), FenceVerdict.ABANDON),
        (view(held=12.0, gone=True), FenceVerdict.ABANDON),  # no agent left to say
        (view(held=12.0, now=76.0), FenceVerdict.ABANDON),  # the collective timeout passed
        (view(held=17.0, now=80.0), FenceVerdict.COMMIT),  # a late word still counts
    ],
)
def test_fence_verdict_case_table(fence_view, verdict):
    assert fence_verdict(fence_view) is verdict


# -- the pipe line --------------------------------------------------------------------------------
def test_a_held_line_round_trips_and_a_bad_one_is_refused():
    assert parse_pipe_line(encode_held_line(Held(81234.5))) == Held(81234.5)
    assert parse_pipe_line(b'{"v":1,"held_until":7}') == Held(7.0)
    for line in (b'{"v":1,"held_until":"soon"}', b'{"v":1,"held_until":NaN}', b'{"v":1,"held_until":true}',
                 b'{"v":2,"held_until":1.0}'):
        with pytest.raises(RoundLineError):
            parse_pipe_line(line)


def _round(number: int) -> Round:
    return Round(round=number, rank=0, world_size=1, local_rank=0, local_world_size=1, group_rank=0,
                 master_addr="127.0.0.1", master_port=29500, restart_count=0, store_prefix=f"p/{number}")


# -- the fence against a mailbox ------------------------------------------------------------------
def test_the_fence_commits_at_once_when_the_lease_covers_the_completion():
    mailbox = RoundMailbox(0)
    mailbox.offer_held(Held(time.monotonic() + 5))
    started = time.monotonic()
    assert CommitFence(mailbox, STALL, 30.0, "t").judge(0, time.monotonic()) is FenceVerdict.COMMIT
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("word", ["renewal", "round", "eof"])
def test_the_fence_waits_for_the_agents_word(word):
    mailbox = RoundMailbox(0)
    mailbox.offer_held(Held(time.monotonic() - 1))  # renewals stopped a while ago
    completed = time.monotonic()
    say = {"renewal": lambda: mailbox.offer_held(Held(completed + 3)),
           "round": lambda: mailbox.offer(_round(1), time.monotonic()),
           "eof": mailbox.close}[word]
    threading.Timer(0.3, say).start()
    verdict = CommitFence(mailbox, STALL, 30.0, "t").judge(0, completed)
    assert verdict is (FenceVerdict.COMMIT if word == "renewal" else FenceVerdict.ABANDON)
    assert 0.25 <= time.monotonic() - completed < 2.0


def test_the_fence_drops_a_completion_nobody_vouches_for_by_the_collective_timeout():
    mailbox = RoundMailbox(0)
    mailbox.offer_held(Held(time.monotonic() - 1))
    completed = time.monotonic()
    assert CommitFence(mailbox, STALL, 0.3, "t").judge(0, completed) is FenceVerdict.ABANDON
    assert time.monotonic() - completed >= 0.3


# -- the registry's hook ---------------------------------------------------------------------------
def _fenced_registry(mailbox, clock):
    return OpRegistry(0, "t", clock, CommitFence(mailbox, STALL, 30.0, "t", clock))


def _completed_after_a_stall(clock, mailbox):
    """An op whose collective completes 6 s after its launch, the lease known held for 2 of them."""
    mailbox.offer_held(Held(clock.now + 2))
    registry = _fenced_registry(mailbox, clock)
    work = FutureWork()
    op = registry.launch([work], lambda: "value")
    clock.now += 6.0  # the link was cut for 6 s
    work.future.set_result(None)
    return registry, op


def test_a_quick_collective_settles_without_the_fence_even_when_the_lease_is_unknown():
    clock = Clock()
    mailbox = RoundMailbox(0)
    mailbox.offer_held(Held(clock.now - 100))  # renewals long stopped: an etcd outage
    registry = _fenced_registry(mailbox, clock)
    work = FutureWork()
    op = registry.launch([work], lambda: "value")
    clock.now += 0.2
    work.future.set_result(None)
    assert op.wait() == "value"  # static stability: a healthy group trains through the outage


def test_a_collective_that_completes_after_a_stall_waits_for_a_renewal():
    clock = Clock()
    mailbox = RoundMailbox(0)
    _, op = _completed_after_a_stall(clock, mailbox)
    time.sleep(0.2)
    assert not op.future.done()  # judged, not used
    mailbox.offer_held(Held(clock.now + 2))
    assert op.wait() == "value"


def test_a_collective_that_completes_after_a_stall_is_dropped_for_a_newer_round():
    clock = Clock()
    mailbox = RoundMailbox(0)
    registry, op = _completed_after_a_stall(clock, mailbox)
    mailbox.offer(_round(2), clock.now)
    with pytest.raises(Superseded, match="completed after a stall"):
        op.wait()
    assert isinstance(registry.failure, Superseded)


# -- the watcher ------------------------------------------------------------------------------------
class JumpingClock:
    """time.monotonic(), plus ``jump`` seconds once ``jumped`` is set (a freeze, as the process sees it)."""

    def __init__(self) -> None:
        self.jump = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.jump


def test_the_watcher_keeps_renewals_and_notices_a_freeze():
    read_fd, write_fd = os.pipe()
    mailbox = RoundMailbox(0, ("127.0.0.1", 29500))
    clock = JumpingClock()
    watcher = RoundWatcher(read_fd, mailbox, lambda: None, 0.5, "t", clock)
    watcher.start()
    try:
        os.write(write_fd, encode_held_line(Held(50.0)) + encode_held_line(Held(40.0)))
        deadline = time.monotonic() + 5
        while mailbox.held != 50.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert mailbox.held == 50.0  # the newest renewal; an older line does not go back
        time.sleep(0.6)
        assert mailbox.froze_at is None  # regular wakes are no freeze
        clock.jump = FROZEN_AFTER + 1.0
        while mailbox.froze_at is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert mailbox.froze_at is not None
        os.write(write_fd, encode_round_line(_round(1)))
        while mailbox.pending is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert mailbox.pending is not None  # rounds still read beside renewals
    finally:
        watcher.stop()
        os.close(write_fd)
