"""The timeline as SVG and HTML: structure, tooltips, escaping, self-containment, the axis."""

from __future__ import annotations

import os
import re
import sys

import pytest

import elastic.timeline
from elastic.agent.observe.events import Event
from elastic.timeline.layout import MarkKind, layout
from elastic.timeline.page import render_page
from elastic.timeline.records import Record
from elastic.timeline.svg import render_svg, symbol, tick_label, tick_step

from support.dom import parse

T0 = 1_700_000_000.0
TIMELINE = os.path.dirname(elastic.timeline.__file__)
HOSTILE = '<script>alert("x")</script>&'


def rec(t: float, event: str, node: str, host: str = "box", **fields) -> Record:
    return Record(T0 + t, Event(event), node, host, "job-42", fields)


def joined(t: float, node: str, round_: int, members: list[str], duration: float = 1.0) -> Record:
    return rec(t, "round_joined", node, round=round_, group_rank=members.index(node),
               group_world_size=len(members), members=members, duration_s=duration, world_size=2 * len(members))


RUN = [
    joined(1, "a", 0, ["a", "b"]), joined(1, "b", 0, ["a", "b"]),
    rec(3, "worker_exit", "a", local_rank=1, global_rank=1, exitcode=1, signal=None),
    joined(5, "a", 1, ["a", "b"]), rec(5, "restart", "a", cause="worker_failure", restart_count=1, remaining=2),
    joined(5, "b", 1, ["a", "b"]), rec(5, "restart", "b", cause="worker_failure", restart_count=1, remaining=2),
    rec(9, "member_lost", "a", reason="b's lease expired"),
    joined(10, "a", 2, ["a"]), rec(10, "restart", "a", cause="membership_change", restart_count=1, remaining=2),
    joined(15, "c", 3, ["a", "c"], duration=3.0), joined(15, "a", 3, ["a", "c"]),
    rec(15, "restart", "a", cause="membership_change", restart_count=1, remaining=2),
    rec(20, "job_finished", "a", status="succeeded"), rec(20, "job_finished", "c", status="succeeded"),
]


@pytest.fixture(scope="module")
def page():
    return parse(render_page(layout(RUN), notes=["b.jsonl: skipped 1 line (1 not events), the first at line 3"]))


def test_the_page_has_a_lane_per_machine_labelled_by_host_and_node_ids(page):
    [svg] = page.find_all("svg", "timeline")
    lanes = svg.find_all("g", "lane")
    # b was lost, c came later on the same host: one machine, two agents one after the other.
    assert [(lane.attrs["data-node"], lane.attrs["data-host"], lane.attrs["data-ending"]) for lane in lanes] == [
        ("a", "box", "succeeded"), ("b c", "box", "succeeded")]
    assert "a" in lanes[0].find_all("text", "lane-node")[0].all_text()
    assert "2 agents: c" in lanes[1].find_all("text", "lane-node")[0].all_text()
    assert "box" in lanes[1].find_all("text", "lane-host")[0].all_text()


