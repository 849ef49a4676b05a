"""benchmarks/recovery.py's plan: which jobs a choice of cases runs (each job once)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def recovery():
    spec = importlib.util.spec_from_file_location("recovery_benchmark", REPO / "benchmarks" / "recovery.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


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
