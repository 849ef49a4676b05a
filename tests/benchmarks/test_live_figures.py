"""The side-by-side live-recovery benchmark's figures (benchmarks/live_figures.py), from made-up
step events: a steady run, a restart from a checkpoint, a survivor that never stops."""

from __future__ import annotations

import math

import pytest

from bench_modules import loaded


@pytest.fixture(scope="module")
def figures():
    with loaded("live_figures", "live_figures.py") as module:
        yield module


def steady(figures, first: int, last: int, start: float, period: float = 0.1):
    return [figures.Commit(step, start + (step - first) * period) for step in range(first, last + 1)]


def test_commits_keeps_step_events_in_time_order(figures):
    events = [{"ev": "start", "t": 0.0}, {"ev": "step", "step": 1, "t": 2.0}, {"ev": "step", "step": 0, "t": 1.0},
              {"ev": "recovery", "t": 1.5}]
    assert figures.commits(events) == [figures.Commit(0, 1.0), figures.Commit(1, 2.0)]


def test_the_step_period_is_the_median_before_the_fault(figures):
    done = [figures.Commit(i, t) for i, t in enumerate([0.0, 0.1, 0.2, 0.5, 0.6, 5.0])]
    assert figures.step_period(done, before=0.6) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="1 step"):
        figures.step_period(done, before=0.05)


@pytest.mark.parametrize("times, start, end, gap", [
    ([0.0, 0.1, 0.2, 2.2, 2.3], 0.15, 3.0, 2.0),   # the gap spanning the fault counts
    ([0.0, 0.1, 0.2], 0.15, 3.0, 2.8),              # nothing after the gap: up to the window's end
    ([0.0, 1.0, 1.1, 1.2], 0.5, 1.2, 1.0),          # from the last commit before the fault
    ([0.0, 0.1, 0.2, 0.3, 5.0], 0.15, 0.35, 0.1),   # a gap after the window's end is not counted
])
def test_the_longest_gap_within_the_window(figures, times, start, end, gap):
    done = [figures.Commit(i, t) for i, t in enumerate(times)]
    assert figures.longest_gap(done, start, end) == pytest.approx(gap)


def test_a_restart_from_a_checkpoint_counts_the_repeated_steps_as_redone_not_useful(figures):
    done = steady(figures, 0, 25, 0.0) + steady(figures, 20, 40, 5.0)  # died after 25, resumed at 20
    useful, redone = figures.useful_and_redone(done, start=2.55, end=100.0)
    assert (useful, redone) == (15, 6)  # 26..40 advance; 20..25 again


def test_fault_figures_for_a_survivor_that_never_stops(figures):
    survivor = steady(figures, 0, 24, 0.0) + steady(figures, 25, 124, 2.9)  # 0.5 s gap after step 24
    failed = steady(figures, 0, 24, 0.0) + steady(figures, 30, 124, 3.4)
    result = figures.fault_figures(survivor, failed, fault_at=2.45, window=10.0)
    assert result.longest_gap_s == pytest.approx(0.5)
    assert result.steps_redone == 0
    assert result.back_s == pytest.approx(0.95)
    assert result.undisturbed == pytest.approx(100.0)
    assert result.useful == 96  # 25 at 2.9 s .. 120 at 12.4 s
    assert result.goodput == pytest.approx(0.96)


def test_a_failed_node_that_never_returns_has_no_back_time(figures):
    survivor = steady(figures, 0, 100, 0.0)
    result = figures.fault_figures(survivor, steady(figures, 0, 24, 0.0), fault_at=2.45, window=5.0)
    assert result.back_s is None


@pytest.mark.parametrize("value, reference, text", [
    (1.0, 4.0, "0.25x"), (None, 1.0, "n/a"), (1.0, None, "n/a"), (1.0, 0.0, "n/a"), (math.nan, 1.0, "n/a"),
])
def test_ratios_against_torchrun(figures, value, reference, text):
    assert figures.ratio(value, reference) == text


