"""The RPC tests' harness: worker groups started with the environment elasticrun gives.

A :class:`Spawner` starts one real process per rank running ``workers/scenarios.py`` with the
environment built by ``elastic.agent.processes.worker_env.worker_env`` (the function elasticrun itself
uses), a free ``MASTER_PORT``, and optionally several roles. Every process is stopped by PID at
the end of its fixture, whatever happened. The ``elasticrun`` helpers (launchers, JSON-line
reports) are those of ``tests/agent/test_elasticrun.py``, loaded from there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path


from elastic.agent.processes.worker_env import worker_env
from elastic.config import Entrypoint, LaunchConfig
from elastic.rendezvous.api import RendezvousInfo

HERE = Path(__file__).parent
WORKERS = HERE / "workers"
SCENARIOS = WORKERS / "scenarios.py"
SCENARIO_TIMEOUT = 90.0


def _load_e2e():
    """``tests/agent/test_elasticrun.py`` as a library module (its tests are not re-collected)."""
    path = HERE.parent / "agent" / "test_elasticrun.py"
    spec = importlib.util.spec_from_file_location("_elasticrun_e2e_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


e2e = _load_e2e()


@dataclass
class Spawned:
    """The processes of one scenario run, their logs and their JSON results."""

    out_dir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def wait(self, timeout: float = SCENARIO_TIMEOUT) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for rank, proc in enumerate(self.procs):
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"rank {rank} did not exit within {timeout:g}s:\n{self.log(rank)}") from None
        return codes

    def log(self, rank: int) -> str:
        return self.logs[rank].read_text(errors="replace")[-6000:]

    def result(self, rank: int) -> dict:
        path = self.out_dir / f"result-{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result:\n{self.log(rank)}"
        return json.loads(path.read_text())

    def stop(self) -> None:
        """SIGKILL whatever is still running (each process by its PID), then reap it."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)


def elastic_worker_env(rank: int, world: int, port: int, *, role: tuple[str, int, int] | None = None,
                       run_id: str = "rpc-test", restart_count: int = 0, error_dir: Path) -> dict[str, str]:
    """What elasticrun gives worker ``rank`` of a one-node ``world`` (plus role overrides)."""
    base = e2e.clean_env()
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world,
                          entrypoint=Entrypoint("script", str(SCENARIOS)), role="worker")
    info = RendezvousInfo(run_id=run_id, round=0, group_rank=0, group_world_size=1,
                          master_addr="127.0.0.1", master_port=port, members=())
    env = worker_env(base, config, info, rank, restart_count=restart_count,
                     error_file=str(error_dir / f"error-{rank}.json"), use_agent_store=False)
    if role is not None:
        env.update(ROLE_NAME=role[0], ROLE_RANK=str(role[1]), ROLE_WORLD_SIZE=str(role[2]))
    return env


class Spawner:
    """Starts scenario runs (``spawner(scenario, world, roles=None)``, or ``.run`` to completion); stops them all."""

    def __init__(self, tmp_path_factory) -> None:
        self._tmp = tmp_path_factory
        self._runs: list[Spawned] = []

    def __call__(self, scenario: str, world: int, roles: list[tuple[str, int, int]] | None = None) -> Spawned:
        out_dir = self._tmp.mktemp(scenario)
        port = e2e.free_port()
        run_id = f"rpc-{uuid.uuid4().hex[:8]}"
        spawned = Spawned(out_dir)
        self._runs.append(spawned)
        for rank in range(world):
            env = elastic_worker_env(rank, world, port, role=roles[rank] if roles else None, run_id=run_id,
                                     error_dir=out_dir)
            log = out_dir / f"log-{rank}.txt"
            with open(log, "wb") as sink:
                spawned.procs.append(subprocess.Popen(
                    [sys.executable, "-u", str(SCENARIOS), scenario, str(out_dir)],
                    env=env, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                ))  # fmt: skip
            spawned.logs.append(log)
        return spawned

    def run(self, scenario: str, world: int, roles: list[tuple[str, int, int]] | None = None) -> list[dict]:
        """Run a scenario to completion; every rank must exit 0. Returns each rank's result."""
        spawned = self(scenario, world, roles)
        codes = spawned.wait()
        failed = [f"rank {rank} exit {code}:\n{spawned.log(rank)}" for rank, code in enumerate(codes) if code != 0]
        assert not failed, "\n".join(failed)
        return [spawned.result(rank) for rank in range(world)]

    def stop_all(self) -> None:
        for spawned in self._runs:
            spawned.stop()




def free_port() -> int:
    return e2e.free_port()


def wait_for_files(paths: list[Path], procs: list[subprocess.Popen], timeout: float = SCENARIO_TIMEOUT) -> None:
    """Poll until every path exists; fail early if one of ``procs`` exits meanwhile."""
    deadline = time.monotonic() + timeout
    while not all(path.exists() for path in paths):
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"process {proc.pid} exited ({proc.returncode}) before {paths} appeared")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {paths}")
        time.sleep(0.05)