def test_bars_and_marks_carry_their_meaning_and_a_tooltip(page):
    [svg] = page.find_all("svg", "timeline")
    attempts = [bar for bar in svg.find_all("rect", "bar") if "attempt" in bar.classes]
    assert len(attempts) == 7 and len(svg.find_all("rect", "rendezvous")) == 7  # a: 4 rounds, b: 2, c: 1
    assert [(bar.attrs["data-node"], bar.attrs["data-round"]) for bar in svg.find_all("g", "lane")[1].find_all("rect")
            if "attempt" in bar.classes and "bar" in bar.classes] == [("b", "0"), ("b", "1"), ("c", "3")]
    assert len(svg.find_all("rect", "open")) == 1  # b's last attempt: its end is not recorded
    # a's workers stopped training when its worker failed at +3 s, not when it rejoined at +4 s.
    [stalled] = svg.find_all("g", "lane")[0].find_all("rect", "stalled")
    assert (stalled.attrs["data-start"], stalled.attrs["data-end"]) == ("3.000", "4.000")
    assert "worker rank 1 (local 1) of node a: exit 1" in stalled.title()
    causes = sorted(m.attrs["data-cause"] for m in svg.find_all("g", "restart"))
    assert causes == ["membership_change", "membership_change", "worker_failure", "worker_failure"]
    [exit_mark] = svg.find_all("g", "worker_exit")
    assert exit_mark.attrs["data-cause"] == "exit 1" and "worker rank 1 (local 1) exit 1" in exit_mark.title()
    assert [m.attrs["data-cause"] for m in svg.find_all("g", "gone")] == ["gone"]
    assert "b's lease expired" in svg.find_all("g", "member_lost")[0].title()
    assert all(element.title() for element in [*attempts, *svg.find_all("g", "mark")])


def test_the_world_size_is_a_step_line_with_a_point_per_round(page):
    [world] = page.find_all("g", "world")
    assert world.attrs["data-unit"] == "workers"
    assert [(p.attrs["data-round"], p.attrs["data-size"]) for p in world.find_all("circle", "world-step")] == [
        ("0", "4"), ("1", "4"), ("2", "2"), ("3", "4")]
    [line] = world.find_all("path", "world-line")
    assert line.attrs["d"].startswith("M") and line.attrs["d"].count("V") == 3


def test_the_legend_and_the_summary_tables(page):
    [legend] = page.find_all("ul", "legend")
    assert "restart: membership change" in legend.all_text() and "worker exit" in legend.all_text()
    [summary] = page.find_all("table", "summary")
    rows = {row.attrs["data-row"]: row.find_all("td")[0].all_text() for row in summary.find_all("tr")}
    assert rows == {"rounds": "4", "restarts": "3 (membership_change: 2, worker_failure: 1)",
                    "live heals": "0 (a node kept its workers through a restart)",
                    "worker exits": "1 (exit 1: 1)", "nodes": "3 came, 1 went without finishing",
                    "machines": "2 (a lane each; a restarted agent stays on its machine's lane)",
                    "downtime": "4.00 s in 3 interruptions"}
    [nodes] = page.find_all("table", "nodes")
    assert [(row.attrs["data-node"], row.attrs["data-lane"]) for row in nodes.find_all("tr")
            if "data-node" in row.attrs] == [("a", "0"), ("b", "1"), ("c", "1")]
    assert "skipped 1 line" in page.find_all("p", "notes")[0].all_text()


def test_the_downtime_is_drawn_per_fault_and_in_total_and_tabled(page):
    [row] = page.find_all("g", "downtime-row")
    assert row.attrs["data-seconds"] == "4.000" and "not training: 4.0 s" in row.all_text()
    gaps = [(g.attrs["data-cause"], g.attrs["data-node"], g.attrs["data-start"], g.attrs["data-seconds"])
            for g in row.find_all("g", "downtime")]
    # a's worker's exit; b's loss (first seen when a left for a round without it); c's arrival.
    assert gaps == [("worker_exit", "a", "3.000", "2.000"), ("lost", "b", "9.000", "1.000"),
                    ("left", "a", "14.000", "1.000")]
    assert all(g.title() and g.find_all("text", "downtime-seconds") for g in row.find_all("g", "downtime"))
    [table] = page.find_all("table", "downtime")
    cells = [[td.all_text() for td in tr.find_all("td")] for tr in table.find_all("tr") if "data-cause" in tr.attrs]
    assert [c[3] for c in cells] == ["2.00 s", "1.00 s", "1.00 s"] and "node b lost" in cells[1][4]
    assert "4.00 s" in table.find_all("tr", data_row="total")[0].all_text()
    assert "Downtime is the time the job did not train" in page.find_all("p", "definition")[0].all_text()


