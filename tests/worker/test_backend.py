"""The backend a live worker forms its groups with: the decision (a case table), the refusal's one
line and error file, and LiveTraining refusing NCCL before it forms anything. The machine has no
GPU, so CUDA's presence is injected (a probe, or a monkeypatched ``torch.cuda.is_available``)."""

from __future__ import annotations

import logging
import os

import pytest

from elastic.agent.processes.failures import read_error_file
from elastic.worker import LiveOptions, LiveRecoveryError, UnsupportedBackendError
from elastic.worker.backend import NCCL_DESIGN, NCCL_OPT_IN, BackendChoice, choose_backend, decide_backend

NO_NCCL_YET = "which live recovery does not support yet"
NOT_BUILT = "this torch has no NCCL built in"
NO_DEVICE = "no CUDA device is available to this worker"

# (asked, live, opt-in, cuda available, nccl built) -> backend, or a piece of the refusal
DECISIONS = [
    (("gloo", True, None, True, True), "gloo"),
    (("gloo", True, "1", True, True), "gloo"),
    (("gloo", False, None, False, False), "gloo"),
    ((None, True, None, False, False), "gloo"),
    ((None, False, None, False, True), "gloo"),
    ((None, True, "1", False, False), "gloo"),  # the opt-in asks for nothing: no CUDA, gloo
    ((None, True, None, True, True), "CUDA is available, so LiveTraining would use NCCL, " + NO_NCCL_YET),
    ((None, True, "0", True, True), NO_NCCL_YET),
    ((None, True, "", True, True), NO_NCCL_YET),
    (("nccl", True, None, True, True), "LiveOptions(backend='nccl') asks for NCCL, " + NO_NCCL_YET),
    (("nccl", True, None, False, False), NO_NCCL_YET),  # the refusal that matters first
    (("nccl", True, "yes", True, True), f"{NCCL_OPT_IN}='yes' must be 1"),
    ((None, True, "true", True, True), f"{NCCL_OPT_IN}='true' must be 1"),
    (("nccl", True, "1", True, True), "nccl"),
    ((None, True, "1", True, True), "nccl"),
    (("nccl", True, "1", False, False), NOT_BUILT),  # this machine: a CPU build of torch
    (("nccl", True, "1", False, True), NO_DEVICE),
    (("nccl", False, None, False, False), NOT_BUILT),  # no live agent: still one line, not a loop of rounds
    (("nccl", False, None, False, True), NO_DEVICE),
    (("nccl", False, None, True, True), "nccl"),  # torchrun or no --live-recovery: torch's own handling
    ((None, False, None, True, True), "nccl"),
    ((None, False, "garbage", True, True), "nccl"),  # the opt-in only matters under a live agent
]


@pytest.mark.parametrize("given, outcome", DECISIONS, ids=[str(case[0]) for case in DECISIONS])
def test_nccl_is_refused_under_a_live_agent_unless_opted_in_and_wherever_it_cannot_run(given, outcome):
    choice = decide_backend(*given)
    if outcome in ("gloo", "nccl"):
        assert choice == BackendChoice(outcome, experimental=outcome == "nccl" and given[1])
    else:
        assert choice.backend is None and outcome in choice.refusal and "\n" not in choice.refusal


def test_a_refusal_under_a_live_agent_names_the_ways_out_and_the_design():
    refusal = decide_backend(None, True, None, True, True).refusal
    assert "LiveOptions(backend='gloo')" in refusal and f"{NCCL_OPT_IN}=1" in refusal and NCCL_DESIGN in refusal


def probes(cuda: bool, nccl: bool) -> dict:
    return {"cuda_available": lambda: cuda, "nccl_built": lambda: nccl}


def test_the_chosen_backend_replaces_the_automatic_one_in_the_options():
    options = LiveOptions(collective_timeout=7)
    chosen = choose_backend(options, {}, "run r pid 1", live=True, **probes(cuda=False, nccl=False))
    assert chosen == LiveOptions(collective_timeout=7, backend="gloo")


