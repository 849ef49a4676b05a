"""The suite under pytest-xdist, as CI runs it (``-n 2 --dist loadgroup``): the whole-job tests
(tests/chaos, tests/multinode) run on one worker, one at a time, and the session's summaries
(the chaos figures, why etcd could not start) reach the controller's output.

Runs pytest in a subprocess on a small suite with this repository's conftest and tiers.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]

WHOLE_JOB = """
import time

def test_{name}_one(report_figures):
    time.sleep(0.3)
    report_figures("{name} one: figures")

def test_{name}_two():
    time.sleep(0.3)
"""

OTHERS = """
import time
import pytest

@pytest.mark.parametrize("case", range(6))
def test_other(case):
    time.sleep(0.1)
"""


@pytest.fixture
def suite(pytester):
    for name in ("conftest.py", "tiers.py"):
        shutil.copy(TESTS / name, pytester.path / name)
    pytester.makepyprojecttoml("""
        [tool.pytest.ini_options]
        markers = ["slow: s", "etcd: e", "chaos: c", "needs_torch: t"]
    """)
    for directory in ("chaos", "multinode"):
        (pytester.path / directory).mkdir()
        (pytester.path / directory / f"test_{directory}.py").write_text(WHOLE_JOB.format(name=directory))
    (pytester.path / "agent").mkdir()
    (pytester.path / "agent" / "test_agent.py").write_text(OTHERS)
    return pytester


def workers(result) -> dict[str, str]:
    """Test id -> the xdist worker that ran it, from ``-v`` output."""
    found = {}
    for line in result.outlines:
        match = re.match(r"\[(gw\d+)\] .*PASSED (\S+)", line)
        if match:
            found[match.group(2)] = match.group(1)
    return found


def test_the_whole_job_tests_share_one_worker_and_their_figures_reach_the_summary(suite):
    result = suite.runpytest_subprocess("-v", "-p", "no:cacheprovider", "--all", "-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=10)
    ran = workers(result)
    whole = {worker for test, worker in ran.items() if test.startswith(("chaos/", "multinode/"))}
    assert len(ran) == 10 and len(whole) == 1, result.outlines
    summary = result.stdout.str().split("chaos figures", 1)
    assert len(summary) == 2 and "chaos one: figures" in summary[1] and "multinode one: figures" in summary[1]


def test_without_xdist_the_figures_are_summarized_as_well(suite):
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "--all", "-p", "no:xdist")
    result.assert_outcomes(passed=10)
    assert "chaos figures" in result.stdout.str() and "chaos one: figures" in result.stdout.str()
