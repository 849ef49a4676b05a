"""The whole training state through heals, end to end: real worker processes
(workers/live_steps.py: ``live.run`` over an ElasticLoader with a DataLoader worker and random
augmentation, dropout, an LR scheduler in the ``for`` body, accumulation, clipping, a
GradScaler), real gloo, and a simulated agent that hosts the rounds' stores.

After every heal a joiner is bit-for-bit where the survivors are: every attempt of a step, on
every rank, starts from the same digest of parameters, optimizer, scheduler, scaler, step and
data position; the scheduler has stepped exactly once per committed step; an attempt draws
what its rank draws at that step, whoever runs it and however often; and each rank's batch is
what the data plan gives its rank and world at the shared position, each sample augmented the
same wherever it is loaded.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import pytest

from support.live_agent import SimulatedAgent
from elastic.worker.data_plan import DataPosition, batch_indices, epoch_order, plan_step
from elastic.worker.refill import read_generation
from live_checks import worker_env

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]

WORKER = Path(__file__).parent / "workers" / "live_steps.py"
SAMPLES = 30
TOTAL = 16
START_TIMEOUT = 120.0  # a worker's torch import on a loaded 2-core machine
# A round that waits for every rank (nobody holds the state yet) waits as long as a start may take.
OPTIONS = ('{"collective_timeout": 5, "store_timeout": 5, "form_timeout": 120, "round_wait_timeout": 120, '
           '"interrupt_grace": 0.5, "drain_timeout": 10}')

WIDE_WINDOW = OPTIONS[:-1] + ', "regroup_window": 2}'
"""A regroup window of 2 s: the survivors of a crash form their subset together whatever the load."""


@pytest.fixture
def agent(tmp_path):
    hold = tmp_path / "hold"
    made: list[SimulatedAgent] = []

    def make(hold_at: int, options: str = OPTIONS, then: tuple[int, Path] | None = None) -> SimulatedAgent:
        """Workers that hold at step ``hold_at`` while ``hold`` exists (and at ``then[0]`` while ``then[1]`` does)."""
        hold.touch()
        steps, files = [str(hold_at)], [str(hold)]
        if then is not None:
            then[1].touch()
            steps, files = steps + [str(then[0])], files + [str(then[1])]
        env = worker_env(TOTAL, options=options, DATA_SAMPLES=str(SAMPLES), HOLD_AT=",".join(steps),
                         HOLD_FILE=",".join(files))
        made.append(SimulatedAgent(WORKER, tmp_path, env, run_id="live-steps", ready_pipe=True))
        return made[-1]

    try:
        yield make, hold
    finally:
        for each in made:
            each.close()


def _events(agent: SimulatedAgent, slot: str, kind: str) -> list[dict]:
    return [dict(event, slot=slot) for event in agent.events(slot) if event.get("ev") == kind]


def _wait_step(agent, slots, step, timeout=START_TIMEOUT):
    agent.wait_for(lambda: all(any(e["step"] >= step for e in _events(agent, slot, "step")) for slot in slots),
                   timeout, f"{slots} at step {step}")


def _wait_exit(agent, slot, timeout=START_TIMEOUT):
    proc = agent.workers[slot].proc
    agent.wait_for(lambda: proc.poll() is not None, timeout, f"{slot} to exit")
    return proc.returncode


def _join(agent, slot, round_):
    """Start ``slot`` in ``round_`` and, once it is joining, publish the round to the others."""
    agent.start(slot, round_)
    seen: list = []
    agent.wait_for(lambda: seen.extend(agent.ready_lines(slot)) or any(line.event == "joining" for line in seen),
                   START_TIMEOUT, f"{slot} joining")
    agent.publish(round_, [other for other in round_.slots if other != slot])


def _check_whole_state(agent: SimulatedAgent, slots: list[str], joiners: list[str]) -> dict[str, list[dict]]:
    attempts = {slot: _events(agent, slot, "attempt") for slot in slots}
    commits = {slot: _events(agent, slot, "step") for slot in slots}
    everything = [event for events in attempts.values() for event in events]

    states: dict[int, set[str]] = defaultdict(set)
    draws: dict[tuple[int, int], set[float]] = defaultdict(set)
    augmented: dict[tuple[int, int], set[str]] = defaultdict(set)
    for event in everything:
        states[event["step"]].add(event["state"])
        draws[(event["step"], event["rank"])].add(event["draw"])
        # the scheduler stepped once per committed step, on the rank that ran it or the one it healed from
        assert event["last_epoch"] == event["step"], f"{event['slot']} step {event['step']}: last_epoch {event['last_epoch']}"
        position = DataPosition(**event["position"])
        plan = plan_step(position, SAMPLES, event["rank"], event["world"], 2, 2)
        expected = [list(micro) for micro in batch_indices(plan, epoch_order(SAMPLES, position.seed, position.epoch, True))]
        assert event["batches"] == expected, f"{event['slot']} step {event['step']}: batches {event['batches']}, planned {expected}"
        for index, value in event["samples"]:
            augmented[(position.epoch, index)].add(value)
    assert sorted(states) == list(range(TOTAL))
    assert all(len(digests) == 1 for digests in states.values()), {s: d for s, d in states.items() if len(d) > 1}
    assert all(len(values) == 1 for values in draws.values()), {k: v for k, v in draws.items() if len(v) > 1}
    for step in range(TOTAL):
        ranks = [next(iter(values)) for (at, _), values in draws.items() if at == step]
        assert len(set(ranks)) == len(ranks), f"step {step}: two ranks drew the same"
    assert all(len(values) == 1 for values in augmented.values()), {k: v for k, v in augmented.items() if len(v) > 1}

    for slot, events in commits.items():
        numbers = [event["step"] for event in events]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))) if numbers else True, f"{slot}: {numbers}"
        assert [event["bodies"] for event in events] == list(range(1, len(events) + 1)), slot
    for joiner in joiners:
        first = attempts[joiner][0]
        assert first["step"] > 0 and first["attempt"] == 1, first
    return attempts


def test_a_joiner_after_a_crash_mid_step_is_bit_for_bit_where_the_survivors_are(agent):
    make, hold = agent
    agent = make(hold_at=9)
    first = agent.new_round(["w0", "w1", "w2"])
    agent.start("w0", first)
    agent.start("w1", first)
    agent.start("w2", first, {"CRASH_AT": "step:6"})
    assert _wait_exit(agent, "w2") != 0
    agent.publish(agent.new_round(["w0", "w1"]))  # step 6 runs again in a world of 2
    _wait_step(agent, ["w0", "w1"], 9)            # and the survivors hold in step 9's body
    _join(agent, "w3", agent.new_round(["w0", "w1", "w3"]))
    hold.unlink()
    for slot in ("w0", "w1", "w3"):
        assert _wait_exit(agent, slot) == 0, agent.describe()

    attempts = _check_whole_state(agent, ["w0", "w1", "w2", "w3"], joiners=["w3"])
    retried = [(event["attempt"], event["world"]) for event in attempts["w0"] if event["step"] == 6]
    assert retried == [(1, 3), (2, 2)]
    assert attempts["w3"][0]["step"] == 10 and attempts["w3"][0]["rank"] == 2


def test_a_joiner_after_a_crash_between_the_commit_and_the_for_body_is_bit_for_bit_where_the_survivors_are(agent):
    make, hold = agent
    # The survivors of w2's crash go on without it (issue 37): they hold again at step 10 for w3.
    held = hold.with_name("held-at-10")
    agent = make(hold_at=4, options=WIDE_WINDOW, then=(10, held))
    first = agent.new_round(["w0", "w1"])
    agent.start("w0", first)
    agent.start("w1", first)
    _wait_step(agent, ["w0", "w1"], 4)  # they hold in step 4's body
    grown = agent.new_round(["w0", "w1", "w2"])
    agent.start("w2", grown, {"CRASH_AT": "body:8"})
    seen: list = []
    agent.wait_for(lambda: seen.extend(agent.ready_lines("w2")) or any(line.event == "joining" for line in seen),
                   START_TIMEOUT, "w2 joining")
    agent.publish(grown, ["w0", "w1"])
    hold.unlink()
    assert _wait_exit(agent, "w2") != 0
    _wait_step(agent, ["w0", "w1"], 10)  # in round 1 without w2, held in step 10's body
    _join(agent, "w3", agent.new_round(["w0", "w1", "w3"]))
    held.unlink()
    for slot in ("w0", "w1", "w3"):
        assert _wait_exit(agent, slot) == 0, agent.describe()

    attempts = _check_whole_state(agent, ["w0", "w1", "w2", "w3"], joiners=["w2", "w3"])
    retried = [(event["attempt"], event["world"], event["round"]) for event in attempts["w0"] if event["step"] == 9]
    assert retried == [(1, 3, 1), (2, 2, 1)]  # the round's next generation, without w2 and without a new round
    assert attempts["w2"][0]["step"] == 5
    assert [event["step"] for event in _events(agent, "w2", "step")] == [5, 6, 7]  # 8 committed, its body cut short
    assert attempts["w2"][-1]["step"] == 8


def _generations(round_):
    """The round's generation now, each call, read from its store as a worker reads it."""
    import torch.distributed as dist

    client = dist.TCPStore("127.0.0.1", round_.master_port, is_master=False, timeout=timedelta(seconds=10))
    store = dist.PrefixStore(round_.store_prefix, client)
    return lambda: read_generation(store).number


