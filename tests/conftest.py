"""Shared fixtures and hooks, each in its own section below: etcd, the tiers, torch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import tiers

# -- etcd --------------------------------------------------------------------------------------
# One real etcd for the whole session, with auth on (the contract's wrong-credential test needs
# it). ETCD_TEST_BACKEND picks how it is provided (see elastic.testing.etcd_server); when none
# can start, the tests using it fail, never skip: each with one line, and the full reason is
# printed once at the end of the session.
_etcd_failures: list[str] = []
ETCD_FAILURE = "etcd_could_not_start"
"""The name of the report property that carries a full reason."""


def _etcd_failure_line(error: BaseException) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"etcd could not start for the tests: {first}"


@pytest.fixture(scope="session")
def etcd_server():
    """The session's etcd server; stopped (by PID, for the binary) at the end of the session.

    When it cannot start, pytest keeps the failure of this session fixture and fails every
    test that uses it with the same one-line message (no traceback).
    """
    from elastic.testing.etcd_server import EtcdServerError, EtcdServerOptions, start_etcd_server

    failure = None
    try:
        server = start_etcd_server(EtcdServerOptions(auth=True))
    except EtcdServerError as error:
        _etcd_failures.append(str(error))
        failure = _etcd_failure_line(error)
    if failure is not None:  # outside the except block: no chained traceback
        pytest.fail(failure, pytrace=False)
    try:
        yield server
    finally:
        server.close()


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Mark every test that takes the etcd fixture ``etcd`` (parametrized ones mark their param),
    then keep the tests of the tiers the command line runs; with ``--dist loadgroup``, group the
    whole-job tests (see the parallel section)."""
    for item in items:
        if "etcd_server" in getattr(item, "fixturenames", ()) and item.get_closest_marker("etcd") is None:
            item.add_marker(pytest.mark.etcd)
    _select_tiers(config, items)
    _group_whole_jobs(config, items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that starts its own etcd and cannot gets the same one line, not a traceback."""
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or report.passed:
        return
    from elastic.testing.etcd_server import EtcdServerError

    if isinstance(call.excinfo.value, EtcdServerError):
        if str(call.excinfo.value) not in _etcd_failures:
            _etcd_failures.append(str(call.excinfo.value))
        report.longrepr = _etcd_failure_line(call.excinfo.value)
    # The full reasons travel with the report: under pytest-xdist the summary is printed by the
    # controller, which did not run the test.
    report.user_properties.extend((ETCD_FAILURE, failure) for failure in _etcd_failures)


# -- the session's summaries -------------------------------------------------------------------
# What a test reports for the end of the session travels in its report's user_properties, so
# the summary is whole under pytest-xdist too (the controller prints it; workers ran the tests).
CHAOS_FIGURES = "chaos_figures"
_figures: list[str] = []


@pytest.fixture
def report_figures(request):
    """``report_figures(line)``: keep a scenario's figures for the session's "chaos figures"
    summary (tests/chaos)."""
    return lambda line: request.node.user_properties.append((CHAOS_FIGURES, line))


def pytest_runtest_logreport(report):
    """Gather the chaos figures (from the call) and the full reasons etcd could not start."""
    for name, value in report.user_properties:
        if name == ETCD_FAILURE and value not in _etcd_failures:
            _etcd_failures.append(value)
        elif name == CHAOS_FIGURES and report.when == "call":
            _figures.append(value)


def pytest_terminal_summary(terminalreporter):
    """Every chaos scenario's figures, quotable from a run's output; the full reason etcd could
    not start, once per session (each test showed one line)."""
    if _figures:
        terminalreporter.section("chaos figures")
        for line in _figures:
            terminalreporter.write_line(line)
    if _etcd_failures:
        terminalreporter.section("etcd could not start")
        for failure in _etcd_failures:
            terminalreporter.write_line(failure)


# -- tiers -------------------------------------------------------------------------------------
# tests/tiers.py says which tiers a command line runs: `python -m pytest` alone the fast one.


def pytest_addoption(parser):
    group = parser.getgroup("tiers", "test tiers (fast: no slow, etcd or chaos marker; docs/testing.md)")
    group.addoption("--tier", action="append", dest="tiers", default=[], choices=tiers.TIERS,
                    help="run the tests of this tier; repeat for several (default without paths, -m or -k: fast)")
    group.addoption("--all", action="store_true", dest="all_tiers", help="run every tier, as CI does")


def _selected(config) -> frozenset[str] | None:
    try:
        return tiers.selected_tiers(tiers=config.option.tiers, run_all=config.option.all_tiers,
                                    markexpr=config.option.markexpr, keyword=config.option.keyword,
                                    paths_given=config.args_source is pytest.Config.ArgsSource.ARGS)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


def pytest_configure(config):
    _selected(config)  # a contradictory command line fails before collection, in one line


def pytest_report_header(config):
    chosen = _selected(config)
    if chosen is None:
        return "tiers: every test selected (--all, paths, -m or -k)"
    return f"tiers: {', '.join(sorted(chosen))} (--all for every tier; --tier {'|'.join(tiers.TIERS)})"


def _select_tiers(config, items) -> None:
    chosen = _selected(config)
    if chosen is None:
        return
    kept, deselected = [], []
    for item in items:
        in_tier = tiers.tiers_of({mark.name for mark in item.iter_markers()}) & chosen
        (kept if in_tier else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


# -- parallel runs (pytest-xdist) ----------------------------------------------------------------
# CI runs every tier with `-n 2 --dist loadgroup`. The tests that drive whole jobs (tests/chaos:
# etcd clusters under faults; tests/multinode: every launcher side by side; the 64-node
# rendezvous) form one group: they run one after the other on one worker, so no two of them
# ever run at once (each loads the machine), and they are scheduled first, being the longest
# chain; the other worker runs everything else meanwhile.
#
# The group is decided by the controller's scheduler from each test's path, not by an
# ``xdist_group`` marker: xdist 3.8 marks a group by rewriting ``item._nodeid``, which pytest 9.2
# no longer reads (its ``nodeid`` comes from ``item._id``), so under pytest >= 9.2 the marker
# silently groups nothing.
WHOLE_JOB_DIRS = frozenset({"chaos", "multinode"})
WHOLE_JOB_TESTS = frozenset({
    # 64 handlers' joins and watches at once on one etcd: beside a whole job on a loaded 2-core
    # machine, etcd missed the 5 s watch confirm and the round held the test until its timeout.
    "rendezvous/test_handler.py::test_concurrent_nodes_get_unique_ranks_and_agree_on_the_round[etcd-64]",
})
WHOLE_JOBS = "whole-jobs"
_TESTS = Path(__file__).resolve().parent


def _is_whole_job_path(path: Path, name: str) -> bool:
    try:
        relative = path.resolve().relative_to(_TESTS)
    except ValueError:  # a test outside tests/
        return False
    return relative.parts[0] in WHOLE_JOB_DIRS or f"{relative.as_posix()}::{name}" in WHOLE_JOB_TESTS


def _is_whole_job(item) -> bool:
    return _is_whole_job_path(item.path, item.name)


def _group_whole_jobs(config, items) -> None:
    """Put the whole-job tests first, in the same order on every worker (workers collect; the
    controller schedules them in that order)."""
    if not config.getoption("loadgroup", False):
        return
    whole = [item for item in items if _is_whole_job(item)]
    items[:] = whole + [item for item in items if not _is_whole_job(item)]


@pytest.hookimpl(optionalhook=True)  # unknown without xdist (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadgroup``: every whole-job test in one scope (one worker, one at a time),
    every other test a scope of its own (xdist's own ``xdist_group`` markers still group). The
    controller runs it; it knows the mode as ``--dist`` (workers as ``option.loadgroup``)."""
    if config.getoption("dist", None) != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class WholeJobsScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file_part, _, name = nodeid.partition("::")
            if _is_whole_job_path(config.rootpath / file_part, name.partition("@")[0]):
                return WHOLE_JOBS
            return super()._split_scope(nodeid)

    return WholeJobsScheduling(config, log)


# -- torch -------------------------------------------------------------------------------------
# A test that needs torch is marked needs_torch. Without torch it fails with one line, unless
# deselected with -m "not needs_torch". A module that imports torch at its top cannot be
# collected without it: it becomes one such failing test.

TORCH_MISSING = "torch is not installed and this test needs it: pip install torch, or deselect with -m 'not needs_torch'"


def _torch_missing() -> bool:
    return importlib.util.find_spec("torch") is None


def pytest_runtest_setup(item):
    if item.get_closest_marker("needs_torch") is not None and _torch_missing():
        pytest.fail(TORCH_MISSING, pytrace=False)


class _TorchlessModule(pytest.Module):
    """A test module that, when it cannot be imported for want of torch, is one needs_torch test."""

    def collect(self):
        try:
            return super().collect()
        except pytest.Collector.CollectError as error:
            cause = error.__cause__
            if not (isinstance(cause, ModuleNotFoundError) and (cause.name or "").split(".")[0] == "torch"
                    and _torch_missing()):
                raise
            return [_NeedsTorch.from_parent(self, name="needs_torch")]


class _NeedsTorch(pytest.Item):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_marker(pytest.mark.needs_torch)

    def runtest(self) -> None:
        pytest.fail(TORCH_MISSING, pytrace=False)

    def reportinfo(self):
        return self.path, None, f"{self.path.name}: every test of it (it imports torch)"


def pytest_pycollect_makemodule(module_path, parent):
    return _TorchlessModule.from_parent(parent, path=module_path)
