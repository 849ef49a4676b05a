"""Progress while waiting in a rendezvous: the line, when it is due, and the handler's use of it."""

from __future__ import annotations

import logging
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from elastic.rendezvous.errors import RendezvousClosedError, RendezvousTimeoutError
from elastic.rendezvous.handler import NodeSpec, RendezvousHandler
from elastic.rendezvous.progress import LostNode, ProgressReporter, WaitSnapshot, format_progress, line_due
from elastic.rendezvous.settings import RendezvousSettings
from elastic.testing.agents import wait_until
from elastic.testing.fake_store import FakeHarness


def snap(joined=1, min_nodes=2, max_nodes=4, expected=None, left=587.4, round_=0, closes_in=None, last_call=30.0):
    return WaitSnapshot("job-1", "a", round_, joined, min_nodes, max_nodes, expected, left, (), closes_in, last_call)


@pytest.mark.parametrize("snapshot, line", [
    (snap(), "Rendezvous job-1 round 0 (node a): waiting for nodes: 1 of at least 2 nodes joined (at most 4); "
             "587 s left before the join timeout"),
    (snap(min_nodes=2, max_nodes=2), "Rendezvous job-1 round 0 (node a): waiting for nodes: 1 of 2 nodes joined; "
                                     "587 s left before the join timeout"),
    (snap(joined=None), "Rendezvous job-1 round 0 (node a): waiting for at least 2 nodes (at most 4) to join; "
                        "587 s left before the join timeout"),
    (snap(joined=3, expected=("b",), round_=2),  # not the closer: the last call began at most 30 s ago
     "Rendezvous job-1 round 2 (node a): 3 of at least 2 nodes joined (at most 4); still expected: b; "
     "the round closes at the end of the last call (within 30 s)"),
    (snap(joined=1, min_nodes=1, max_nodes=2, closes_in=27.6),  # the closer, alone at --nnodes=1:2
     "Rendezvous job-1 round 0 (node a): 1 of at least 1 nodes joined (at most 2); "
     "the round closes in 28 s, at the end of the last call"),
    (snap(joined=2, min_nodes=1, max_nodes=4, closes_in=-0.2),
     "Rendezvous job-1 round 0 (node a): 2 of at least 1 nodes joined (at most 4); "
     "the round closes in 0 s, at the end of the last call"),
    (snap(expected=tuple("abcdefghij")),
     "Rendezvous job-1 round 0 (node a): waiting for nodes: 1 of at least 2 nodes joined (at most 4); "
     "still expected: a, b, c, d, e, f, g, h and 2 more; 587 s left before the join timeout"),
    (snap(expected=(), left=-3.0), "Rendezvous job-1 round 0 (node a): waiting for nodes: 1 of at least 2 nodes joined "
                                   "(at most 4); 0 s left before the join timeout"),
    (snap(left=float("inf")), "Rendezvous job-1 round 0 (node a): waiting for nodes: 1 of at least 2 nodes joined "
                              "(at most 4); no join timeout (a spare waits for room)"),
])
def test_the_progress_line(snapshot, line):
    assert format_progress(snapshot) == line


@pytest.mark.parametrize("now, last_line_at, changed, due", [
    (1.9, None, True, False),   # within the grace: most rounds close sooner
    (2.0, None, True, True),    # the first line after the grace
    (5.0, 2.0, False, False),   # nothing changed, interval not over
    (12.0, 2.0, False, True),   # every interval
    (2.5, 2.0, True, False),    # a change, but within the gap after the last line
    (3.0, 2.0, True, True),     # a change after the gap
])
def test_when_a_line_is_due(now, last_line_at, changed, due):
    assert line_due(now, 0.0, last_line_at, changed, interval=10.0, grace=2.0, gap=1.0) is due


