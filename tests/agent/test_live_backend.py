"""``elasticrun --standalone --live-recovery`` with a LiveTraining worker that asks for NCCL (this
machine has no GPU and a CPU build of torch): the worker refuses in one line before it forms
anything, the agent's failure report names the refusal, and the run ends at once, never hangs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from elastic.testing import agents

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from live_checks import REPO, WORKER  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]

CASES = {
    "nccl asked, pre-warmed": ({}, [], "LiveOptions(backend='nccl') asks for NCCL, which live recovery does not support yet"),
    "nccl asked, started normally": ({}, ["--no-prewarm"],
                                     "LiveOptions(backend='nccl') asks for NCCL, which live recovery does not support yet"),
    "nccl opted in on a CPU build": ({"ELASTIC_LIVE_NCCL": "1"}, ["--no-prewarm"],
                                     "LiveOptions(backend='nccl') asks for NCCL, but this torch has no NCCL built in"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_live_worker_asking_for_nccl_refuses_in_one_line_and_the_agent_names_it(procs, tmp_path, case):
    extra_env, flags, refusal = CASES[case]
    env = agents.clean_env(TMPDIR=str(procs.workdir), PYTHONPATH=str(REPO), LIVE_LOG=str(tmp_path / "live.jsonl"),
                           LIVE_OPTIONS='{"backend": "nccl"}', OMP_NUM_THREADS="1", **extra_env)
    agent = procs.elasticrun("--standalone", "--nproc-per-node", "1", "--max-restarts", "0", "--live-recovery", *flags,
                             str(WORKER), env=env)
    assert agent.wait() == 1, agent.describe()  # the harness's deadline (60 s): a hang fails here, with stacks
    stderr = agent.stderr
    worker_lines = [line for line in stderr.splitlines() if refusal in line and not line.startswith(" ")]
    assert len(worker_lines) == 1 and worker_lines[0].startswith("run "), stderr
    assert "Traceback" not in stderr and "did not form" not in stderr, stderr
    assert f"  error      : UnsupportedBackendError: {worker_lines[0]}" in stderr.splitlines(), stderr
    assert "1 attempt, no restarts" in stderr.splitlines()[-1], stderr