def test_a_subset_formed_without_a_crashed_rank_deals_by_live_rank_and_heals_its_late_replacement(agent):
    # Issue 37: w1 (round rank 1) crashes mid-step; w0 and w2 re-form the round's next
    # generation without it at once (no new round): live ranks 0 and 1 of a world of 2, the data
    # dealt and the generators seeded that way. Its replacement (ELASTIC_REFILL, round rank 1)
    # comes later, moves the generation, and the members take it in at a step boundary, where it
    # heals bit-for-bit.
    make, hold = agent
    agent = make(hold_at=9, options=WIDE_WINDOW)
    first = agent.new_round(["w0", "w1", "w2"])
    agent.start("w0", first)
    agent.start("w1", first, {"CRASH_AT": "step:6"})
    agent.start("w2", first)
    assert _wait_exit(agent, "w1") != 0
    _wait_step(agent, ["w0", "w2"], 9)  # in a world of 2, held in step 9's body
    agent.start("w3", dataclasses.replace(first, slots=("w0", "w3", "w2")), {"ELASTIC_REFILL": "1"})
    generation = _generations(first)
    assert generation() == 1  # the survivors' refill, formed without w1
    agent.wait_for(lambda: generation() == 2, START_TIMEOUT, "the replacement to move the generation")
    time.sleep(0.5)  # the members' watchers (a read every 0.1 s) see it before their 6 steps left run out
    hold.unlink()
    for slot in ("w0", "w2", "w3"):
        assert _wait_exit(agent, slot) == 0, agent.describe()

    attempts = _check_whole_state(agent, ["w0", "w1", "w2", "w3"], joiners=["w3"])
    assert {event["round"] for slot in attempts for event in attempts[slot]} == {0}
    retried = [(event["attempt"], event["world"], event["rank"]) for event in attempts["w2"] if event["step"] == 6]
    assert retried == [(1, 3, 2), (2, 2, 1)]
    # the members take w3 in at the first step boundary after their watcher (0.1 s) saw the move
    joined = attempts["w3"][0]
    assert joined["step"] >= 10 and (joined["rank"], joined["world"]) == (1, 3), joined
    last = {event["step"]: event for event in attempts["w2"]}  # each step's committed attempt
    assert [last[step]["world"] for step in range(joined["step"], TOTAL)] == [3] * (TOTAL - joined["step"])
