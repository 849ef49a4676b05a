"""The timeline's layout: event records to lanes, bars, marks, world steps and a summary (pure)."""

from __future__ import annotations

import pytest

from elastic.agent.observe.events import Event
from elastic.timeline.layout import GONE, Bar, BarKind, Mark, MarkKind, WorldStep, layout
from elastic.timeline.records import Record

T0 = 1_700_000_000.0


def rec(t: float, event: str, node: str = "a", host: str = "box", run_id: str = "job", **fields) -> Record:
    return Record(T0 + t, Event(event), node, host, run_id, fields)


def joined(t: float, node: str, round_: int, members: list[str], duration: float = 1.0, rank: int = 0,
           **extra) -> Record:
    return rec(t, "round_joined", node, round=round_, group_rank=rank, group_world_size=len(members),
               members=members, duration_s=duration, **extra)


def finished(t: float, node: str = "a", status: str = "succeeded") -> Record:
    return rec(t, "job_finished", node, status=status)


def bars(records, kind=None) -> list[tuple]:
    return [(b.lane, b.kind.value, b.start, b.end, b.round, b.ended) for b in layout(records).bars
            if kind is None or b.kind is kind]


def marks(records) -> list[tuple]:
    return [(m.lane, m.kind.value, m.at, m.cause) for m in layout(records).marks]


# -- bars: the rendezvous before each round, the attempt after it -------------------------------
@pytest.mark.parametrize(("records", "expected"), [
    # One round: the rendezvous took 1 s (it starts the timeline), the attempt runs to the finish.
    ([joined(1, "a", 0, ["a"]), finished(5)],
     [(0, "rendezvous", 0.0, 1.0, 0, True), (0, "attempt", 1.0, 5.0, 0, True)]),
    # A second round: the first attempt ends where the second rendezvous began.
    ([joined(1, "a", 0, ["a"]), joined(7, "a", 1, ["a"], duration=2.0), finished(9)],
     [(0, "rendezvous", 0.0, 1.0, 0, True), (0, "attempt", 1.0, 5.0, 0, True),
      (0, "rendezvous", 5.0, 7.0, 1, True), (0, "attempt", 7.0, 9.0, 1, True)]),
    # A rendezvous said to have begun before the attempt it ends: clamped to the attempt's start.
    ([joined(1, "a", 0, ["a"]), joined(2, "a", 1, ["a"], duration=1.5), finished(3)],
     [(0, "rendezvous", 0.0, 1.0, 0, True), (0, "attempt", 1.0, 1.0, 0, True),
      (0, "rendezvous", 1.0, 2.0, 1, True), (0, "attempt", 2.0, 3.0, 1, True)]),
    # No job_finished and no peer: the attempt is open to the end of the timeline.
    ([joined(1, "a", 0, ["a", "b"]), joined(1, "b", 0, ["a", "b"]), finished(9, "b")],
     [(0, "rendezvous", 0.0, 1.0, 0, True), (0, "attempt", 1.0, 9.0, 0, False),
      (1, "rendezvous", 0.0, 1.0, 0, True), (1, "attempt", 1.0, 9.0, 0, True)]),
    # An exclusion spans its cooldown.
    ([joined(1, "a", 0, ["a"]), rec(3, "node_excluded", reason="r", cooldown_s=4.0, failures_in_a_row=2),
      finished(9)],
     [(0, "rendezvous", 0.0, 1.0, 0, True), (0, "excluded", 3.0, 7.0, None, True), (0, "attempt", 1.0, 9.0, 0, True)]),
])
def test_bars(records, expected):
    assert bars(records) == expected


