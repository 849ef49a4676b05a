"""RPC across two agents: a worker crashes mid-training, RPC re-forms, the job ends as if it had not.

Two ``elasticrun`` agents (``--rdzv-backend=etcd``, the session's real etcd), two workers each,
run the examples with ``--crash-at-step``: one worker exits 1 once, both agents restart their
workers, and ``rpc.start()`` must meet again on one store prefix (run id + restart count): every
rank of the new attempt has to agree on ``TORCHELASTIC_RESTART_COUNT``. Before that agreement
the two nodes waited on different prefixes until the RPC init timeout; ``ELASTIC_RPC_INIT_TIMEOUT``
is shortened here so such a run fails in about a minute instead of hanging.

The reference ("uninterrupted") result is the same example run without the crash on one agent
with the same world of 4 (``--standalone --nproc-per-node 4``): the computation does not depend
on how the ranks are spread over nodes. Every process is stopped by PID at the end.
"""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path

import pytest

import harness
from elastic.testing.agents import Job, Launched
from harness import REPO, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.needs_torch]

EXAMPLES = REPO / "examples"
RPC_ENV = {"ELASTIC_RPC_INIT_TIMEOUT": "20", "ELASTIC_RPC_TIMEOUT": "30"}
RUN_TIMEOUT = 60.0
"""Seconds a run may take in all (a crash, a restart, two torch imports per worker: ~20 s alone)."""


@pytest.fixture
def agents(tmp_path):
    """The test's elasticrun agents; every one (and its tree) is stopped by PID at the end."""
    with Job(tmp_path, timeout=RUN_TIMEOUT) as job:
        yield job


def start(agents: Job, label: str, flags: list[str], script: Path, args: list[str]) -> Launched:
    argv = [sys.executable, "-m", "elastic.run", *flags, f"--log-dir={agents.workdir / f'logs-{label}'}",
            str(script), *args]
    return agents.start(label, argv, env=clean_env(**RPC_ENV), cwd=agents.workdir)


def etcd_flags(etcd_server, run_id: str) -> list[str]:
    config = etcd_server.client_config()
    return ["--nnodes=2", "--nproc-per-node=2", "--max-restarts=1", "--monitor-interval=0.2",
            "--rdzv-backend=etcd", f"--rdzv-endpoint={etcd_server.endpoints}", f"--rdzv-id={run_id}",
            f"--rdzv-conf={harness.OURS_CONF},user={config.user},password={config.password}",
            "--local-addr=127.0.0.1"]


def crash_run(agents: Job, etcd_server, script: Path, args: list[str]) -> tuple[str, str]:
    """Two agents x two workers with the crash; their stdout (joined) and a failure report."""
    flags = etcd_flags(etcd_server, f"rpc-mn-{uuid.uuid4().hex[:8]}")
    started = [start(agents, label, flags, script, args) for label in ("A", "B")]
    codes = agents.collect([agent.name for agent in started])  # None: still running after RUN_TIMEOUT
    out = "\n".join(agent.stdout for agent in started)
    report = "" if all(code == 0 for code in codes.values()) else (
        f"the two-agent run after the crash did not finish: exit codes {codes} (None: still running after "
        f"{RUN_TIMEOUT:g}s)\n" + "\n".join(f"--- agent {a.name} stdout:\n{a.stdout[-2000:]}\n--- stderr:\n"
                                           f"{a.stderr[-3000:]}" for a in started))
    return out, report


def uninterrupted_run(agents: Job, script: Path, args: list[str]) -> str:
    agent = start(agents, "reference", ["--standalone", "--nproc-per-node=4"], script, args)
    codes = agents.collect([agent.name])
    assert codes == {agent.name: 0}, f"the uninterrupted run failed ({codes}):\n{agent.stderr[-3000:]}"
    return agent.stdout


def test_pipeline_example_on_two_agents_recovers_from_a_crash_with_the_uninterrupted_result(
        agents, etcd_server, tmp_path):
    """The driver (rank 0) fails at step 8; the job resumes from the step-8 checkpoint and ends
    with the final loss of the same pipeline run without a crash (a synchronous pipeline on
    seeded data is deterministic: the printed loss is equal to all its digits)."""
    common = ["--steps", "12", "--checkpoint-every", "4"]
    out, report = crash_run(agents, etcd_server, EXAMPLES / "rpc_pipeline.py",
                            [*common, "--crash-at-step", "8", "--checkpoint-dir", str(tmp_path / "crash")])
    assert not report, report
    reference = uninterrupted_run(agents, EXAMPLES / "rpc_pipeline.py",
                                  [*common, "--checkpoint-dir", str(tmp_path / "reference")])
    assert "failing on purpose at step 8" in out
    assert "starting at step 8 (restart count 1" in out, out
    final = re.findall(r"done: 12 steps, final loss ([0-9.]+), 3 stages", out)
    expected = re.findall(r"done: 12 steps, final loss ([0-9.]+), 3 stages", reference)
    assert len(expected) == 1 and final == expected, (out, reference)


def test_parameter_server_example_on_two_agents_recovers_from_a_crash_and_finishes(agents, etcd_server, tmp_path):
    """Trainer 1 fails at step 10 (just checkpointed); every trainer resumes from step 10 and the
    job ends as the uninterrupted run does: each of the 3 trainers done with 40 steps, the server
    served 3 trainers, the same checkpoints. The loss itself is not compared: three trainers
    stepping one model asynchronously (Hogwild) is not deterministic (two uninterrupted runs
    measured here ended at 7.37 and 0.065)."""
    common = ["--steps", "40"]
    crash_dir, reference_dir = tmp_path / "crash", tmp_path / "reference"
    out, report = crash_run(agents, etcd_server, EXAMPLES / "rpc_parameter_server.py",
                            [*common, "--crash-at-step", "10", "--checkpoint-dir", str(crash_dir)])
    assert not report, report
    reference = uninterrupted_run(agents, EXAMPLES / "rpc_parameter_server.py",
                                  [*common, "--checkpoint-dir", str(reference_dir)])
    assert "failing on purpose at step 10" in out
    assert out.count("from step 10 (restart count 1)") == 3, out  # all trainers, from the checkpoint

    def ending(text: str, restart: int) -> list[str]:
        """The trainers done in attempt ``restart``, then the server's last lines. Trainers of the
        failed attempt can finish their 40 steps before their agent stops them: not counted."""
        trainers = re.findall(rf"(default\d) done: 40 steps \(restart count {restart}\)", text)
        return sorted(trainers) + re.findall(r"done: parameter server default\d served \d trainers", text)

    assert ending(out, 1) == ending(reference, 0) == [
        "default1", "default2", "default3", "done: parameter server default0 served 3 trainers"], (out, reference)
    assert sorted(p.name for p in (crash_dir / "default0").iterdir()) == \
        sorted(p.name for p in (reference_dir / "default0").iterdir())
