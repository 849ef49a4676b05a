"""LiveTraining's steps in one process (a real one-rank gloo group, a real round pipe): what
is committed, what is swallowed, what propagates; ``run()``'s iterator of committed steps and
its checkpoint."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from elastic.worker import Cause, LiveOptions, LiveRecoveryError, LiveTraining, Round
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

    def make(pipe: bool = True, state=None, start: bool = True):
        agent = OneRankAgent(pipe)
        first = agent.round(0)
        weight = torch.nn.Parameter(torch.ones(3))
        env = agent.environ(first)
        pair = (lambda: {"w": weight}, lambda state: weight.data.copy_(state["w"])) if state is None else ()
        live = LiveTraining(*pair, state=state, environ=env,
                            options=LiveOptions(form_timeout=10, round_wait_timeout=5, collective_timeout=10))
        made.append((agent, live))
        return agent, live.start() if start else live, env

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


class Training:
    """A model, its optimizer and LR scheduler, registered with LiveTraining by name."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, 2, gamma=0.5)

    @property
    def state(self) -> dict:
        return {"model": self.model, "opt": self.opt, "sched": self.sched}

    def step(self, live: LiveTraining) -> float:
        self.opt.zero_grad()
        loss = self.model(torch.randn(5, 3)).pow(2).mean()
        loss.backward()
        for param in self.model.parameters():
            live.all_reduce(param.grad)
        self.opt.step()
        return loss.item()


def test_run_yields_each_committed_step_once_until_the_given_step(live_one):
    training = Training()
    _, live, _ = live_one(state=training.state)
    done = []
    for committed in live.run(lambda attempt: training.step(live), until=5):
        training.sched.step()
        done.append((committed.step, committed.attempts, committed.rank, committed.world_size, committed.samples))
        assert live.step == committed.step + 1
    assert done == [(step, 1, 0, 1, 0) for step in range(5)]
    assert training.sched.last_epoch == 5 and training.sched.get_last_lr() == [0.1 * 0.5**2]
    assert list(live.run(lambda attempt: pytest.fail("run past until"), until=5)) == []


def test_an_attempt_whose_group_was_lost_runs_again_with_the_same_draws_and_is_yielded_once(live_one):
    training = Training()
    _, live, _ = live_one(state=training.state)
    attempts = []

    def fn(attempt):
        attempts.append((attempt.step, attempt.attempt, torch.rand(2).tolist(), attempt.seed))
        if (attempt.step, attempt.attempt) == (1, 1):
            raise CollectiveFailed("round 0: a collective failed: Connection closed by peer", 0)
        return training.step(live)

    bodies = [committed.step for committed in live.run(fn, until=3)]
    assert bodies == [0, 1, 2]
    assert [(step, number) for step, number, _, _ in attempts] == [(0, 1), (1, 1), (1, 2), (2, 1)]
    assert attempts[1][2:] == attempts[2][2:] and attempts[0][2] != attempts[1][2]
    assert [r.cause for r in live.recoveries] == [Cause.START, Cause.LOST]


def test_an_attempt_whose_collective_failed_while_fn_went_on_is_not_committed(live_one):
    _, live, _ = live_one(state={})
    seen = []

    def fn(attempt):
        seen.append((attempt.step, attempt.attempt))
        if (attempt.step, attempt.attempt) == (0, 1):  # as a DDP bucket's failure, which fn does not see
            live._parts.recoverer.in_use.require().registry._record(CollectiveFailed("round 0: a collective failed", 0))
        return attempt.step

    assert [(c.step, c.result, c.attempts) for c in live.run(fn, until=2)] == [(0, 0, 2), (1, 1, 1)]
    assert seen == [(0, 1), (0, 2), (1, 1)]


def test_a_user_error_in_fn_ends_the_iterator_and_commits_nothing(live_one):
    _, live, _ = live_one(state={})
    with pytest.raises(KeyError):
        for _ in live.run(lambda attempt: {}["missing"]):
            pytest.fail("a step that raised was yielded")
    assert live.step == 0
    with pytest.raises(ValueError, match=r"until \(-1\) must be None or a step number"):
        live.run(lambda attempt: None, until=-1)


def test_a_train_step_scope_says_whether_its_step_was_committed(live_one):
    _, live, _ = live_one()
    with live.train_step() as scope:
        pass
    assert (scope.step, scope.committed) == (0, True)
    with live.train_step() as scope:
        raise CollectiveFailed("round 0: a collective failed", 0)
    assert (scope.step, scope.committed, live.step) == (1, False, 1)


def test_run_moves_the_data_on_for_committed_steps_only(live_one):
    from elastic.worker.data import ElasticLoader

    _, live, _ = live_one(state={})
    loader = ElasticLoader(list(range(40)), 4, accumulation=2, shuffle=False)
    used = []

    def fn(attempt):
        used.append([micro.data.tolist() for micro in attempt.batches])
        if (attempt.step, attempt.attempt) == (1, 1):
            raise CollectiveFailed("round 0: a collective failed", 0)

    samples = [committed.samples for committed in live.run(fn, data=loader, until=3)]
    assert samples == [8, 8, 8] and loader.position.consumed == 24
    assert used == [[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10, 11], [12, 13, 14, 15]],
                    [[8, 9, 10, 11], [12, 13, 14, 15]], [[16, 17, 18, 19], [20, 21, 22, 23]]]
    assert live.state_dict()["library"]["data"] == {"epoch": 0, "consumed": 24, "seed": 0}


def test_a_checkpoint_restores_the_step_every_registered_object_and_the_data_position(live_one):
    import io

    from elastic.worker.data import ElasticLoader

    saved, restored = Training(0), Training(1)
    _, live, _ = live_one(state=saved.state)
    loader = ElasticLoader(list(range(40)), 4)
    for committed in live.run(lambda attempt: saved.step(live), data=loader, until=3):
        saved.sched.step()
    buffer = io.BytesIO()
    torch.save(live.state_dict(), buffer)
    with pytest.raises(LiveRecoveryError, match="before start"):
        live.load_state_dict(live.state_dict())

    live.close()  # one default process group per process: the restored worker comes after
    _, fresh, _ = live_one(state=restored.state, start=False)
    fresh.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    assert fresh.step == 3
    fresh.start()
    assert fresh.step == 3
    assert restored.sched.state_dict() == saved.sched.state_dict()
    for mine, theirs in zip(restored.model.parameters(), saved.model.parameters()):
        assert torch.equal(mine, theirs)
    data = ElasticLoader(list(range(40)), 4)  # its position is the checkpoint's, taken when run() gets it
    assert [c.step for c in fresh.run(lambda attempt: None, data=data, until=4)] == [3]
    assert data.position.consumed == 16
