"""The timeline's layout: event records to lanes, bars, marks, world steps, downtime and a summary (pure)."""

from __future__ import annotations

import pytest

from elastic.agent.observe.events import Event
from elastic.timeline.layout import GONE, Bar, BarKind, Mark, MarkKind, WorldStep, layout
from elastic.timeline.records import Record

T0 = 1_700_000_000.0


def rec(t: float, event: str, node: str = "a", host: str = "box", run_id: str = "job", source: str = "",
        **fields) -> Record:
    return Record(T0 + t, Event(event), node, host, run_id, fields, source=source)


def joined(t: float, node: str, round_: int, members: list[str], duration: float = 1.0, rank: int = 0,
           **extra) -> Record:
    return rec(t, "round_joined", node, round=round_, group_rank=rank, group_world_size=len(members),
               members=members, duration_s=duration, **extra)


def started(t: float, node: str, round_: int, started_: list[int] = (0,), kept: list[int] = ()) -> Record:
    return rec(t, "workers_started", node, round=round_, started=list(started_), kept=list(kept))


def exited(t: float, node: str, exitcode: int | None = 1, signal: str | None = None, rank: int = 0) -> Record:
    return rec(t, "worker_exit", node, local_rank=0, global_rank=rank, exitcode=exitcode, signal=signal)


def finished(t: float, node: str = "a", status: str = "succeeded") -> Record:
    return rec(t, "job_finished", node, status=status)


def bars(records, kind=None) -> list[tuple]:
    return [(b.lane, b.kind.value, b.start, b.end, b.round, b.ended) for b in layout(records).bars
            if kind is None or b.kind is kind]


def marks(records) -> list[tuple]:
    return [(m.lane, m.kind.value, m.at, m.cause) for m in layout(records).marks]


def downtime(records) -> list[tuple]:
    return [(round(i.start, 6), round(i.end, 6), i.cause.kind, i.cause.node, i.resumed)
            for i in layout(records).downtime]


# -- bars: the rendezvous before each round, the training after it, the stall after a fault ----------
@pytest.mark.parametrize(("records", "expected"), [
    # One round: the rendezvous took 1 s (it starts the timeline), the training runs to the finish.
    ([joined(1, "a", 0, ["a"]), finished(5)],
     [(0, "rendezvous", 0.0, 1.0, 0, True), (0, "attempt", 1.0, 5.0, 0, True)]),
    # A second round: the first ends where the second rendezvous began.
    ([joined(1, "a", 0, ["a"]), joined(7, "a", 1, ["a"], duration=2.0), finished(9)],
     [(0, "rendezvous", 0.0, 1.0, 0, True), (0, "attempt", 1.0, 5.0, 0, True),
      (0, "rendezvous", 5.0, 7.0, 1, True), (0, "attempt", 7.0, 9.0, 1, True)]),
    # A rendezvous said to have begun before the node's record before it: from that record on.
    ([joined(1, "a", 0, ["a"]), joined(2, "a", 1, ["a"], duration=1.5), finished(3)],
     [(0, "rendezvous", 0.0, 1.0, 0, True), (0, "rendezvous", 1.0, 2.0, 1, True), (0, "attempt", 2.0, 3.0, 1, True)]),
    # Workers that start late (templates warming): resuming until then.
    ([joined(1, "a", 0, ["a"]), started(1.5, "a", 0), finished(5)],
     [(0, "rendezvous", 0.0, 1.0, 0, True), (0, "resuming", 1.0, 1.5, 0, True), (0, "attempt", 1.5, 5.0, 0, True)]),
    # A worker fails: the training stops there, the node stalls until its next rendezvous.
    ([joined(1, "a", 0, ["a"]), exited(3, "a"), joined(6, "a", 1, ["a"], duration=2.0), finished(9)],
     [(0, "rendezvous", 0.0, 1.0, 0, True), (0, "attempt", 1.0, 3.0, 0, True), (0, "stalled", 3.0, 4.0, 0, True),
      (0, "rendezvous", 4.0, 6.0, 1, True), (0, "attempt", 6.0, 9.0, 1, True)]),
    # No job_finished and no peer: the training is open (striped) to the end of the timeline.
    ([joined(1, "a", 0, ["a", "b"]), joined(1, "b", 0, ["a", "b"]), finished(9, "b")],
     [(0, "rendezvous", 0.0, 1.0, 0, True), (0, "attempt", 1.0, 9.0, 0, False),
      (1, "rendezvous", 0.0, 1.0, 0, True), (1, "attempt", 1.0, 9.0, 0, True)]),
    # An exclusion spans its cooldown.
    ([joined(1, "a", 0, ["a"]), rec(3, "node_excluded", reason="r", cooldown_s=4.0, failures_in_a_row=2),
      finished(9)],
     [(0, "rendezvous", 0.0, 1.0, 0, True), (0, "attempt", 1.0, 9.0, 0, True), (0, "excluded", 3.0, 7.0, None, True)]),
])
def test_bars(records, expected):
    assert bars(records) == expected


