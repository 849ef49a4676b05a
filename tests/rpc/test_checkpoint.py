"""Per-worker checkpoint files: atomic writes, keyed by role and role rank, newest common step."""

from __future__ import annotations

import os

import pytest
import torch

from rpc.checkpoint import ShardStore, latest_common_step, restore_local, save_local
from rpc.errors import CheckpointError

pytestmark = pytest.mark.needs_torch


def worker_environ(role: str = "ps", role_rank: int = 1) -> dict[str, str]:
    return {"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "ROLE_NAME": role, "ROLE_RANK": str(role_rank), "ROLE_WORLD_SIZE": "2"}


def test_a_saved_step_loads_back_from_the_workers_own_folder(tmp_path):
    store = ShardStore(tmp_path, "ps", 1)
    path = store.save(7, {"weights": torch.arange(4.0), "note": "x"})
    assert path == tmp_path / "ps1" / "step-000000007.pt"
    state = store.load(7)
    assert torch.equal(state["weights"], torch.arange(4.0)) and state["note"] == "x"
    assert ShardStore.for_this_worker(tmp_path, environ=worker_environ("ps", 1)).steps() == [7]
    assert ShardStore.for_this_worker(tmp_path, environ=worker_environ("ps", 0)).steps() == []


def test_only_the_newest_keep_steps_are_kept(tmp_path):
    store = ShardStore(tmp_path, "stage", 0, keep=2)
    for step in range(1, 6):
        store.save(step, {"step": torch.tensor(step)})
    assert store.steps() == [4, 5]
    assert sorted(os.listdir(store.folder)) == ["step-000000004.pt", "step-000000005.pt"]


def test_an_interrupted_write_leaves_no_step_behind(tmp_path, monkeypatch):
    store = ShardStore(tmp_path, "stage", 0)
    store.save(1, {"w": torch.ones(2)})

    def fail_after_writing(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail_after_writing)
    with pytest.raises(CheckpointError, match="step-000000002.pt: disk full"):
        store.save(2, {"w": torch.zeros(2)})
    assert store.steps() == [1]
    assert sorted(os.listdir(store.folder)) == ["step-000000001.pt"]  # the temporary file is gone too


def test_another_workers_file_is_refused(tmp_path):
    ShardStore(tmp_path, "ps", 0).save(3, {"w": torch.ones(1)})
    (tmp_path / "ps1").mkdir()
    os.replace(tmp_path / "ps0" / "step-000000003.pt", tmp_path / "ps1" / "step-000000003.pt")
    with pytest.raises(CheckpointError, match=r"holds \(1, 'ps', 0, 3\).*expected \(1, 'ps', 1, 3\)"):
        ShardStore(tmp_path, "ps", 1).load(3)


@pytest.mark.parametrize(
    "bad, message",
    [(lambda store: store.load(4), "ps0 has no checkpoint of step 4"),
     (lambda store: store.save(0, {}), "must be positive")],
)
def test_missing_steps_and_step_zero_are_errors(tmp_path, bad, message):
    with pytest.raises(CheckpointError, match=message):
        bad(ShardStore(tmp_path, "ps", 0))


def test_keeping_no_checkpoint_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="at least 1"):
        ShardStore(tmp_path, "ps", 0, keep=0)


@pytest.mark.parametrize(
    "steps, expected",
    [({}, 0), ({"a0": []}, 0), ({"a0": [4, 5], "b0": [4, 5]}, 5), ({"a0": [4, 5], "b0": [3, 4]}, 4),
     ({"a0": [5], "b0": [4]}, 0), ({"a0": [1, 2], "b0": [2, 3], "c0": [2]}, 2), ({"a0": [2], "b0": []}, 0)],
)
def test_the_resume_step_is_the_newest_every_worker_has(steps, expected):
    assert latest_common_step(steps) == expected


def test_modules_restore_to_the_newest_local_step(tmp_path, monkeypatch):
    for key, value in worker_environ("stage", 0).items():
        monkeypatch.setenv(key, value)
    model = torch.nn.Linear(3, 2)
    assert restore_local(tmp_path, {"model": model}) == 0  # nothing saved yet: a fresh start
    saved = {key: value.clone() for key, value in model.state_dict().items()}
    save_local(tmp_path, 5, {"model": model})
    with torch.no_grad():
        model.weight.add_(1.0)
    assert restore_local(tmp_path, {"model": model}) == 5
    assert all(torch.equal(model.state_dict()[key], saved[key]) for key in saved)
    with pytest.raises(CheckpointError, match="has no module 'head'"):
        restore_local(tmp_path, {"head": model})
    with pytest.raises(CheckpointError, match="does not fit"):
        restore_local(tmp_path, {"model": torch.nn.Linear(4, 2)})