def test_the_reporter_speaks_after_the_grace_on_changes_and_every_interval():
    clock = [100.0]
    lines: list[str] = []
    reporter = ProgressReporter(lines.append, clock=lambda: clock[0])
    assert not reporter.update(snap(joined=1)) and reporter.next_due() == 102.0
    clock[0] = 102.0
    assert reporter.update(snap(joined=1)) and reporter.next_due() == 112.0
    clock[0] = 105.0
    assert not reporter.update(snap(joined=1))  # unchanged: wait for the interval
    assert reporter.update(snap(joined=2))  # a change, past the gap
    clock[0] = 105.5
    assert not reporter.update(snap(joined=3))  # within the gap: held back ...
    assert reporter.next_due() == 106.0 and not reporter.due()
    clock[0] = 106.0
    assert reporter.due() and reporter.update(snap(joined=3))  # ... and said once the gap passed
    clock[0] = 116.0
    assert reporter.update(snap(joined=3, left=500))
    assert [line.split("): ", 1)[1].split(";")[0] for line in lines] == [
        "waiting for nodes: 1 of at least 2 nodes joined (at most 4)",
        "2 of at least 2 nodes joined (at most 4)",
        "3 of at least 2 nodes joined (at most 4)",
        "3 of at least 2 nodes joined (at most 4)",
    ]
    assert reporter.last == snap(joined=3, left=500)


LOST_B = LostNode("b", "its lease expired: its agent was killed, hung or cut off from the store")


def test_a_lost_member_is_named_with_why_unless_a_line_named_it_already():
    snapshot = replace(snap(expected=("c",)), lost=(LOST_B,))
    assert format_progress(snapshot) == (
        "Rendezvous job-1 round 0 (node a): waiting for nodes: 1 of at least 2 nodes joined (at most 4); "
        "still expected: c; lost: b (its lease expired: its agent was killed, hung or cut off from the store); "
        "587 s left before the join timeout")
    assert format_progress(snapshot, named={"b"}) == (
        "Rendezvous job-1 round 0 (node a): waiting for nodes: 1 of at least 2 nodes joined (at most 4); "
        "still expected: c; 587 s left before the join timeout")


def test_the_reporter_names_a_lost_member_once_as_soon_as_the_gap_allows():
    clock = [100.0]
    lines: list[str] = []
    reporter = ProgressReporter(lines.append, clock=lambda: clock[0])
    clock[0] = 102.0
    assert reporter.update(snap(expected=("b",)))
    clock[0] = 103.5
    assert reporter.update(replace(snap(expected=()), lost=(LOST_B,)))  # a change: said after the gap
    clock[0] = 113.5
    assert reporter.update(replace(snap(expected=()), lost=(LOST_B,)))  # the interval: b is not named again
    assert [bool(re.search(r"\bb\b", line.split("): ", 1)[1])) for line in lines] == [True, True, False]
    assert "still expected: b" in lines[0] and "lost: b (its lease expired" in lines[1]


def test_a_lone_node_says_what_it_waits_for_and_its_timeout_names_the_last_counts(caplog):
    """A real handler on the in-process store: one of two nodes waits, prints, and times out."""
    harness = FakeHarness()
    settings = RendezvousSettings("job", 2, 3, namespace=f"/progress-{uuid.uuid4().hex[:8]}",
                                  lease_ttl=2.0, join_timeout=3.5, last_call_timeout=1.0)
    handler = RendezvousHandler(settings, harness.connect(), NodeSpec("127.0.0.1", node_id="a"), owns_backend=True)
    seen: list = []
    handler.on_progress(seen.append)
    try:
        with caplog.at_level(logging.INFO, logger="elastic.rendezvous.joining"):
            with pytest.raises(RendezvousTimeoutError, match=r"need at least 2 nodes \(last seen: 1 of 2 joined\)"):
                handler.next_rendezvous()
    finally:
        handler.shutdown()
        harness.close()
    lines = [r.getMessage() for r in caplog.records if "waiting for nodes" in r.getMessage()]
    assert lines and lines[0].startswith("Rendezvous job round 0 (node a): waiting for nodes: 1 of at least 2 nodes joined "
                                         "(at most 3); ")
    assert seen[0].joined == 1 and seen[-1] is None and handler.progress() is None


