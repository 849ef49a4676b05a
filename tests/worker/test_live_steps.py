"""LiveTraining's step scope in one process (a real one-rank gloo group, a real round pipe):
what is committed, what is swallowed, what propagates."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from elastic.worker import Cause, LiveOptions, LiveTraining, Round
from elastic.worker.errors import AgentGoneError, CollectiveFailed
from elastic.worker.rounds import encode_round_line


class OneRankAgent:
    """Hosts round stores for a one-rank job and writes its round lines."""

    def __init__(self, pipe: bool = True) -> None:
        self.stores = []
        self.read_fd, self.write_fd = os.pipe() if pipe else (None, None)

    def round(self, number: int) -> Round:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
        self.stores.append(store)
        return Round(number, 0, 1, 0, 1, 0, "127.0.0.1", store.port, 0, f"live/round-{number}")

    def environ(self, first: Round) -> dict[str, str]:
        env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(first.master_port),
               "TORCHELASTIC_RUN_ID": "steps", "ELASTIC_ROUND": str(first.round), "ELASTIC_STORE_PREFIX": first.store_prefix}
        if self.read_fd is not None:
            env["ELASTIC_ROUND_FD"] = str(self.read_fd)
        return env

    def publish(self, round_: Round) -> None:
        os.write(self.write_fd, encode_round_line(round_))

    def close(self) -> None:
        if self.write_fd is not None:
            os.close(self.write_fd)


@pytest.fixture
def live_one():
    made = []

    def make(pipe: bool = True):
        agent = OneRankAgent(pipe)
        first = agent.round(0)
        weight = torch.nn.Parameter(torch.ones(3))
        env = agent.environ(first)
        live = LiveTraining(lambda: {"w": weight}, lambda state: weight.data.copy_(state["w"]), environ=env,
                            options=LiveOptions(form_timeout=10, round_wait_timeout=5, collective_timeout=10))
        made.append((agent, live))
        return agent, live.start(), env

    yield make
    for agent, live in made:
        live.close()
        agent.close()


def test_a_step_whose_body_returns_is_committed(live_one):
    _, live, _ = live_one()
    for _ in range(3):
        with live.train_step():
            live.all_reduce(torch.ones(2))
    assert live.step == 3 and [r.cause for r in live.recoveries] == [Cause.START]


def test_a_user_error_propagates_and_the_step_is_not_committed(live_one):
    _, live, _ = live_one()
    with pytest.raises(KeyError):
        with live.train_step():
            raise KeyError("user bug")
    with live.train_step():  # the group is intact: no recovery
        pass
    assert live.step == 1 and len(live.recoveries) == 1


def test_a_lost_group_is_swallowed_and_the_step_runs_again_on_the_next_round(live_one):
    agent, live, env = live_one()
    with live.train_step():
        pass
    with live.train_step():
        raise CollectiveFailed("round 0: a collective failed: Connection closed by peer", 0)
    assert live.step == 1
    newer = agent.round(1)
    agent.publish(newer)
    with live.train_step():
        live.all_reduce(torch.ones(1))
    assert live.step == 2
    assert [(r.round, r.cause, r.step) for r in live.recoveries] == [(0, Cause.START, 0), (1, Cause.LOST, 1)]
    assert (env["MASTER_PORT"], env["ELASTIC_ROUND"], live.round) == (str(newer.master_port), "1", newer)


def test_a_pending_round_is_formed_at_the_next_step_boundary(live_one):
    agent, live, _ = live_one()
    agent.publish(agent.round(1))
    deadline = time.monotonic() + 5
    while not live.new_round_pending:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with live.train_step():
        pass
    assert [(r.round, r.cause) for r in live.recoveries][-1] == (1, Cause.ROUND) and live.step == 1


def test_without_a_round_pipe_a_lost_group_ends_the_worker(live_one):
    _, live, _ = live_one(pipe=False)
    with live.train_step():
        raise CollectiveFailed("round 0: a collective failed", 0)
    with pytest.raises(AgentGoneError, match="there is no round pipe"):
        with live.train_step():
            pass
