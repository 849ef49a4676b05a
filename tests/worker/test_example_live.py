"""``examples/train_live.py`` under ``elasticrun --live-recovery``: it trains standalone and every
rank prints the same final line; it checkpoints from ``live.run``'s ``for`` body, and a whole-job
restart resumes at the checkpoint's step on every rank (``live.load_state_dict`` before
``start``). Under faults on etcd: ``tests/agent/test_train_live_example.py``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from elastic.testing.agents import clean_env

REPO = Path(__file__).resolve().parents[2]
WINDOWS = (len((REPO / "README.md").read_bytes()) - 1) // 64
"""The windows of the example's default text (64 bytes each, + 1)."""
FINAL = re.compile(r"rank (\d) done: step (\d+), lr (\S+), samples (\d+), params ([0-9a-f]{16})")

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]


def run_example(workdir: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "elastic.run", "--standalone", "--nproc-per-node=2", "--live-recovery",
         str(REPO / "examples" / "train_live.py"), *args],
        check=False, env=clean_env(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300,
        cwd=workdir)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def test_the_live_example_runs_standalone_and_every_rank_prints_the_same_final_line(tmp_path):
    out = run_example(tmp_path, "--steps", "4", "--record", str(tmp_path / "records"))
    finals = FINAL.findall(out)
    assert sorted(final[:2] for final in finals) == [("0", "4"), ("1", "4")], out
    assert len({final[2:] for final in finals}) == 1, finals
    records = [json.loads(line) for path in (tmp_path / "records").glob("*.jsonl") for line in path.read_text().splitlines()]
    # 2 ranks x 4 steps, 2 micro-batches of 8 windows per rank and step, each window once
    assert sorted((r["step"], r["rank"]) for r in records) == [(s, r) for s in range(4) for r in range(2)]
    used = [index for r in records for index in r["used"]]
    assert len(used) == len(set(used)) == int(finals[0][3]) == 4 * 2 * 2 * 8 <= WINDOWS
    assert {r["params"] for r in records if r["step"] == 3} == {finals[0][4]}


def test_the_live_example_checkpoints_and_a_whole_job_restart_resumes_at_its_step(tmp_path):
    checkpoint = ["--checkpoint", str(tmp_path / "live.pt"), "--checkpoint-every", "10", "--log-every", "5"]
    first = run_example(tmp_path, "--steps", "20", *checkpoint)
    assert sorted(re.findall(r"rank (\d) of 2: starting at step (\d+)", first)) == [("0", "0"), ("1", "0")]
    saved = torch.load(tmp_path / "live.pt", weights_only=True)
    assert saved["library"]["step"] == 20 and saved["user"]["sched"]["last_epoch"] == 20
    position = saved["library"]["data"]
    assert saved["user"]["samples"]["count"] == position["epoch"] * WINDOWS + position["consumed"] > 0

    second = run_example(tmp_path, "--steps", "30", *checkpoint)
    assert sorted(re.findall(r"rank (\d) of 2: starting at step (\d+)", second)) == [("0", "20"), ("1", "20")]
    assert re.findall(r"step (\d+)/30", second) == ["25", "30"]
    finals = FINAL.findall(second)
    assert sorted(final[:2] for final in finals) == [("0", "30"), ("1", "30")]
    assert len({final[2:] for final in finals}) == 1, finals