def test_a_survivor_expects_a_live_member_and_names_one_that_left_once_as_lost(caplog):
    """b's key of round 0 lives while a waits in round 1: b is still expected. b shuts down:
    one line names it as lost with why, and no later line expects or names it."""
    harness = FakeHarness()
    settings = RendezvousSettings("job", 2, 2, namespace=f"/progress-{uuid.uuid4().hex[:8]}",
                                  lease_ttl=2.0, join_timeout=15.0, last_call_timeout=1.0)
    a, b = (RendezvousHandler(settings, harness.connect(), NodeSpec("127.0.0.1", node_id=name), owns_backend=True)
            for name in ("a", "b"))
    seen: list = []
    a.on_progress(seen.append)
    try:
        with ThreadPoolExecutor(2) as pool:
            assert {info.round for info in pool.map(lambda h: h.next_rendezvous(), (a, b))} == {0}
        with caplog.at_level(logging.INFO, logger="elastic.rendezvous.joining"):
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(a.next_rendezvous)
                wait_until(lambda: any(s is not None and s.expected == ("b",) for s in seen), 10, "a to expect b")
                wait_until(lambda: "still expected: b" in caplog.text, 10, "a line that expects b")
                b.shutdown()
                wait_until(lambda: "lost: b" in caplog.text, 10, "a line that names b as lost")
                a.shutdown()
                with pytest.raises(RendezvousClosedError):
                    waiting.result(timeout=10)
    finally:
        a.shutdown()
        b.shutdown()
        harness.close()
    lines = [r.getMessage() for r in caplog.records if "waiting for nodes" in r.getMessage()]
    first_lost = next(i for i, line in enumerate(lines) if "lost: b" in line)
    assert "Rendezvous job round 1 (node a): waiting for nodes: 1 of 2 nodes joined; still expected: b; " in lines[0]
    assert "waiting for nodes: 1 of 2 nodes joined; lost: b (its agent shut down); " in lines[first_lost], lines
    assert not any(re.search(r"\bb\b", line.split("(node a): ", 1)[1]) for line in lines[first_lost + 1:]), lines
    last = next(s for s in reversed(seen) if s is not None)
    assert last.expected == () and [node.node_id for node in last.lost] == ["b"]


def test_the_closer_and_a_waiting_node_both_report_the_joins(caplog):
    """The closer counts the joins it watches; the other node starts from its own join's count.

    b's join timeout is 2 s longer than a's: the node that times out first leaves, and the other
    then sees one join fewer. With equal timeouts which of them saw that depended on scheduling.
    """
    harness = FakeHarness()
    settings = RendezvousSettings("job", 3, 3, namespace=f"/progress-{uuid.uuid4().hex[:8]}",
                                  lease_ttl=2.0, join_timeout=5.0, last_call_timeout=1.0)
    handlers = [RendezvousHandler(replace(settings, join_timeout=timeout), harness.connect(),
                                  NodeSpec("127.0.0.1", node_id=name), owns_backend=True)
                for name, timeout in (("a", 5.0), ("b", 7.0))]
    last_seen = {"a": 2, "b": 1}  # b outlives a's join

    def join(handler):
        with pytest.raises(RendezvousTimeoutError, match=rf"\(last seen: {last_seen[handler.node_id]} of 3 joined\)"):
            handler.next_rendezvous()

    try:
        with caplog.at_level(logging.INFO, logger="elastic.rendezvous.joining"):
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(join, handlers))
    finally:
        for handler in handlers:
            handler.shutdown()
        harness.close()
    lines = [r.getMessage() for r in caplog.records if "waiting for nodes" in r.getMessage()]
    for node in ("a", "b"):
        assert any(f"(node {node}): waiting for nodes: 2 of 3 nodes joined; " in line for line in lines), lines
