"""benchmarks/hsdp_heal.py's arguments and its summary of repeated runs (the runs themselves are
a real HSDP job's heal and a real torch.distributed.checkpoint reload)."""

from __future__ import annotations

import pytest

from bench_modules import loaded


@pytest.fixture(scope="module")
def bench():
    with loaded("hsdp_heal_benchmark", "hsdp_heal.py") as module:
        yield module


def test_it_times_a_100_mb_heal_and_reload_three_times_by_default(bench):
    args = bench.parse_args([])
    assert (args.cases, args.state_mb, args.repetitions) == (["heal", "reload"], 100, 3)


def test_unknown_cases_are_refused_with_one_line(bench, capsys):
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(["--cases", "heal,restore"])
    assert exited.value.code == 2 and "unknown cases: restore" in capsys.readouterr().err


def test_repeated_runs_are_summarised_by_median_and_range_of_each_number(bench):
    runs = [{"heal_s": 0.3, "ranks": 2, "rank_heal_s": [0.1, 0.3]}, {"heal_s": 0.1, "ranks": 2, "rank_heal_s": [0.1]},
            {"heal_s": 0.2, "ranks": 2, "rank_heal_s": [0.2]}]
    assert bench.summary(runs) == {"heal_s": {"median": 0.2, "min": 0.1, "max": 0.3},
                                   "ranks": {"median": 2, "min": 2, "max": 2}}
