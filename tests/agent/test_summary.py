"""The run's summary at exit: what RunTally counts from events and how summary_lines words it."""

from __future__ import annotations

import pytest

from elastic.agent.observe.events import Event, EventLog, RestartCause
from elastic.agent.observe.summary import (
    RunFacts, RunTally, comings_and_goings, duration_text, outcome_text, restarts_text, summary_lines,
)


def joined(*members: str) -> dict:
    return {"round": 0, "group_rank": 0, "group_world_size": len(members), "members": list(members), "duration_s": 0.1}


def test_the_tally_counts_rounds_restarts_and_the_end_from_real_events(tmp_path):
    tally = RunTally()
    with EventLog(tmp_path / "e.jsonl", run_id="job", node="a", host="box") as events:
        events.listen(tally)
        events.emit(Event.ROUND_JOINED, **joined("a", "b"))
        events.emit(Event.WORKER_EXIT, local_rank=0, global_rank=1, exitcode=1, signal=None)
        events.emit(Event.RESTART, cause=RestartCause.WORKER_FAILURE, restart_count=1, remaining=2)
        events.emit(Event.ROUND_JOINED, **joined("a", "b"))
        events.emit(Event.MEMBER_LOST, reason="node b lost")
        events.emit(Event.RESTART, cause=RestartCause.MEMBERSHIP_CHANGE, restart_count=1, remaining=2)
        events.emit(Event.ROUND_JOINED, **joined("a"))
        events.emit(Event.JOB_FINISHED, status="succeeded")
    assert tally.facts() == RunFacts((("a", "b"), ("a", "b"), ("a",)),
                                     {"worker_failure": 1, "membership_change": 1}, "succeeded")


@pytest.mark.parametrize(("facts", "wall", "code", "expected"), [
    (RunFacts((("a",),), {}, "succeeded"), 4.06, 0,
     ["run job node a: succeeded after 4.1s; 1 attempt, no restarts"]),
    (RunFacts((("a", "b"), ("a", "b"), ("a",), ("a", "c")), {"worker_failure": 1, "membership_change": 2}, "failed"),
     185.0, 1,
     ["run job node a: failed after 3m 05s; 4 attempts, 3 restarts (2 membership changes, 1 worker failure)",
      "run job nodes: 3 nodes took part (a, b, c); came later: c; went: b"]),
    (RunFacts((("a", "b"),), {}, "finished_elsewhere"), 7200.0, 0,
     ["run job node a: finished (the job ended on another node) after 2h 00m; 1 attempt, no restarts",
      "run job nodes: 2 nodes took part (a, b)"]),
    (RunFacts((("a", "b"), ("a",), ("a", "b")), {"membership_change": 2}, "signalled:SIGTERM"), 30.0, 143,
     ["run job node a: stopped by SIGTERM after 30.0s; 3 attempts, 2 restarts (2 membership changes)",
      "run job nodes: 2 nodes took part (a, b); came later: b; went: b"]),
    (RunFacts((), {}, None), 1.0, 1, ["run job node a: ended with exit code 1 after 1.0s; 0 attempts, no restarts"]),
    (RunFacts((), {}, "already_finished"), 0.2, 0,
     ["run job node a: did nothing (the job had already finished) after 0.2s; 0 attempts, no restarts"]),
])
def test_the_summary_says_outcome_time_attempts_restarts_and_nodes(facts, wall, code, expected):
    assert summary_lines(facts, run_id="job", node="a", wall_s=wall, exit_code=code) == expected


@pytest.mark.parametrize(("status", "code", "expected"), [
    ("succeeded", 0, "succeeded"),
    ("store_unreachable", 1, "stopped (the store did not answer)"),
    ("closed_by_peer", 1, "stopped (another node closed the rendezvous)"),
    ("signalled:SIGINT", 130, "stopped by SIGINT"),
    ("some_new_status", 1, "some new status"),
    (None, 2, "ended with exit code 2"),
])
def test_outcomes_are_words(status, code, expected):
    assert outcome_text(status, code) == expected


@pytest.mark.parametrize(("restarts", "expected"), [
    ({}, "no restarts"),
    ({"worker_failure": 0}, "no restarts"),
    ({"store_outage": 1}, "1 restart (1 store outage)"),
    ({"worker_failure": 2, "something_else": 1}, "3 restarts (2 worker failures, 1 something else)"),
])
def test_restarts_are_counted_by_cause(restarts, expected):
    assert restarts_text(restarts) == expected


def test_nodes_that_left_and_came_back_are_named_once_each_way():
    rounds = (("a", "b", "c"), ("a", "c"), ("a", "b", "c"), ("a", "b"))
    assert comings_and_goings(rounds) == (("b",), ("b", "c"))


def test_long_node_lists_are_cut():
    nodes = tuple(f"n{i}" for i in range(9))
    [_, second] = summary_lines(RunFacts((nodes,), {}, "succeeded"), run_id="r", node="n0", wall_s=1, exit_code=0)
    assert second == "run r nodes: 9 nodes took part (n0, n1, n2, n3, n4, n5 and 3 more)"


@pytest.mark.parametrize(("seconds", "expected"), [(0.04, "0.0s"), (59.94, "59.9s"), (60, "1m 00s"),
                                                   (3599, "59m 59s"), (3600, "1h 00m"), (90061, "25h 01m")])
def test_durations_read_as_a_person_says_them(seconds, expected):
    assert duration_text(seconds) == expected
