"""The test tiers: which tiers a command line runs (tests/tiers.py) and the hooks that apply it.

The case tables test the pure functions; the last tests run pytest (in this process) on a small
suite of marked tests with this repository's conftest and markers.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tiers import selected_tiers, tiers_of

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("markers, expected", [
    (set(), {"fast"}),
    ({"parametrize", "needs_torch"}, {"fast"}),
    ({"slow"}, {"slow"}),
    ({"slow", "etcd", "needs_torch"}, {"slow", "etcd"}),
    ({"chaos", "etcd", "slow"}, {"chaos", "etcd", "slow"}),
])
def test_a_test_is_in_the_tiers_of_its_markers_or_else_fast(markers, expected):
    assert tiers_of(markers) == expected


@pytest.mark.parametrize("tiers, run_all, markexpr, keyword, paths, expected", [
    ([], False, "", "", False, {"fast"}),               # python -m pytest
    ([], True, "", "", False, None),                    # --all
    (["etcd"], False, "", "", False, {"etcd"}),         # --tier etcd
    (["slow", "chaos"], False, "", "", False, {"slow", "chaos"}),
    (["fast"], False, "not needs_torch", "", False, {"fast"}),  # --tier and -m: both apply
    ([], False, "etcd", "", False, None),               # -m as usual
    ([], False, "", "sigterm", False, None),            # -k as usual
    ([], False, "", "", True, None),                    # named paths: all they hold
    (["fast"], False, "", "", True, {"fast"}),
])
def test_the_command_line_picks_the_tiers(tiers, run_all, markexpr, keyword, paths, expected):
    chosen = selected_tiers(tiers=tiers, run_all=run_all, markexpr=markexpr, keyword=keyword, paths_given=paths)
    assert chosen == (None if expected is None else frozenset(expected))


def test_all_and_tier_together_are_refused():
    with pytest.raises(ValueError, match=r"^--all runs every tier; it cannot be combined with --tier etcd\.$"):
        selected_tiers(tiers=["etcd"], run_all=True, markexpr="", keyword="", paths_given=False)


SUITE = """
import pytest

def test_fast():
    pass

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.etcd
@pytest.mark.slow
def test_slow_etcd():
    pass

@pytest.mark.chaos
def test_chaos():
    pass

@pytest.mark.needs_torch
def test_torch():
    pass  # (no import: an in-process run must not import torch again after pytester unloads it)
"""


@pytest.fixture
def suite(pytester):
    """A copy of this repository's conftest, tiers and markers around a suite of marked tests."""
    for name in ("conftest.py", "tiers.py"):
        shutil.copy(TESTS / name, pytester.path / name)
    pytester.makepyprojecttoml("""
        [tool.pytest.ini_options]
        markers = ["slow: s", "etcd: e", "chaos: c", "needs_torch: t"]
    """)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


# hypothesis's plugin (when installed) imports hypothesis again after each run: seconds each.
QUIET = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")


def ran(result) -> set[str]:
    return {line.split("::")[1].split()[0] for line in result.outlines if "test_suite.py::" in line
            and (" PASSED" in line or " FAILED" in line or " ERROR" in line)}


@pytest.mark.parametrize("args, expected", [
    ([], {"test_fast", "test_torch"}),
    (["--all"], {"test_fast", "test_slow", "test_slow_etcd", "test_chaos", "test_torch"}),
    (["--tier", "etcd", "--tier", "chaos"], {"test_slow_etcd", "test_chaos"}),
    (["-m", "slow"], {"test_slow", "test_slow_etcd"}),
    (["--tier", "fast", "-m", "not needs_torch"], {"test_fast"}),
    (["test_suite.py"], {"test_fast", "test_slow", "test_slow_etcd", "test_chaos", "test_torch"}),
])
def test_the_hooks_run_the_chosen_tiers(suite, args, expected):
    result = suite.runpytest("-v", *QUIET, *args)
    assert ran(result) == expected, result.outlines


def test_a_torch_test_without_torch_fails_with_one_line(suite, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # torch cannot be imported
    suite.makepyfile(test_module_torch="import pytest\nimport torch\n\ndef test_uses_torch():\n    pass\n")
    result = suite.runpytest(*QUIET, "-rE", "test_suite.py", "test_module_torch.py", "-k", "torch")
    result.assert_outcomes(errors=2)
    assert "torch is not installed and this test needs it: pip install torch, or deselect with -m 'not needs_torch'" \
        in result.stdout.str()
    assert "Traceback" not in result.stdout.str()
    deselected = suite.runpytest(*QUIET, "test_suite.py", "test_module_torch.py", "-m", "not needs_torch")
    deselected.assert_outcomes(passed=4, deselected=2)