def test_the_page_needs_no_script_and_no_network():
    html = render_page(layout(RUN))
    dom = parse(html)
    assert dom.find_all("script") == [] and dom.find_all("link") == [] and dom.find_all("img") == []
    assert re.findall(r"https?://[^\"' ]+", html) == ["http://www.w3.org/2000/svg"]  # the namespace only
    assert not re.search(r"\b(src|href)=", html) and "url(http" not in html and "@import" not in html


def test_text_from_the_logs_is_escaped():
    records = [rec(1, "round_joined", HOSTILE, host=HOSTILE, round=0, group_world_size=1, duration_s=0.5),
               rec(2, "member_lost", HOSTILE, host=HOSTILE, reason=HOSTILE),
               rec(3, "job_finished", HOSTILE, host=HOSTILE, status=HOSTILE)]
    html = render_page(layout(records), notes=[HOSTILE])
    dom = parse(html)
    assert dom.find_all("script") == []
    assert "<script>" not in html
    [lane] = dom.find_all("g", "lane")
    assert lane.attrs["data-node"] == HOSTILE and lane.attrs["data-ending"] == HOSTILE
    assert HOSTILE in dom.find_all("g", "member_lost")[0].title()


@pytest.mark.parametrize(("span", "step"), [
    (0.5, 0.1), (1.0, 0.1), (10, 1), (45, 5), (119, 10), (600, 60), (3600, 300), (86400 * 3, 43200 / 2 * 2),
    (86400 * 30, 86400 * 3),
])
def test_ticks_take_the_smallest_nice_step_that_keeps_them_few(span, step):
    assert tick_step(span) == step


@pytest.mark.parametrize(("seconds", "step", "label"), [
    (0.5, 0.1, "+0.5 s"), (45, 5, "+45 s"), (120, 60, "+2:00"), (3725, 300, "+1:02:05"), (90, 30, "+90 s"),
])
def test_tick_labels(seconds, step, label):
    assert tick_label(seconds, step) == label


def test_a_single_instant_still_draws():
    svg = parse(render_svg(layout([rec(0, "job_finished", "a", status="succeeded")])))
    assert len(svg.find_all("g", "job_finished")) == 1 and svg.find_all("g", "axis")


@pytest.mark.parametrize("seconds", [-1e18, 0.0, 1e18, 1e300])
def test_any_finite_time_still_draws(seconds):
    """Records made in code (not read from a file, which bounds them) may say any time."""
    html = render_page(layout([Record(seconds, Event.JOB_FINISHED, "a", "h1", "job", {"status": "succeeded"}),
                               Record(seconds * 2 + 1, Event.JOB_FINISHED, "b", "h2", "job", {"status": "failed"})]))
    assert len(parse(html).find_all("g", "lane")) == 2


def lines_run(nodes: int) -> int:
    """The lines of elastic.timeline that laying out and drawing ``nodes`` one-line nodes runs."""
    records = [Record(T0 + i * 0.01, Event.ROUND_JOINED, f"n{i}", f"h{i}", "job",
                      {"round": 0, "group_world_size": 1, "members": [f"n{i}"], "duration_s": 0.5})
               for i in range(nodes)]
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if not frame.f_code.co_filename.startswith(TIMELINE):
            return None
        count += event == "line"
        return tracer

    sys.settrace(tracer)
    try:
        render_page(layout(records))
    finally:
        sys.settrace(None)
    return count


def test_the_work_grows_linearly_with_the_nodes():
    """Counted in lines run, not seconds (which measure the machine's load): four times the
    one-line nodes is four times the work, not sixteen."""
    assert lines_run(800) <= 4.4 * lines_run(200)


@pytest.mark.parametrize("kind", list(MarkKind))
def test_every_mark_kind_has_a_shape(kind):
    shape = parse(symbol(kind, 10, 10)).children[0]
    assert shape.tag in {"path", "circle", "rect"}
