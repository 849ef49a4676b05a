"""A two-stage pipeline, remote modules and context cleanup in real processes, with two roles.

Three workers: ``master0`` drives, ``stage0`` and ``stage1`` hold the stages (RPC ranks 0, 1,
2; roles ``master`` and ``stage``, each counting its own ranks). One run serves every test of
this file (see ``workers/scenarios.py``).
"""

from __future__ import annotations

import pytest

# Slow: three workers import torch and form an RPC group (seconds); CI runs it (--all).
pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]

ROLES = [("master", 0, 1), ("stage", 0, 2), ("stage", 1, 2)]


@pytest.fixture(scope="module")
def master(module_spawn) -> dict:
    results = module_spawn.run("pipeline", 3, ROLES)
    assert [result["name"] for result in results] == ["master0", "stage0", "stage1"]
    return results[0]


def part(master: dict, key: str):
    assert f"{key}_error" not in master, master[f"{key}_error"]
    return master[key]


def test_a_two_stage_pipeline_trained_20_steps_ends_as_the_local_model(master):
    train = part(master, "train20")
    assert train["sizes"] == [3, 2]
    assert train["diff_before"] == 0.0  # the stages start from the local model's weights
    assert train["moved"] > 1e-3  # ... and training changed them
    assert train["diff_after"] <= 1e-6
    assert train["repr"] == "Pipeline(stage0: 3 layers, stage1: 2 layers; 2 micro-batches)"


def test_200_training_steps_leave_no_autograd_context_on_any_worker(master):
    leak = part(master, "leak")
    assert leak["steps"] == 200
    during = leak["during_first_step"]  # the probe sees live contexts, so it can fail
    assert sorted(during) == ["master0", "stage0", "stage1"] and min(during.values()) >= 1
    assert leak["after"] == {"master0": 0, "stage0": 0, "stage1": 0}


def test_an_exception_in_a_remote_forward_reaches_the_caller_with_the_remote_traceback(master):
    error = part(master, "remote_forward_error")
    assert error["type"] == "ValueError"  # the type raised on the owner
    message = error["message"]
    assert "stage0" in message  # which worker
    assert "faulty layer: refusing input of shape [2, 3]" in message
    assert "Traceback (most recent call last)" in message
    assert "in check_input" in message and "scenarios.py" in message  # the remote frames


def test_a_failing_remote_construction_fails_at_once_with_the_remote_traceback(master):
    error = part(master, "remote_construction_error")
    assert error["type"] == "RuntimeError"
    assert "stage1" in error["message"] and "broken factory: cannot build this module" in error["message"]
    assert "in broken_factory" in error["message"]


def test_workers_are_found_by_role_and_role_rank_across_roles(master):
    assert part(master, "lookup") == {
        "stages": ["stage0", "stage1"], "stage_ids": [1, 2], "master": "master0",
        "roles": {"master": 1, "stage": 2},
    }  # fmt: skip
    assert "No worker has the role 'critic'; roles: master (1), stage (2)." in master["missing_role_error"]