@pytest.mark.parametrize("survivor, failed, stalled, gap, back, note", [
    # recovered: a 0.5 s gap, node 1 back; nothing to say
    ([(0, 24, 0.0), (25, 124, 2.9)], [(0, 24, 0.0), (30, 124, 3.4)], False, "0.50", "0.95", ""),
    # the survivor never committed after the fault (TorchFT without its lighthouse), nor did node 1
    ([(0, 24, 0.0)], [(0, 24, 0.0)], True, ">10.0", "never",
     "survivor never committed after the fault; node 1 never committed again"),
    # it went on alone for 2 s, then stopped for the rest of the window
    ([(0, 24, 0.0), (25, 44, 2.5)], [(0, 24, 0.0)], True, ">8.0", "never",
     "survivor stopped committing and had not resumed at the window's end; node 1 never committed again"),
    # a 3 s gap in the middle outweighs a short stop at the window's end: not stalled
    ([(0, 24, 0.0), (25, 100, 5.4)], [(0, 24, 0.0), (25, 100, 5.4)], False, "3.00", "2.95", ""),
    # no commit in the window's last 1.5 steps, its longest gap, is a pause, not a stall
    ([(0, 123, 0.0)], [(0, 123, 0.0)], False, "0.15", "0.05", ""),
])
def test_a_run_that_never_recovers_says_so(figures, survivor, failed, stalled, gap, back, note):
    def runs(spans):
        return [commit for first, last, start in spans for commit in steady(figures, first, last, start)]

    result = figures.fault_figures(runs(survivor), runs(failed), fault_at=2.45, window=10.0)
    assert (result.stalled, figures.gap_cell(result), figures.back_cell(result)) == (stalled, gap, back)
    assert figures.outcome(result) == note


def test_launchers_that_exited_are_named_with_their_codes(figures):
    survivor = steady(figures, 0, 24, 0.0)
    result = figures.fault_figures(survivor, survivor, fault_at=2.45, window=10.0)
    assert figures.outcome(result, {1: -9, 0: 1}).endswith("node 0's launcher exited 1; node 1's launcher exited -9")


def recovery(role, formed, healed, nbytes=104_000_000):
    return {"ev": "recovery", "role": role, "formed": formed, "healed": healed, "nbytes": nbytes}


@pytest.mark.parametrize("events, expected", [
    # a live system: the joiner's heal after the fault counts, not the first round's equalising one
    ([{"ev": "state", "nbytes": 104_858_856, "t": 1.0}, recovery("receiver", 0.5, 0.7, 10), recovery("source", 0.5, 0.7),
      recovery("receiver", 12.0, 12.09), recovery("receiver", 20.0, 20.5)],
     dict(state_bytes=104_858_856, transfer_s=0.09, transfer_bytes=104_000_000, save_s=None, reload_s=None,
          heal_s=None)),
    # a checkpointing system: the median save; the slowest reload after the fault
    ([{"ev": "saved", "save_s": s, "t": t} for s, t in [(0.3, 2.0), (0.2, 3.0), (0.5, 11.0)]]
     + [{"ev": "loaded", "load_s": 0.04, "t": 12.0}, {"ev": "loaded", "load_s": 0.06, "t": 12.1},
        {"ev": "loaded", "load_s": 9.0, "t": 5.0}],
     dict(state_bytes=None, transfer_s=None, transfer_bytes=None, save_s=0.3, reload_s=0.06, heal_s=None)),
    # TorchFT: its first heal after the fault is the fetch plus our load_state_dict
    ([{"ev": "heal", "fetch_s": 0.2, "load_s": 0.05, "t": 13.0}, {"ev": "heal", "fetch_s": 1.0, "load_s": 1.0, "t": 30.0},
      {"ev": "heal", "fetch_s": 7.0, "load_s": 7.0, "t": 3.0}],
     dict(state_bytes=None, transfer_s=None, transfer_bytes=None, save_s=None, reload_s=None, heal_s=0.25)),
    # a heal whose fetch was not timed gives no heal time; nothing at all gives None everywhere
    ([{"ev": "heal", "fetch_s": None, "load_s": 0.05, "t": 13.0}], dict.fromkeys(
        ("state_bytes", "transfer_s", "transfer_bytes", "save_s", "reload_s", "heal_s"))),
    ([], dict.fromkeys(("state_bytes", "transfer_s", "transfer_bytes", "save_s", "reload_s", "heal_s"))),
])
def test_state_figures_count_what_moved_the_state_after_the_fault(figures, events, expected):
    result = figures.state_figures(events, fault_at=10.0)
    for key, value in expected.items():
        assert getattr(result, key) == (pytest.approx(value) if isinstance(value, float) else value), key