# -- marks: what happened, with its cause --------------------------------------------------------
@pytest.mark.parametrize(("records", "expected"), [
    # A worker's exit code, or its signal's name.
    ([joined(1, "a", 0, ["a"]), rec(2, "worker_exit", local_rank=1, global_rank=1, exitcode=1, signal=None),
      rec(2.5, "worker_exit", local_rank=0, global_rank=0, exitcode=None, signal="SIGKILL")],
     [(0, "worker_exit", 2.0, "exit 1"), (0, "worker_exit", 2.5, "SIGKILL"), (0, "gone", 2.5, GONE)]),
    # A restart is recorded after the next round closed; its mark goes where the group stopped.
    ([joined(1, "a", 0, ["a"]), joined(6, "a", 1, ["a"], duration=2.0),
      rec(6.01, "restart", cause="worker_failure", restart_count=1, remaining=2), finished(8)],
     [(0, "restart", 4.0, "worker_failure"), (0, "job_finished", 8.0, "succeeded")]),
    ([joined(1, "a", 0, ["a"]), rec(3, "member_lost", reason="b's lease expired"),
      rec(4, "nodes_waiting", count=1, reason="1 waiting"), finished(5, status="failed")],
     [(0, "member_lost", 3.0, "member_lost"), (0, "nodes_waiting", 4.0, "nodes_waiting"),
      (0, "job_finished", 5.0, "failed")]),
    # A restart without a round before it (a log that starts mid-run) stays where it was recorded.
    ([rec(2, "restart", cause="membership_change"), finished(3)],
     [(0, "restart", 0.0, "membership_change"), (0, "job_finished", 1.0, "succeeded")]),
])
def test_marks(records, expected):
    assert marks(records) == expected


def test_a_killed_node_ends_where_a_peer_reported_it_lost_and_its_rejoin_is_a_new_lane():
    records = [
        joined(1, "a", 0, ["a", "b"]), joined(1, "b", 0, ["a", "b"], rank=1),
        # b is killed at ~4 s; its last event was at 1 s. A member_lost before that is not about it.
        rec(0.5, "member_lost", "a", reason="earlier"),
        rec(6, "member_lost", "a", reason="b's lease expired"),
        joined(7, "a", 1, ["a"]),
        joined(12, "b2", 2, ["a", "b2"], duration=3.0, rank=1), joined(12, "a", 2, ["a", "b2"]),
        finished(20, "a"), finished(20, "b2"),
    ]
    timeline = layout(records)
    assert [(lane.node, lane.host, lane.ending, lane.rounds) for lane in timeline.lanes] == [
        ("a", "box", "succeeded", (0, 1, 2)), ("b", "box", GONE, (0,)), ("b2", "box", "succeeded", (2,))]
    assert timeline.origin == T0  # where a's first rendezvous began
    [open_attempt] = [b for b in timeline.bars if not b.ended]
    assert (open_attempt.lane, open_attempt.start, open_attempt.end) == (1, 1.0, 6.0)
    [gone] = [m for m in timeline.marks if m.kind is MarkKind.GONE]
    assert (gone.lane, gone.at) == (1, 6.0) and "+6.00 s" in gone.label
    assert timeline.lanes[1].end == 6.0


def test_a_killed_node_ends_where_a_peer_began_a_round_without_it():
    # The survivor's workers fail first (a reset connection); it rejoins, and the round it gets
    # lacks the dead node: its failure is not counted, said as a member lost after the join.
    records = [
        joined(1, "a", 0, ["a", "b"]), joined(1, "b", 0, ["a", "b"], rank=1),
        rec(2, "restart", "b", cause="worker_failure"),
        rec(6, "worker_exit", "a", local_rank=0, global_rank=0, exitcode=1, signal=None),
        joined(7.5, "a", 1, ["a"], duration=1.0),
        rec(7.5, "member_lost", "a", reason="worker failure not counted: a member of the previous round is absent"),
        finished(9, "a"),
    ]
    timeline = layout(records)
    [open_attempt] = [b for b in timeline.bars if not b.ended]
    assert (open_attempt.lane, open_attempt.end) == (1, 6.5)
    [gone] = [m for m in timeline.marks if m.kind is MarkKind.GONE]
    assert gone.at == 6.5 and "a peer acted on its loss at +6.50 s" in gone.label


def test_a_peer_whose_rounds_never_had_the_node_does_not_end_it():
    records = [joined(1, "a", 0, ["a", "c"]), joined(1, "b", 0, ["b"], run_id="other"),
               joined(3, "a", 1, ["a"]), rec(5, "member_lost", "a", reason="c left"), finished(9, "a")]
    [open_attempt] = [b for b in layout(records).bars if not b.ended]
    assert open_attempt.end == 9.0


