"""Fixtures of the live-recovery tests: a simulated agent whose workers are killed by PID at teardown."""

from __future__ import annotations

from typing import Iterator

import pytest

from live_checks import WORKER

from support.live_agent import SimulatedAgent


@pytest.fixture
def live_agent(tmp_path) -> Iterator:
    """``live_agent(env, ready_pipe=True)``: a SimulatedAgent running workers/live_train.py."""
    agents: list[SimulatedAgent] = []

    def make(env: dict[str, str], ready_pipe: bool = True) -> SimulatedAgent:
        agent = SimulatedAgent(WORKER, tmp_path, env, run_id=f"live-{len(agents)}", ready_pipe=ready_pipe)
        agents.append(agent)
        return agent

    try:
        yield make
    finally:
        for agent in agents:
            agent.close()
