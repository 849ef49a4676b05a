"""Finding 11 of round three: the quick-start example's checkpoint lives in a private directory.

The example used ``/tmp/elastic-train-ddp-<run id>.pt``; the run id shows in ``ps``, so another
user planted a checkpoint there and the job "resumed at step 1000000" and exited 0. Each test
runs ``examples/train_ddp.py`` as a real one-rank gloo worker (the environment elasticrun gives).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import uuid

import pytest
import torch

from elastic.testing.ports import free_port
from hostile import REPO

NOBODY = 65534
pytestmark = pytest.mark.slow  # each test starts a torch worker


def train(tmp_path, run_id: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TORCHELASTIC_RUN_ID": run_id, "TMPDIR": str(tmp_path)}
    env.pop("CHECKPOINT_PATH", None)
    return subprocess.run([sys.executable, str(REPO / "examples" / "train_ddp.py"), "--steps", "3",
                           "--checkpoint-every", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)


def plant(path) -> None:
    model = torch.nn.Linear(16, 1)
    torch.save({"model": model.state_dict(), "optimizer": torch.optim.SGD(model.parameters(), lr=0.05).state_dict(),
                "step": 1_000_000}, path)
    os.chown(path, NOBODY, NOBODY)


@pytest.fixture
def run_id():
    run_id = f"planted-{uuid.uuid4().hex[:8]}"
    yield run_id
    for leftover in (f"/tmp/elastic-train-ddp-{run_id}.pt",):
        if os.path.exists(leftover):
            os.unlink(leftover)


def test_a_checkpoint_planted_at_the_old_predictable_path_is_not_resumed(tmp_path, run_id):
    planted = f"/tmp/elastic-train-ddp-{run_id}.pt"
    plant(planted)
    plant(tmp_path / f"elastic-train-ddp-{run_id}.pt")  # and where <tmp> now points
    proc = train(tmp_path, run_id)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "starting at step 0" in proc.stdout and "done: 3 steps" in proc.stdout, proc.stdout
    private = tmp_path / f"elastic-train-ddp-{os.geteuid()}"
    info = os.lstat(private)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
    assert torch.load(private / f"{run_id}.pt", weights_only=True)["step"] == 3
    assert torch.load(planted, weights_only=True)["step"] == 1_000_000  # left alone


@pytest.mark.parametrize("owner, mode", [(NOBODY, 0o700), (None, 0o777)], ids=["another-user", "group-writable"])
def test_a_checkpoint_directory_made_by_someone_else_is_refused_in_one_line(tmp_path, run_id, owner, mode):
    private = tmp_path / f"elastic-train-ddp-{os.geteuid()}"
    private.mkdir()
    plant(private / f"{run_id}.pt")
    os.chmod(private, mode)
    if owner is not None:
        os.chown(private, owner, owner)
    proc = train(tmp_path, run_id)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert "not a private directory" in line and "--checkpoint" in line
    assert "step 1000000" not in proc.stdout


def test_a_link_planted_at_the_old_temporary_name_of_a_checkpoint_is_not_written_through(tmp_path, run_id):
    """Issue 34, item 7: ``<checkpoint>.tmp-<pid>`` was opened as it was; a link planted there (the
    worker's pid is known in advance, as here, where the test plants it just before the exec)
    had the checkpoint written into its target, and the checkpoint became that link."""
    shared = tmp_path / "shared"
    shared.mkdir()
    checkpoint, victim = shared / "ckpt.pt", tmp_path / "victim"
    victim.write_text("precious\n")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TORCHELASTIC_RUN_ID": run_id, "CHECKPOINT_PATH": str(checkpoint)}
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "train_ddp.py"), "--steps", "2",
                           "--checkpoint-every", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180, preexec_fn=lambda: os.symlink(victim, f"{checkpoint}.tmp-{os.getpid()}"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert victim.read_text() == "precious\n"
    assert not checkpoint.is_symlink() and torch.load(checkpoint, weights_only=True)["step"] == 2
