"""RPC under ``elasticrun``: a killed worker, a restarted group, a resumed training; the examples.

Real agents (``python -m elastic.run --standalone``) and real workers, started and read through
:mod:`elastic.testing.agents`. Every process is stopped by PID at the end.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from elastic.testing import agents
from rpc_harness import WORKERS

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]

REPO = Path(__file__).resolve().parents[2]
TRAIN = WORKERS / "elastic_train.py"
STEPS = 60
RUN_TIMEOUT = 60.0


@pytest.fixture
def procs(tmp_path):
    """The test's agents; at the end also any worker of ours a killed agent left behind."""
    with agents.Job(tmp_path, timeout=RUN_TIMEOUT, worker_marker=str(WORKERS)) as job:
        yield job


@pytest.fixture
def reports(tmp_path, procs):
    return agents.Reports(tmp_path / "reports.jsonl", procs)


def elasticrun(procs: agents.Job, *args: str) -> agents.Launched:
    """``python -m elastic.run ARGS`` (TMPDIR: the PID files of a killed agent stay in the test's directory)."""
    return procs.start(f"agent{len(procs.agents)}", [sys.executable, "-m", "elastic.run", *args],
                       env=agents.clean_env(TMPDIR=str(procs.workdir)))


def steps_of_first_attempt_at_least(count: int):
    def seen(records: list[dict]) -> bool:
        return any(r["event"] == "step" and r["restart_count"] == 0 and r["step"] >= count for r in records)
    return seen


def test_killing_a_worker_restarts_the_group_and_training_resumes_from_its_checkpoint(procs, reports, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    agent = elasticrun(procs, "--standalone", "--nproc-per-node=2", "--max-restarts=1", "--role=worker",
                       str(TRAIN), str(reports.path), str(checkpoints), "--steps", str(STEPS),
                       "--step-delay", "0.05")
    records = reports.wait_for("step 5 of the first attempt", steps_of_first_attempt_at_least(5), [agent])
    victim = next(r["pid"] for r in records if r["event"] == "rpc_up" and r["restart_count"] == 0 and r["rank"] == 1)
    os.kill(victim, signal.SIGKILL)  # stage 1's owner dies mid-training

    assert agent.wait() == 0, agent.stderr[-4000:]
    assert "restart 1 of 1" in agent.stderr
    assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == psutil.STATUS_ZOMBIE

    # RPC re-formed: the same names, through a fresh store (new port, restart-1 prefix).
    up = {attempt: {r["name"]: r["init_method"] for r in reports.events("rpc_up", restart_count=attempt)}
          for attempt in (0, 1)}
    assert set(up[0]) == set(up[1]) == {"worker0", "worker1"}
    first, second = set(up[0].values()), set(up[1].values())
    assert len(first) == len(second) == 1  # one init method per attempt, shared by its workers
    (first,), (second,) = first, second
    assert "restart-0" in first and "restart-1" in second
    assert first.split("/")[2] != second.split("/")[2]  # host:port: a fresh MASTER_PORT

    # Resumed from the newest step both owners had saved, then finished.
    saved_before = max(r["step"] for r in reports.events("step", restart_count=0))
    resumed = reports.events("resumed", restart_count=1)
    assert len(resumed) == 1 and saved_before <= resumed[0]["step"] <= saved_before + 1
    assert resumed[0]["shards"] == ["worker0", "worker1"]  # one checkpoint folder per role rank
    steps_after = [r["step"] for r in reports.events("step", restart_count=1)]
    assert steps_after == list(range(resumed[0]["step"] + 1, STEPS + 1))
    (finished,) = reports.events("finished")
    assert finished["restart_count"] == 1 and finished["step"] == STEPS

    # ... and ended exactly where an uninterrupted local training ends.
    sys.path.insert(0, str(WORKERS))
    try:
        import toy
    finally:
        sys.path.remove(str(WORKERS))
    import torch

    final = {key: torch.tensor(value) for key, value in finished["state"].items()}
    assert toy.max_difference(final, toy.train_locally(STEPS)) <= 1e-6


def test_the_pipeline_example_recovers_from_a_crash_and_finishes(procs, tmp_path):
    agent = elasticrun(procs, "--standalone", "--nproc-per-node=3", "--max-restarts=1",
                       str(REPO / "examples" / "rpc_pipeline.py"), "--steps", "12", "--checkpoint-every", "4",
                       "--crash-at-step", "8", "--checkpoint-dir", str(tmp_path / "checkpoints"))
    assert agent.wait() == 0, agent.stderr[-4000:]
    out = agent.stdout
    assert "starting at step 0 (restart count 0" in out and "failing on purpose at step 8" in out
    assert "starting at step 8 (restart count 1" in out
    assert "done: 12 steps" in out and "2 stages" in out
    assert "restart 1 of 1" in agent.stderr


def test_the_parameter_server_example_runs_to_the_end(procs, tmp_path):
    agent = elasticrun(procs, "--standalone", "--nproc-per-node=3", str(REPO / "examples" / "rpc_parameter_server.py"),
                       "--steps", "8", "--checkpoint-every", "4",
                       "--checkpoint-dir", str(tmp_path / "checkpoints"))
    assert agent.wait() == 0, agent.stderr[-4000:]
    out = agent.stdout
    assert out.count("from step 0 (restart count 0)") == 2  # two trainers
    assert "step 8/8 loss" in out and "done: parameter server default0 served 2 trainers" in out
    assert sorted(os.listdir(tmp_path / "checkpoints" / "default0")) == ["step-000000004.pt", "step-000000008.pt"]
