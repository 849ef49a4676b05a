"""benchmarks/recovery.py's plan: which jobs a choice of cases runs (each job once)."""

from __future__ import annotations

import pytest

from bench_modules import loaded


@pytest.fixture(scope="module")
def recovery():
    with loaded("recovery_benchmark", "recovery.py") as module:  # its dataclasses look their module up there
        yield module


@pytest.mark.parametrize("cases, runs", [
    (["scale_up"], ["scale_up"]),
    (["scale_up_pause"], ["scale_up"]),
    (["scale_up", "scale_up_pause"], ["scale_up"]),  # one job gives both figures
    (["worker_crash", "node_loss"], ["node_loss", "worker_crash"]),
    ([], []),
])
def test_each_job_runs_once_for_the_cases_it_measures(recovery, cases, runs):
    assert recovery.runs_for(cases) == runs


def test_every_case_is_measured_by_exactly_one_run(recovery):
    measured = [case for cases in recovery.RUNS.values() for case in cases]
    assert sorted(measured) == sorted(recovery.CASES)
