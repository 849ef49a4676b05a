"""ElasticLoader under LiveTraining, end to end: real worker processes (workers/live_data.py),
each with a DataLoader of 2 worker processes, real gloo, and a simulated agent that hosts the
rounds' stores; a worker is killed mid-epoch and a joiner takes its place."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest

from support.live_agent import SimulatedAgent
from live_checks import TEST_OPTIONS, assert_no_redo, last_step, steps, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]

WORKER = Path(__file__).parent / "workers" / "live_data.py"
SAMPLES = 50
START_TIMEOUT = 120.0


@pytest.fixture
def agent(tmp_path):
    agent = SimulatedAgent(WORKER, tmp_path, {**worker_env(300, step_sleep=0.02, options=TEST_OPTIONS),
                                              "DATA_SAMPLES": str(SAMPLES)}, run_id="live-data", ready_pipe=True)
    try:
        yield agent
    finally:
        agent.close()


def _wait_steps(agent, slots, step, timeout=60.0):
    agent.wait_for(lambda: all(last_step(agent.events(slot)) >= step for slot in slots), timeout, f"{slots} at step {step}")


def test_a_worker_lost_and_replaced_mid_epoch_leaves_every_sample_used_once_per_epoch(agent):
    first = agent.new_round(["w0", "w1", "w2"])
    for slot in first.slots:
        agent.start(slot, first)
    _wait_steps(agent, first.slots, 7, START_TIMEOUT)

    agent.kill("w2")  # mid-step: the survivors run that step again in a world of 2
    agent.publish(agent.new_round(["w0", "w1"]))
    joined = agent.new_round(["w0", "w1", "w3"])
    agent.start("w3", joined)
    seen: list[dict] = []
    agent.wait_for(lambda: seen.extend(agent.ready_lines("w3")) or any(line.event == "joining" for line in seen),
                   START_TIMEOUT, "w3 joining")
    assert last_step(agent.events("w0")) < 250, "the survivors finished before the joiner started"
    agent.publish(joined, ["w0", "w1"])
    for slot in ("w0", "w1", "w3"):
        proc = agent.workers[slot].proc
        agent.wait_for(lambda: proc.poll() is not None, 120.0, f"{slot} to exit")
        assert proc.returncode == 0, f"{slot} exited {proc.returncode}\n{agent.describe()}"

    logs = {slot: steps(agent.events(slot)) for slot in ("w0", "w1", "w2", "w3")}
    assert_no_redo(agent.events("w0"))
    by_step: dict[int, list[dict]] = defaultdict(list)
    for events in logs.values():
        for event in events:
            by_step[event["step"]].append(event)
    assert sorted(by_step) == list(range(300))
    used: dict[int, list[int]] = defaultdict(list)
    for step, events in by_step.items():
        newest = max(event["round"] for event in events)  # a step w2 committed alone is run again
        kept = [event for event in events if event["round"] == newest]
        assert sorted(event["rank"] for event in kept) == list(range(kept[0]["world"])), f"step {step}: {kept}"
        assert len({(event["epoch"], event["consumed"]) for event in kept}) == 1, f"step {step}: {kept}"
        used[kept[0]["epoch"]].extend(index for event in kept for index in event["used"])
    worlds = [by_step[step][0]["world"] for step in sorted(by_step)]
    assert {2, 3} <= set(worlds) and worlds[0] == 3 and worlds[-1] == 3
    assert logs["w3"][0]["step"] > 7  # the joiner began where the survivors were (checked above)
    complete = sorted(used)[:-1]  # the last epoch may be cut short by the end of the run
    assert len(complete) > 20
    for epoch in complete:
        assert Counter(used[epoch]) == Counter(range(SAMPLES)), f"epoch {epoch}"
