"""The RPC tests' harness: worker groups started with the environment elasticrun gives.

A :class:`Spawner` starts one real process per rank running ``workers/scenarios.py`` with the
environment built by ``elastic.agent.worker_env.worker_env`` (the function elasticrun itself
uses), a free ``MASTER_PORT``, and optionally several roles. Each run is a
:class:`~elastic.testing.agents.Job`; every process is stopped by PID at the end of its fixture,
whatever happened.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

from elastic.agent.worker_env import worker_env
from elastic.config import Entrypoint, LaunchConfig
from elastic.rendezvous.api import RendezvousInfo
from elastic.testing import agents
from elastic.testing.ports import free_port

HERE = Path(__file__).parent
WORKERS = HERE / "workers"
SCENARIOS = WORKERS / "scenarios.py"
SCENARIO_TIMEOUT = 90.0


class Spawned(agents.Job):
    """The processes of one scenario run (rank ``r`` is ``ranks[r]``, its output in ``rank<r>.log``)
    and their JSON results."""

    def __init__(self, out_dir: Path) -> None:
        super().__init__(out_dir, timeout=SCENARIO_TIMEOUT)
        self.out_dir = out_dir
        self.ranks: list[agents.Launched] = []

    def wait(self, timeout: float = SCENARIO_TIMEOUT) -> list[int]:
        """Every rank's exit code (one deadline); fails naming a rank that did not exit, with its log."""
        codes = self.collect(timeout=timeout)
        for rank, launched in enumerate(self.ranks):
            if codes[launched.name] is None:
                raise agents.DidNotExit(f"rank {rank} did not exit within {timeout:g}s:\n{launched.describe(6000)}")
        return [codes[launched.name] for launched in self.ranks]

    def log(self, rank: int) -> str:
        return self.ranks[rank].stdout[-6000:]

    def result(self, rank: int) -> dict:
        path = self.out_dir / f"result-{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result:\n{self.log(rank)}"
        return json.loads(path.read_text())


def elastic_worker_env(rank: int, world: int, port: int, *, role: tuple[str, int, int] | None = None,
                       run_id: str = "rpc-test", restart_count: int = 0, error_dir: Path) -> dict[str, str]:
    """What elasticrun gives worker ``rank`` of a one-node ``world`` (plus role overrides)."""
    base = agents.clean_env()
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
        port = free_port()
        run_id = f"rpc-{uuid.uuid4().hex[:8]}"
        spawned = Spawned(out_dir)
        self._runs.append(spawned)
        for rank in range(world):
            env = elastic_worker_env(rank, world, port, role=roles[rank] if roles else None, run_id=run_id,
                                     error_dir=out_dir)
            spawned.ranks.append(spawned.start(f"rank{rank}", [sys.executable, "-u", str(SCENARIOS), scenario,
                                                               str(out_dir)], env=env, merge_output=True))
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
            spawned.stop_all()