@pytest.mark.parametrize("spans, gap, began", [
    ([(0, 24, 0.0), (25, 124, 2.9)], 0.5, 2.4),                   # the fault's own gap, from the last commit before it
    ([(0, 24, 0.0), (25, 60, 2.6), (61, 124, 6.7)], 0.6, 6.1),   # a joiner's regroup later: the longer one
    ([(0, 24, 0.0)], 10.05, 2.4),                                 # nothing after the fault: up to the window's end
])
def test_the_figures_say_when_the_longest_gap_began(figures, spans, gap, began):
    done = [commit for first, last, start in spans for commit in steady(figures, first, last, start)]
    result = figures.fault_figures(done, done, fault_at=2.45, window=10.0)
    assert result.longest_gap_s == pytest.approx(gap)
    assert figures.longest_gap_began(done, 2.45, 12.45) == pytest.approx(began)
    assert result.gap_from_s == pytest.approx(began - 2.45)


def test_of_equal_gaps_the_first_is_the_one_that_began(figures):
    done = [figures.Commit(step, float(step)) for step in range(5)]
    assert figures.longest_gap_began(done, 0.5, 4.0) == 0.0


@pytest.mark.parametrize("gap_from_s, stalled, note", [
    (-0.05, False, ""),                                             # the fault's own gap
    (0.9, False, ""),
    (12.3, False, "longest gap began 12.30 s after the fault"),    # a late joiner's regroup
    (12.3, True, ""),                                               # a stall says so already
    (None, False, ""),
])
def test_a_longest_gap_well_after_the_fault_is_pointed_out(figures, gap_from_s, stalled, note):
    result = figures.FaultFigures(0.6, 0, 12.5, 470, 480.0, stalled=stalled, gap_from_s=gap_from_s)
    assert figures.gap_note(result) == note


def test_an_hsdp_heal_counts_each_receiving_rank_and_reports_the_largest_shard_and_the_slowest(figures):
    events = [{"ev": "recovery", "role": "receiver", "nbytes": 9, "formed": 0.5, "healed": 0.6, "t": 0.6},  # before
              {"ev": "recovery", "role": "sender", "nbytes": 8000, "formed": 2.0, "healed": 2.1, "t": 2.1},
              {"ev": "recovery", "role": "receiver", "nbytes": 8000, "formed": 2.0, "healed": 2.02, "t": 2.1},
              {"ev": "recovery", "role": "receiver", "nbytes": 8780, "formed": 2.0, "healed": 2.03, "t": 2.1}]
    heal = figures.shard_heal_figures(events, fault_at=1.0)
    assert (heal.ranks, heal.bytes_per_rank) == (2, 8780) and heal.seconds == pytest.approx(0.03)


def test_an_hsdp_checkpoint_reload_and_a_torchft_heal_are_read_from_their_own_events(figures):
    loads = [{"ev": "loaded", "bytes": b, "load_s": s, "t": 3.0} for b, s in ((10, 0.2), (12, 0.5), (10, 0.1), (12, 0.3))]
    assert figures.shard_heal_figures(loads, 1.0) == figures.HealFigures(4, 12, 0.5)
    heals = [{"ev": "heal", "nbytes": 7, "fetch_s": 0.25, "load_s": 0.05, "t": 3.0}]
    assert figures.shard_heal_figures(heals, 1.0) == figures.HealFigures(1, 7, pytest.approx(0.3))
    assert figures.shard_heal_figures(heals, 5.0) == figures.HealFigures(0, None, None)
