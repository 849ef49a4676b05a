"""Options validation, the package's import hygiene, and LiveTraining's checks of its environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from elastic.worker import LiveOptions, LiveOptionsError, WorkerEnvError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"backend": "mpi"}, "backend"),
        ({"collective_timeout": 0}, "collective timeout"),
        ({"form_timeout": -1}, "form timeout"),
        ({"interrupt_grace": float("inf")}, "interrupt grace"),
        ({"store_timeout": True}, "store timeout"),
        ({"round_wait_timeout": "5"}, "round wait timeout"),
        ({"drain_timeout": -1}, "drain timeout"),
        ({"regroup_window": -0.1}, "regroup window"),
        ({"regroup_window": float("nan")}, "regroup window"),
        ({"max_header_bytes": 10}, "max_header_bytes"),
        ({"max_state_bytes": 10}, "max_state_bytes"),
        ({"max_state_bytes": 2.0**40}, "max_state_bytes"),
        ({"max_failed_rounds": 0}, "max_failed_rounds"),
        ({"max_failed_rounds": 2.5}, "max_failed_rounds"),
        ({"coalesce_bytes": 4096.0}, "coalesce_bytes"),
        ({"init_sync": 1}, "init_sync"),
    ],
)
def test_bad_options_are_one_clear_error(changes, message):
    with pytest.raises(LiveOptionsError, match=message):
        LiveOptions(**changes)


def test_the_defaults_are_valid():
    assert LiveOptions().interrupt_grace < LiveOptions().collective_timeout


def test_the_package_and_its_wire_format_import_without_torch():
    code = ("import sys, elastic.worker, elastic.worker.rounds, elastic.worker.channel, elastic.worker.decisions, "
            "elastic.worker.formation, elastic.worker.refill, elastic.worker.regroup, elastic.worker.standing; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "from elastic.worker import LiveOptions, Round; from elastic.worker.rounds import encode_round_line")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": REPO})


def test_the_package_exports_the_documented_api_and_no_internals():
    import elastic.worker

    assert sorted(elastic.worker.__all__) == [
        "Cause", "CommittedStep", "ElasticLoader", "FailingRoundsError", "GroupLost", "LiveOptions",
        "LiveOptionsError", "LiveRecoveryError", "LiveTraining", "Recovery", "RecoveryFailed", "Round",
        "StateTransferError", "StepAttempt", "TrainingStateError", "UnsupportedBackendError", "WorkerEnvError",
    ]
    assert all(getattr(elastic.worker, name) is not None for name in elastic.worker.__all__)
    for internal in ("AgentGoneError", "CollectiveFailed", "Superseded", "RoundLineError", "encode_round_line"):
        assert not hasattr(elastic.worker, internal), internal


def test_live_training_refuses_a_round_fd_that_is_not_open():
    from elastic.worker import LiveTraining

    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
           "ELASTIC_ROUND_FD": "987", "ELASTIC_ROUND": "0", "ELASTIC_STORE_PREFIX": "p"}
    with pytest.raises(WorkerEnvError, match="ELASTIC_ROUND_FD=987 is not an open file descriptor"):
        LiveTraining(dict, lambda state: None, environ=env)
    with pytest.raises(WorkerEnvError, match="not a file descriptor number"):
        LiveTraining(dict, lambda state: None, environ={**env, "ELASTIC_ROUND_FD": "x"})


@pytest.mark.parametrize("value", ["99999999999999999999", "-3", str(2**31)])
def test_live_training_refuses_a_descriptor_number_out_of_range_in_one_line(value):
    from elastic.worker import LiveTraining

    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
           "ELASTIC_ROUND": "0", "ELASTIC_STORE_PREFIX": "p"}
    for name in ("ELASTIC_ROUND_FD", "ELASTIC_READY_FD"):
        with pytest.raises(WorkerEnvError, match=f"{name}='{value}' is out of range for a file descriptor"):
            LiveTraining(dict, lambda state: None, environ={**env, "ELASTIC_ROUND_FD": "0", name: value})
