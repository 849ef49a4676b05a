"""The timeline of event logs recorded from real runs (``tests/agent/test_timeline_run.py`` made
them, with ``ELASTIC_TIMELINE_SAVE``): what happened is drawn, and the downtime is charged to it.

``kills``: two agents with two gloo workers each on etcd; one of b's workers SIGKILLed, then b
with its workers, then b's command started again on the same machine. ``live``: two agents with
``--live-recovery``, one worker each; b's worker SIGKILLed, restarted alone, healed from a's,
which kept its process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic.agent.observe.events import Event
from elastic.timeline.layout import GONE, BarKind, MarkKind, Timeline, layout
from elastic.timeline.records import Record, read_log

FIXTURES = Path(__file__).parent / "fixtures"


def recorded(story: str) -> tuple[Timeline, list[Record]]:
    records: list[Record] = []
    for path in sorted((FIXTURES / story).glob("*.events.jsonl")):
        with open(path, "rb") as stream:
            got, skipped = read_log(stream, str(path))
        assert not skipped.anything
        records += got
    return layout(records), records


@pytest.fixture(scope="module")
def kills():
    return recorded("kills")


@pytest.fixture(scope="module")
def live():
    return recorded("live")


def test_the_machine_that_came_back_is_one_lane_with_both_agents(kills):
    timeline, records = kills
    b, b2 = [a.node for a in timeline.agents if a.host == "vm" and a.lane == 1]
    assert [(lane.nodes, lane.ending) for lane in timeline.lanes] == [((timeline.agents[0].node,), "succeeded"),
                                                                     ((b, b2), "succeeded")]
    assert [agent.ending for agent in timeline.agents] == ["succeeded", GONE, "succeeded"]


def test_the_survivor_is_not_drawn_training_after_the_killed_worker(kills):
    timeline, records = kills
    [kill] = [r for r in records if r.event is Event.WORKER_EXIT and r.fields["signal"] == "SIGKILL"]
    at = kill.at - timeline.origin
    survivor = timeline.agents[0].node
    assert not [b for b in timeline.bars if b.kind is BarKind.ATTEMPT and b.start < at < b.end]
    [stalled] = [b for b in timeline.bars if b.node == survivor and b.kind is BarKind.STALLED and b.round == 0]
    assert stalled.start == at and "SIGKILL" in stalled.label  # until its own rejoin


def test_the_killed_node_ends_at_the_first_sign_its_peer_recorded(kills):
    timeline, records = kills
    survivor, lost = timeline.agents[0], timeline.agents[1]
    last = max(r.at for r in records if r.node == lost.node)
    [first_sign] = [r for r in records if r.node == survivor.node and r.event is Event.WORKER_EXIT and r.at > last]
    died = first_sign.at - timeline.origin
    [gone] = [m for m in timeline.marks if m.kind is MarkKind.GONE]
    assert (gone.node, gone.at) == (lost.node, died) and lost.end == died
    assert max(b.end for b in timeline.bars if b.node == lost.node) == died  # not to the survivor's rejoin
    rejoin = min(b.start for b in timeline.bars if b.node == survivor.node and b.kind is BarKind.RENDEZVOUS
                 and b.start > died)
    assert rejoin > died


def test_the_downtime_of_the_kills_is_charged_fault_by_fault(kills):
    timeline, records = kills
    survivor, lost, back = (agent.node for agent in timeline.agents)
    origin = timeline.origin
    [kill] = [r for r in records if r.event is Event.WORKER_EXIT and r.fields["signal"] == "SIGKILL"]
    started = {(r.node, r.fields["round"]): r.at for r in records if r.event is Event.WORKERS_STARTED}
    assert [(i.cause.kind, i.cause.node, i.stopped_round, i.resumed_in) for i in timeline.downtime] == [
        ("worker_exit", lost, 0, 1), ("lost", lost, 1, 2), ("left", survivor, 2, 3)]
    worker, node, joined = timeline.downtime
    assert worker.start == kill.at - origin
    assert worker.end == max(started[(survivor, 1)], started[(lost, 1)]) - origin  # both nodes' workers ran
    assert node.end == started[(survivor, 2)] - origin
    assert joined.end == max(started[(survivor, 3)], started[(back, 3)]) - origin
    assert timeline.summary.downtime == pytest.approx(sum(i.end - i.start for i in timeline.downtime))


def test_a_live_heal_is_a_heal_on_the_survivor_and_a_restart_on_the_crashed_node(live):
    timeline, records = live
    [crashed] = {r.node for r in records if r.event is Event.WORKER_EXIT}
    [survivor] = {r.node for r in records} - {crashed}
    kinds = {(m.node, m.kind) for m in timeline.marks if m.kind in (MarkKind.RESTART, MarkKind.HEAL)}
    assert kinds == {(survivor, MarkKind.HEAL), (crashed, MarkKind.RESTART)}
    [heal] = [m for m in timeline.marks if m.kind is MarkKind.HEAL]
    assert heal.cause == "worker_failure" and "no process restarted on this node" in heal.label
    assert timeline.summary.heals == 1


def test_the_downtime_of_a_live_heal_lasts_until_the_kept_workers_formed_the_round(live):
    # Kept workers train as soon as they formed the round: since issue 37 they do not wait for
    # the replacement (recorded before, they formed with it, 57 ms before its agent said so).
    timeline, records = live
    [kill] = [r for r in records if r.event is Event.WORKER_EXIT]
    survivor = next(m.node for m in timeline.marks if m.kind is MarkKind.HEAL)
    [kept_formed] = [r.at for r in records if r.event is Event.ROUND_FORMED and r.node == survivor]
    [gap] = timeline.downtime
    assert (gap.start, gap.end) == (kill.at - timeline.origin, kept_formed - timeline.origin)
    assert gap.end - gap.start > 5  # the replacement imported torch meanwhile: not the round's close
    resuming = [b for b in timeline.bars if b.node == survivor and b.kind is BarKind.RESUMING and b.round == 1]
    assert len(resuming) == 1 and "kept workers re-forming the group" in resuming[0].label