@pytest.mark.parametrize(("extra", "unit", "sizes"), [
    ({"world_size": 4}, "workers", [4, 2, 4]),
    ({}, "nodes", [2, 1, 2]),
])
def test_the_world_is_each_rounds_size_from_when_it_first_closed(extra, unit, sizes):
    records = [joined(1, "a", 0, ["a", "b"], **extra), joined(1.2, "b", 0, ["a", "b"], **extra),
               joined(5, "a", 1, ["a"], **({"world_size": 2} if extra else {})),
               joined(9, "a", 2, ["a", "c"], **extra), joined(9.1, "c", 2, ["a", "c"], **extra)]
    timeline = layout(records)
    assert timeline.world_unit == unit
    assert timeline.world == tuple(WorldStep(at, size, r) for at, size, r in zip((1.0, 5.0, 9.0), sizes, (0, 1, 2)))


def test_the_world_counts_nodes_when_any_round_does_not_say_its_workers():
    records = [joined(1, "a", 0, ["a"], world_size=2), joined(5, "a", 1, ["a"])]
    assert layout(records).world_unit == "nodes"


def test_the_summary_counts_a_restart_once_per_round_not_once_per_node():
    records = [
        joined(1, "a", 0, ["a", "b"]), joined(1, "b", 0, ["a", "b"]),
        rec(2, "worker_exit", "a", local_rank=0, global_rank=0, exitcode=1, signal=None),
        rec(2.1, "worker_exit", "b", local_rank=0, global_rank=1, exitcode=None, signal="SIGTERM"),
        joined(4, "a", 1, ["a", "b"]), rec(4, "restart", "a", cause="worker_failure"),
        joined(4, "b", 1, ["a", "b"]), rec(4, "restart", "b", cause="worker_failure"),
        joined(8, "a", 2, ["a"]), rec(8, "restart", "a", cause="membership_change"),
        finished(10, "a"),
    ]
    summary = layout(records).summary
    assert summary.rounds == 3
    assert summary.restarts == (("membership_change", 1), ("worker_failure", 1))
    assert summary.worker_exits == (("SIGTERM", 1), ("exit 1", 1))
    assert (summary.nodes, summary.gone) == (2, 1)


def test_records_in_any_order_give_the_same_timeline():
    records = [joined(1, "a", 0, ["a", "b"]), joined(1.5, "b", 0, ["a", "b"]),
               rec(3, "member_lost", "a", reason="x"), finished(6, "a"), finished(6, "b")]
    assert layout(records) == layout(list(reversed(records)))


def test_lanes_are_ordered_by_first_appearance_and_keep_their_run_and_host():
    records = [joined(5, "late", 0, ["late"]), joined(1, "early", 0, ["early"], run_id="r2")]
    records[1] = rec(1, "round_joined", "early", host="h2", run_id="r2", round=0, group_world_size=1,
                     duration_s=0.0)
    timeline = layout(records)
    assert [(lane.node, lane.host, lane.run_id) for lane in timeline.lanes] == [("early", "h2", "r2"),
                                                                                ("late", "box", "job")]
    assert timeline.run_ids == ("r2", "job")


def test_nothing_to_draw_is_an_error():
    with pytest.raises(ValueError, match="no events"):
        layout([])


def test_labels_say_what_a_tooltip_needs():
    records = [joined(1, "a", 0, ["a", "b"], world_size=4), joined(6, "a", 1, ["a"], duration=2.0),
               rec(6, "restart", cause="membership_change", remaining=3, reason="node b lost"), finished(8)]
    timeline = layout(records)
    attempt = next(b for b in timeline.bars if b.kind is BarKind.ATTEMPT)
    assert attempt.label == "round 0: group rank 0 of 2 nodes, 4 workers"
    restart = next(m for m in timeline.marks if m.kind is MarkKind.RESTART)
    assert restart.label.startswith("restart (membership_change) (3 left): node b lost; recorded at +6.00 s")
    assert isinstance(restart, Mark) and isinstance(attempt, Bar)
