"""torch's ``--rdzv-conf`` keys on elasticrun's command line: mapped, or accepted with one note."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from elastic.launch.cli import ConfigError, config_from_args
from elastic.launch.devices import FixedDevices
from elastic.rendezvous.settings import RendezvousSettings
from elastic.testing.ports import free_port

ETCD = ("--rdzv-backend=etcd", "--rdzv-endpoint=etcd-0:2379", "--rdzv-id=job-1")


def parse_with_warnings(*argv: str) -> tuple[object, list[str]]:
    warnings: list[str] = []
    config = config_from_args(list(argv), {}, devices=FixedDevices(cpus=8, gpus=0), new_run_id=lambda: "rid",
                              warn=warnings.append)
    return config, warnings


def test_the_issues_command_line_parses_with_one_note_and_torchs_join_timeout():
    config, warnings = parse_with_warnings(
        "--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:29555",
        "--rdzv_conf=timeout=5", "--rdzv-id=X", "train.py")
    assert config.rendezvous == RendezvousSettings("X", 1, 2)  # torch's c10d keeps its 600 s join timeout
    assert warnings == ["--rdzv-conf timeout=5 has no effect: torch's c10d rendezvous does not read it either; "
                        "its join deadline is join_timeout"]


@pytest.mark.parametrize("argv, join_timeout, notes", [
    (ETCD, 5.0, 0),  # torch's etcd rendezvous reads timeout as its join deadline
    (("--rdzv-backend=tcp", "--rdzv-endpoint=s:1", "--rdzv-id=j"), 5.0, 0),
    (("--rdzv-backend=c10d", "--rdzv-endpoint=n:1", "--rdzv-id=j"), 600.0, 1),
    (("--standalone",), 600.0, 1),  # torchrun's standalone is c10d
    ((), 600.0, 1),  # the single static node runs standalone, as in torchrun
    (("--nnodes=2", "--master-port=29500"), 600.0, 1),  # static
])
def test_timeout_is_the_join_timeout_where_torchs_handler_reads_it_so(argv, join_timeout, notes):
    config, warnings = parse_with_warnings(*argv, "--rdzv-conf", "timeout=5", "train.py")
    assert config.rendezvous.join_timeout == join_timeout
    assert len([line for line in warnings if "timeout=5 has no effect" in line]) == notes


def test_torchs_tls_names_and_keys_without_effect_reach_the_same_config_as_ours():
    theirs, warnings = parse_with_warnings(*ETCD, "--rdzv-conf", "ca_cert=/ca,ssl_cert=/c,ssl_cert_key=/k,"
                                           "heartbeat_timeout=30,use_libuv=0,rank=3,store_type=tcp", "train.py")
    ours, none = parse_with_warnings(*ETCD, "--rdzv-conf", "cacert=/ca,cert=/c,key=/k", "train.py")
    assert (theirs.backend, theirs.rendezvous) == (ours.backend, ours.rendezvous) and none == []
    assert [line.split(" has no effect")[0] for line in warnings] == [
        "--rdzv-conf heartbeat_timeout=30", "--rdzv-conf use_libuv=0", "--rdzv-conf rank=3",
        "--rdzv-conf store_type=tcp"]


def test_a_bad_torch_key_or_value_is_one_error_line_listing_torchs_keys_too():
    with pytest.raises(ConfigError) as raised:
        parse_with_warnings(*ETCD, "--rdzv-conf", "heartbeat_timout=30", "train.py")
    message = str(raised.value)
    assert message.startswith("--rdzv-conf: unknown rendezvous option(s) heartbeat_timout; valid options are:")
    assert "heartbeat_timeout" in message and "ssl_cert_key" in message and "\n" not in message
    with pytest.raises(ConfigError, match="store_type='file' is not supported"):
        parse_with_warnings("--standalone", "--rdzv-conf", "store_type=file", "train.py")


HELLO = "import os\nos.write(1, f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\\n\".encode())\n"
"""Each worker's line in one write(2), so lines of workers sharing the agent's stdout never interleave."""


@pytest.mark.slow
def test_the_issues_exact_command_line_runs_to_completion(tmp_path: Path):
    """``--rdzv_conf=timeout=5`` with c10d was refused at parse time; now the node trains, after
    torch's 30 s last call for a second node (``--nnodes=1:2``), as under torchrun."""
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    port, run_id = free_port(), f"issue26-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "elastic.run", "--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=localhost:{port}", "--rdzv_conf=timeout=5", f"--rdzv-id={run_id}", str(script)]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PET_", "TORCHELASTIC_"))}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("has no effect") == 1
    assert "elasticrun: warning: --rdzv-conf timeout=5 has no effect" in result.stderr
    assert sorted(result.stdout.splitlines()) == [f"rank {rank} of 4" for rank in range(4)]


@pytest.mark.slow
def test_torchs_launch_elastic_command_line_with_the_quotes_inside_its_value_runs(tmp_path: Path):
    """torch's own launcher test ``test_launch_elastic`` passes ``--rdzv-conf='...'`` as one argv
    item, quotes included (no shell took them off); torchrun runs it, and so do we, saying so once."""
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    port, run_id = free_port(), str(uuid.uuid4().int)
    argv = [sys.executable, "-m", "elastic.run", "--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=localhost:{port}", "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'",
            f"--rdzv-id={run_id}", "--monitor-interval=1", "--start-method=spawn", str(script)]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PET_", "TORCHELASTIC_"))}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("took the quotes off") == 1, result.stderr
    assert sorted(result.stdout.splitlines()) == [f"rank {rank} of 4" for rank in range(4)]
