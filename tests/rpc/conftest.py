"""Fixtures of the RPC tests (the harness itself is ``rpc_harness.py``).

Every process a fixture starts is stopped by PID at its teardown, whatever happened.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from rpc_harness import Spawner, elastic_worker_env


@pytest.fixture
def worker_environ(tmp_path):
    """``worker_environ(rank, world, port, **kw)``: the environment elasticrun gives that worker."""
    def build(rank: int, world: int, port: int, **kwargs) -> dict[str, str]:
        return elastic_worker_env(rank, world, port, error_dir=tmp_path, **kwargs)
    return build


@pytest.fixture
def spawn(tmp_path_factory) -> Iterator[Spawner]:
    """Scenario runs for one test; every process is stopped by PID at teardown."""
    spawner = Spawner(tmp_path_factory)
    try:
        yield spawner
    finally:
        spawner.stop_all()


@pytest.fixture(scope="module")
def module_spawn(tmp_path_factory) -> Iterator[Spawner]:
    """Like ``spawn``, for module-scoped fixtures that share one run among several tests."""
    spawner = Spawner(tmp_path_factory)
    try:
        yield spawner
    finally:
        spawner.stop_all()

