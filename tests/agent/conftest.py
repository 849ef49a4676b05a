"""Fixtures of the ``elasticrun`` end-to-end tests (their helpers are ``e2e.py``).

Every process a fixture starts is stopped by PID at its teardown, whatever happened.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from e2e import Processes
from elastic.testing.agents import Reports


@pytest.fixture
def procs(tmp_path) -> Iterator[Processes]:
    """The test's launchers and stores; at the end all of them and every worker reported."""
    with Processes(tmp_path) as processes:
        yield processes


@pytest.fixture
def reports(tmp_path, procs) -> Reports:
    """The workers' JSON lines (``tmp_path/reports.jsonl``); the pids read are stopped with ``procs``."""
    return Reports(tmp_path / "reports.jsonl", procs)
