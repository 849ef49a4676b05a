"""benchmarks/live_side.py's fault table: a run that never recovered, a system with nothing to
kill, and the notes, as the reader sees them (made-up figures)."""

from __future__ import annotations

import pytest

from bench_modules import loaded


@pytest.fixture(scope="module")
def side():
    with loaded("live_side", "live_side.py") as module:
        yield module


def _row(table: str, system: str) -> str:
    [line] = [line for line in table.splitlines() if line.startswith("control_plane") and system in line]
    return line


@pytest.mark.parametrize("system, figures, note, cells", [
    ("live+prewarm", dict(longest_gap_s=5.6, steps_redone=0, back_s=5.5, useful=440, undisturbed=480.0),
     "etcd leader (m1 of 3) killed 2 ms after the crash", ["5.60", "5.50", "440/480", "0.917", "etcd leader (m1 of 3)"]),
    ("torchft", dict(longest_gap_s=60.1, steps_redone=0, back_s=None, useful=0, undisturbed=470.0, stalled=True),
     "lighthouse killed 1 ms after the crash; survivor never committed after the fault",
     [">60.1", "never", "0/470", "0.000", "n/a", "survivor never committed"]),
])
def test_the_control_plane_rows_say_what_was_killed_and_whether_it_recovered(side, system, figures, note, cells):
    key = ("control_plane", system)
    results = {key: side.FaultFigures(**figures), ("control_plane", "torchrun"): side.NO_CONTROL_PLANE}
    table = side.fault_table(results, [system, "torchrun"], 60.0, {key: note})
    row = _row(table, side.LABELS[system])
    assert all(cell in row for cell in cells), row
    assert "no control plane apart from a node" in _row(table, side.LABELS["torchrun"])


def test_the_schedule_alternates_the_two_faults_that_bring_a_node_back(side):
    assert side.SCHEDULE_FAULTS == ("crash", "node_loss") and "control_plane" in side.FAULTS


@pytest.mark.parametrize("worlds, joined", [
    ((2, 2), True),
    ((1, 1), False),     # two one-node jobs (a store on each node)
    ((2, None), False),  # node 1 has not committed yet
    ((2, 1), False),
])
def test_the_fault_waits_for_both_nodes_in_one_world(side, worlds, joined):
    logs = [[{"ev": "start"}] + ([{"ev": "step", "step": 3, "t": 1.0, "world": world}] if world else [])
            for world in worlds]
    assert side.one_world(*logs) is joined


@pytest.mark.parametrize("costs, picked", [
    ([0.3], 0),
    ([0.5, 0.2, 0.3], 2),        # gaps: the middle one
    ([0.2, 0.5], 1),             # of two middles, the worse (the longer gap)
    ([0.4, 0.1, 0.3, 0.2], 2),   # 0.3, not 0.2
    ([-0.97, -0.95, -0.99], 0),  # schedule fractions, negated: 0.97
    ([-0.97, -0.95], 1),         # of two middles, the worse (the smaller fraction)
])
def test_the_median_run_is_one_run_and_the_worse_middle_of_an_even_count(side, costs, picked):
    assert side.median_run(costs) == picked


def test_several_runs_say_their_range_and_one_run_says_nothing(side):
    runs = [side.FaultFigures(0.31, 0, 0.5, 470, 480.0), side.FaultFigures(0.24, 0, 0.4, 475, 480.0),
            side.FaultFigures(2.5, 1, None, 400, 480.0, stalled=True)]
    assert side.spread_note(runs[:1]) == ""
    assert side.spread_note(runs) == ("median of 3 runs: gap 0.24-2.50 s, goodput 0.833-0.990, redone 0-1, "
                                      "1 stalled")


@pytest.mark.parametrize("kind, seconds", [
    ("slow_replacement", 10.0), ("crash", 0.0), ("node_loss", 0.0), ("sigterm", 0.0), ("schedule", 0.0),
])
def test_only_the_slow_replacement_runs_make_restarted_workers_slow(side, kind, seconds):
    assert side.start_sleep(kind) == seconds


LEFT = {"longest_gap_s": 0.26, "steps_redone": 0, "back_s": None, "useful": 470, "undisturbed": 480.0}


@pytest.mark.parametrize("figures, exits, note", [
    # the node left and stayed away, as the fault means: only how its launcher ended
    (LEFT, {1: 143}, "node 1's launcher exited 143 after the SIGTERM"),
    (LEFT, {}, "node 1's launcher still running at the window's end"),
    # the survivor's own trouble and its launcher's exit are still said
    (dict(LEFT, useful=0, longest_gap_s=60.0, stalled=True), {1: 1, 0: 1},
     ("node 1's launcher exited 1 after the SIGTERM; survivor never committed after the fault; "
      "node 0's launcher exited 1")),
    # a node that trained again although nobody started it again is news
    (dict(LEFT, back_s=3.0), {1: 0},
     "node 1's launcher exited 0 after the SIGTERM; node 1 committed again 3.00 s after the SIGTERM"),
])
def test_a_sigterm_row_says_how_the_launcher_ended_not_that_the_node_stayed_away(side, figures, exits, note):
    assert side.sigterm_outcome(side.FaultFigures(**figures), exits) == note


def test_the_new_faults_rows_line_up_under_the_header(side):
    results = {(kind, system): side.FaultFigures(0.3, 0, None, 470, 480.0)
               for kind in ("slow_replacement", "sigterm") for system in ("live", "torchrun")}
    lines = side.fault_table(results, ["live", "torchrun"], 60.0).splitlines()[1:]
    assert [line.split()[0] for line in lines[1:]] == ["slow_replacement"] * 2 + ["sigterm"] * 2
    column = lines[0].index("system")
    assert all(line[column:].startswith(side.LABELS[system]) for line, system in zip(lines[1:], ["live", "torchrun"] * 2))