def test_a_peers_failure_stops_the_training_of_every_member_of_the_round():
    # b's worker is killed at 3; a's collectives fail at 4, and a rejoins only at 5: a trained until 3.
    records = [joined(1, "a", 0, ["a", "b"]), started(1, "a", 0), joined(1, "b", 0, ["a", "b"], rank=1),
               started(1, "b", 0), exited(3, "b", None, "SIGKILL", rank=1), exited(4, "a"),
               joined(6, "a", 1, ["a", "b"], duration=1.0), started(6, "a", 1),
               joined(6, "b", 1, ["a", "b"], duration=2.5, rank=1), started(6, "b", 1), finished(9), finished(9, "b")]
    assert [bar for bar in bars(records) if bar[4] == 0] == [
        (0, "rendezvous", 0.0, 1.0, 0, True), (0, "attempt", 1.0, 3.0, 0, True), (0, "stalled", 3.0, 5.0, 0, True),
        (1, "rendezvous", 0.0, 1.0, 0, True), (1, "attempt", 1.0, 3.0, 0, True), (1, "stalled", 3.0, 3.5, 0, True)]
    assert downtime(records) == [(3.0, 6.0, "worker_exit", "b", True)]


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
    # A node that kept every worker into the next round (--live-recovery) healed; it did not restart.
    ([joined(1, "a", 0, ["a"]), joined(6, "a", 1, ["a"], duration=2.0),
      rec(6.01, "restart", cause="worker_failure", restart_count=1, remaining=2), started(6.02, "a", 1, [], [0, 1]),
      rec(7, "round_formed", round=1), finished(8)],
     [(0, "heal", 4.0, "worker_failure"), (0, "job_finished", 8.0, "succeeded")]),
    # One worker restarted, one kept: a restart.
    ([joined(1, "a", 0, ["a"]), joined(6, "a", 1, ["a"], duration=2.0),
      rec(6.01, "restart", cause="worker_failure"), started(6.02, "a", 1, [0], [1]), finished(8)],
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


def test_a_live_heal_trains_again_once_the_kept_workers_formed_the_round():
    records = [joined(1, "a", 0, ["a", "b"]), started(1, "a", 0), joined(1, "b", 0, ["a", "b"], rank=1),
               started(1, "b", 0), exited(3, "b", None, "SIGKILL", rank=1),
               joined(3.2, "a", 1, ["a", "b"], duration=0.1), started(3.2, "a", 1, [], [0]),
               joined(3.2, "b", 1, ["a", "b"], duration=0.1, rank=1), started(3.2, "b", 1, [0], []),
               rec(8, "round_formed", "b", round=1), rec(8.5, "round_formed", "a", round=1),
               finished(12), finished(12, "b")]
    a_bars = [(kind, round(start, 6), round(end, 6)) for lane, kind, start, end, number, _ in bars(records)
              if lane == 0 and number == 1]
    assert a_bars == [("rendezvous", 3.1, 3.2), ("resuming", 3.2, 8.5), ("attempt", 8.5, 12.0)]
    assert downtime(records) == [(3.0, 8.5, "worker_exit", "b", True)]


# -- a node that is killed, and the machine that comes back --------------------------------------
def test_a_killed_node_ends_at_the_first_sign_its_peers_recorded_and_its_machine_comes_back_on_its_lane():
    records = [
        joined(1, "a", 0, ["a", "b"]), joined(1, "b", 0, ["a", "b"], rank=1, source="b.jsonl"),
        # b is killed at ~4 s; its last event was at 1 s.
        rec(6, "member_lost", "a", reason="b's lease expired"),
        joined(7, "a", 1, ["a"]),
        joined(12, "b2", 2, ["a", "b2"], duration=3.0, rank=1, source="b.jsonl"), joined(12, "a", 2, ["a", "b2"]),
        finished(20, "a"), finished(20, "b2"),
    ]
    timeline = layout(records)
    assert [(lane.nodes, lane.host, lane.ending, lane.rounds) for lane in timeline.lanes] == [
        (("a",), "box", "succeeded", (0, 1, 2)), (("b", "b2"), "box", "succeeded", (0, 2))]
    assert [(agent.node, agent.lane, agent.ending) for agent in timeline.agents] == [
        ("a", 0, "succeeded"), ("b", 1, GONE), ("b2", 1, "succeeded")]
    assert timeline.origin == T0  # where a's first rendezvous began
    [open_attempt] = [b for b in timeline.bars if not b.ended]
    assert (open_attempt.lane, open_attempt.node, open_attempt.start, open_attempt.end) == (1, "b", 1.0, 6.0)
    [gone] = [m for m in timeline.marks if m.kind is MarkKind.GONE]
    assert (gone.lane, gone.at) == (1, 6.0) and "at +6.00 s" in gone.label
    assert timeline.agents[1].end == 6.0


def test_a_killed_node_ends_at_its_peers_first_failure_not_at_their_rejoin():
    # The survivor's workers fail first (a reset connection); it rejoins, and the round it gets
    # lacks the dead node: its failure is not counted, said as a member lost after the join.
    records = [
        joined(1, "a", 0, ["a", "b"]), joined(1, "b", 0, ["a", "b"], rank=1),
        rec(2, "restart", "b", cause="worker_failure"),
        exited(6, "a"),
        joined(7.5, "a", 1, ["a"], duration=1.0),
        rec(7.5, "member_lost", "a", reason="worker failure not counted: a member of the previous round is absent"),
        finished(9, "a"),
    ]
    timeline = layout(records)
    [open_attempt] = [b for b in timeline.bars if not b.ended]
    assert (open_attempt.lane, open_attempt.end) == (1, 6.0)
    [gone] = [m for m in timeline.marks if m.kind is MarkKind.GONE]
    assert gone.at == 6.0 and "first sign of its loss its peers recorded, at +6.00 s" in gone.label
    [lost] = timeline.downtime
    assert (lost.start, lost.end, lost.cause.kind, lost.cause.node) == (6.0, 7.5, "lost", "b")
    assert "exit 1" in lost.cause.first_sign


def test_a_peer_whose_rounds_never_had_the_node_does_not_end_it():
    records = [joined(1, "a", 0, ["a", "c"]), joined(1, "b", 0, ["b"], run_id="other"),
               joined(3, "a", 1, ["a"]), rec(5, "member_lost", "a", reason="c left"), finished(9, "a")]
    [open_attempt] = [b for b in layout(records).bars if not b.ended]
    assert open_attempt.end == 9.0


def test_two_agents_at_once_on_one_host_are_two_lanes_and_a_successor_takes_the_free_one():
    records = [joined(1, "a", 0, ["a", "b"], source="a.jsonl"), joined(1, "b", 0, ["a", "b"], source="b.jsonl"),
               exited(3, "a"), joined(5, "a", 1, ["a"]), joined(8, "b2", 2, ["a", "b2"], source="b2.jsonl"),
               joined(8, "a", 2, ["a", "b2"]), finished(9, "a"), finished(9, "b2")]
    assert [lane.nodes for lane in layout(records).lanes] == [("a",), ("b", "b2")]


# -- downtime: the time the job did not train --------------------------------------------------------
@pytest.mark.parametrize(("records", "expected"), [
    # A clean run: none.
    ([joined(1, "a", 0, ["a"]), started(1, "a", 0), finished(5)], []),
    # A worker's failure: from it to the next round's workers.
    ([joined(1, "a", 0, ["a"]), started(1, "a", 0), exited(2, "a"), joined(4, "a", 1, ["a"]), started(4.5, "a", 1),
      finished(6)],
     [(2.0, 4.5, "worker_exit", "a", True)]),
    # A node joining (no fault): from the rendezvous to the next round's workers.
    ([joined(1, "a", 0, ["a"]), started(1, "a", 0), rec(3, "nodes_waiting", count=1, reason="c waits"),
      joined(4, "a", 1, ["a", "c"], duration=0.5), joined(4, "c", 1, ["a", "c"], rank=1),
      started(4.1, "a", 1), started(4.2, "c", 1), finished(6), finished(6, "c")],
     [(3.5, 4.2, "left", "a", True)]),
    # A failure the job never recovered from: open to the end of the logs.
    ([joined(1, "a", 0, ["a"]), started(1, "a", 0), exited(2, "a"), finished(3, status="failed")],
     [(2.0, 3.0, "worker_exit", "a", False)]),
    # Workers that could not start in the next round: the job did not train again.
    ([joined(1, "a", 0, ["a"]), started(1, "a", 0), exited(2, "a"), joined(4, "a", 1, ["a"]),
      finished(5, status="failed")],
     [(2.0, 5.0, "worker_exit", "a", False)]),
    # Logs without workers_started (older agents): the workers trained from the round's close.
    ([joined(1, "a", 0, ["a"]), exited(2, "a"), joined(4, "a", 1, ["a"]), finished(6)],
     [(2.0, 4.0, "worker_exit", "a", True)]),
])
def test_downtime(records, expected):
    assert downtime(records) == expected


def test_the_summary_sums_the_downtime():
    records = [joined(1, "a", 0, ["a"]), started(1, "a", 0), exited(2, "a"), joined(4, "a", 1, ["a"]),
               started(4.5, "a", 1), exited(5, "a"), joined(6, "a", 2, ["a"]), started(6, "a", 2), finished(8)]
    summary = layout(records).summary
    assert (summary.downtime, summary.interruptions) == (3.5, 2)


# -- the world and the summary ------------------------------------------------------------------------
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
        joined(1, "a", 0, ["a", "b"]), joined(1, "b", 0, ["a", "b"], host="box2"),
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
    assert (summary.nodes, summary.gone, summary.machines) == (2, 1, 2)


def test_records_in_any_order_give_the_same_timeline():
    records = [joined(1, "a", 0, ["a", "b"]), joined(1.5, "b", 0, ["a", "b"]),
               rec(3, "member_lost", "a", reason="x"), finished(6, "a"), finished(6, "b")]
    assert layout(records) == layout(list(reversed(records)))


def test_lanes_are_ordered_by_first_appearance_and_keep_their_run_and_host():
    records = [joined(5, "late", 0, ["late"]),
               rec(1, "round_joined", "early", host="h2", run_id="r2", round=0, group_world_size=1, duration_s=0.0)]
    timeline = layout(records)
    assert [(lane.nodes, lane.host, lane.run_id) for lane in timeline.lanes] == [(("early",), "h2", "r2"),
                                                                                (("late",), "box", "job")]
    assert timeline.run_ids == ("r2", "job")


def test_nothing_to_draw_is_an_error():
    with pytest.raises(ValueError, match="no events"):
        layout([])


def test_labels_say_what_a_tooltip_needs():
    records = [joined(1, "a", 0, ["a", "b"], world_size=4), joined(6, "a", 1, ["a"], duration=2.0),
               rec(6, "restart", cause="membership_change", remaining=3, reason="node b lost"), finished(8)]
    timeline = layout(records)
    attempt = next(b for b in timeline.bars if b.kind is BarKind.ATTEMPT)
    assert attempt.label == "round 0: group rank 0 of 2 nodes, 4 workers; training +1.00 s to +4.00 s"
    restart = next(m for m in timeline.marks if m.kind is MarkKind.RESTART)
    assert restart.label.startswith("restart (membership_change) (3 left): node b lost; recorded at +6.00 s")
    assert isinstance(restart, Mark) and isinstance(attempt, Bar)


@pytest.mark.parametrize("hosts", [["h"] * 2000, [f"h{i}" for i in range(2000)]])
def test_many_one_line_nodes_are_laid_out_in_one_pass(hosts):
    """One gone node per line, on one host or on as many: each gets its lane (or shares its
    host's), and the noticing and the deaths are found without comparing every pair of nodes."""
    records = [joined(i * 0.01, f"n{i}", 0, [f"n{i}"], duration=0.0) for i in range(len(hosts))]
    records = [Record(r.at, r.event, r.node, host, r.run_id, r.fields) for r, host in zip(records, hosts)]
    timeline = layout(records)
    assert len(timeline.agents) == 2000 and timeline.summary.gone == 2000
    assert len(timeline.lanes) == (1 if len(set(hosts)) == 1 else 2000)
