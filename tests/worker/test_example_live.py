"""``examples/train_live.py`` under ``elasticrun --live-recovery``: it trains, checkpoints from
``live.run``'s ``for`` body, and a whole-job restart resumes at the checkpoint's step on every
rank (``live.load_state_dict`` before ``start``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from elastic.testing.agents import clean_env

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]


def run_example(checkpoint: Path, steps: int) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "elastic.run", "--standalone", "--nproc-per-node=2", "--live-recovery",
         str(REPO / "examples" / "train_live.py"), "--steps", str(steps), "--checkpoint", str(checkpoint),
         "--checkpoint-every", "10", "--log-every", "5"],
        env=clean_env(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300,
        cwd=checkpoint.parent)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def test_the_live_example_checkpoints_and_a_whole_job_restart_resumes_at_its_step(tmp_path):
    checkpoint = tmp_path / "live.pt"
    first = run_example(checkpoint, 20)
    assert sorted(re.findall(r"rank (\d) of 2: starting at step (\d+)", first)) == [("0", "0"), ("1", "0")]
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["library"]["step"] == 20 and saved["user"]["sched"]["last_epoch"] == 20
    assert saved["library"]["data"]["consumed"] == 20 * 2 * 16 * 2 % 4096

    second = run_example(checkpoint, 30)
    assert sorted(re.findall(r"rank (\d) of 2: starting at step (\d+)", second)) == [("0", "20"), ("1", "20")]
    assert re.findall(r"step (\d+)/30", second) == ["25", "30"]
    assert sorted(re.findall(r"rank (\d): done at step (\d+)", second)) == [("0", "30"), ("1", "30")]