def test_a_refusal_is_one_line_exits_like_sys_exit_and_is_left_in_the_error_file(tmp_path):
    error_file = tmp_path / "error.json"
    with pytest.raises(UnsupportedBackendError) as raised:
        choose_backend(LiveOptions(backend="nccl"), {"TORCHELASTIC_ERROR_FILE": str(error_file)}, "run r pid 1",
                       live=True, clock=lambda: 1700000000.5, **probes(cuda=True, nccl=True))
    error = raised.value
    assert isinstance(error, LiveRecoveryError) and isinstance(error, SystemExit)
    assert error.code == str(error) and str(error).startswith("run r pid 1: LiveOptions(backend='nccl') asks for NCCL")
    assert "\n" not in str(error)
    report = read_error_file(str(error_file))  # as the agent reads it for its failure report
    assert report.message == f"UnsupportedBackendError: {error}"
    assert report.traceback is None and report.timestamp == 1700000000


def test_a_refusal_without_an_error_file_or_with_one_that_cannot_be_written_still_raises(tmp_path):
    for environ in ({}, {"TORCHELASTIC_ERROR_FILE": str(tmp_path / "missing-dir" / "error.json")}):
        with pytest.raises(UnsupportedBackendError, match=NO_NCCL_YET):
            choose_backend(LiveOptions(), environ, "run r pid 1", live=True, **probes(cuda=True, nccl=True))


def test_the_opt_in_takes_nccl_with_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="elastic.worker.backend"):
        chosen = choose_backend(LiveOptions(), {NCCL_OPT_IN: "1"}, "run r pid 1", live=True, **probes(cuda=True, nccl=True))
    assert chosen.backend == "nccl"
    assert [record.getMessage() for record in caplog.records] == [
        f"run r pid 1: forming NCCL groups because {NCCL_OPT_IN}=1; live recovery on NCCL is experimental and "
        f"unverified (see {NCCL_DESIGN})"]


# -- LiveTraining, in this process -----------------------------------------------------------


@pytest.fixture
def pipes():
    """A round pipe and a ready pipe, as a live agent gives them; closed at the end."""
    fds = [*os.pipe(), *os.pipe()]
    yield fds
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def live_environ(round_fd: int | None = None, ready_fd: int | None = None, **extra: str) -> dict[str, str]:
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
           "TORCHELASTIC_RUN_ID": "nccl", "ELASTIC_ROUND": "0", "ELASTIC_STORE_PREFIX": "live/round-0", **extra}
    if round_fd is not None:
        env["ELASTIC_ROUND_FD"] = str(round_fd)
    if ready_fd is not None:
        env["ELASTIC_READY_FD"] = str(ready_fd)
    return env


@pytest.mark.needs_torch
def test_live_training_refuses_the_nccl_cuda_would_pick_before_it_forms_or_says_anything(pipes, monkeypatch, tmp_path):
    import torch
    import torch.distributed as dist

    from elastic.worker import LiveTraining

    round_read, _, ready_read, ready_write = pipes
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    asked = []
    env = live_environ(round_read, ready_write, TORCHELASTIC_ERROR_FILE=str(tmp_path / "error.json"))
    live = LiveTraining(lambda: asked.append("state") or {}, lambda state: None, environ=env)
    with pytest.raises(UnsupportedBackendError, match="CUDA is available, so LiveTraining would use NCCL"):
        live.start()  # MASTER_PORT 1: any attempt to reach the round's store would fail otherwise
    os.set_blocking(ready_read, False)
    with pytest.raises(BlockingIOError):
        os.read(ready_read, 1)  # not even "joining": the agent hears of it as a worker failure
    assert not dist.is_initialized() and asked == []
    assert "UnsupportedBackendError" in read_error_file(str(tmp_path / "error.json")).message


@pytest.mark.needs_torch
def test_live_training_on_a_cpu_build_refuses_an_opted_in_nccl_in_one_line_instead_of_failing_every_round(pipes):
    import torch.distributed as dist

    from elastic.worker import LiveTraining

    assert not dist.is_nccl_available()  # this machine's torch is the CPU wheel
    env = live_environ(pipes[0], **{NCCL_OPT_IN: "1"})
    live = LiveTraining(dict, lambda state: None, environ=env, options=LiveOptions(backend="nccl"))
    with pytest.raises(UnsupportedBackendError, match=NOT_BUILT):
        live.start()
    assert not dist.is_initialized()
