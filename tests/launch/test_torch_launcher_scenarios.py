"""torch's own launcher scenarios, run by elasticrun.

torch tests torchrun with ``test/distributed/launcher/test_run.py`` (``ElasticLaunchTest``, 26
tests): each passes a command line to ``torch.distributed.run.main`` and checks the outcome,
mostly that every worker touched a file named by its global rank. Here each scenario's command
line, flag for flag, runs under ``python -m elastic.run`` with worker programs of our own that
do what torch's do, and the same outcome is asserted: a refused command line (torch's
``ValueError``) is exit status 2, a failed worker (torch's ``ChildFailedError``) exit status 1.
Where torch mocks its own internals, the scenario is judged by what it checks:

* ``test_nproc_gpu_launch_configurations`` / ``..._xpu_...`` mock torch's device counts to 3:
  here the host is a :class:`FixedDevices` with 3 GPUs or XPUs, and the worker count is read
  from the parsed config (the command line and the count are the same; starting 3 workers is
  ``--nproc-per-node=4``'s path).
* ``test_min_max_nodes_parse`` calls torch's parser: here ``--nnodes`` goes through ours.
* ``test_launch_elastic_worker_raise_exception`` also counts torch's event record, and
  ``test_launch_elastic_agent_raise_exception`` makes torch's agent raise: here the first fails
  with exit status 1 and the failing rank named; of the second, its command line must run (our
  agent's own errors end in one line and exit 1: tests/agent/test_errors.py).
* ``test_launch_shutdown`` mocks torch's agent and checks the rendezvous is shut down once after
  a success: here the run succeeds and nothing of it outlives the launcher.
* ``test_is_not_torchelastic_launched`` runs no launcher, and ``test_virtual_local_rank`` needs
  two GPUs: not here.

(docs/testing.md: torch's launcher scenarios.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from elastic.launch.cli import ConfigError, config_from_args
from elastic.launch.devices import FixedDevices
from elastic.testing.ports import free_port

TOUCH_PY = '''\
"""Touch a file named by this worker's global rank, after checking the agent set its variables."""
import argparse
import os
import pathlib

parser = argparse.ArgumentParser()
parser.add_argument("--fail", action="store_true")
parser.add_argument("--touch-file-dir", "--touch_file_dir")
args = parser.parse_args()
for name in ("LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
             "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
             "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "TEST_SENTINEL_PARENT",
             "TORCHELASTIC_ERROR_FILE"):
    print(f"{name}={os.environ[name]}")
if args.fail:
    raise RuntimeError("failing, as --fail asks")
pathlib.Path(args.touch_file_dir, os.environ["RANK"]).touch()
'''

TOUCH_SH = '''\
#!/bin/bash
echo "creating $1/$RANK"
touch "$1/$RANK"
'''

LAUNCHED_PY = '''\
"""Write whether torch says this process was started by an elastic launcher."""
import argparse

import torch.distributed

parser = argparse.ArgumentParser()
parser.add_argument("--out-file", "--out_file")
with open(parser.parse_args().out_file, "w") as out:
    out.write(str(torch.distributed.is_torchelastic_launched()))
'''

INIT_METHOD_PY = '''\
"""Join a gloo group by --init-method, all-reduce a one-hot vector, and leave without
destroy_process_group(), as torch's init-method scenario does."""
import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--init-method", required=True)
args = parser.parse_args()
rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=args.init_method, rank=rank, world_size=world_size)
ones = torch.nn.functional.one_hot(torch.tensor(rank), num_classes=world_size)
dist.all_reduce(ones)
assert int(ones.sum()) == world_size, ones
print("Done")
'''

CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.fixture
def programs(tmp_path: Path) -> dict[str, str]:
    """Our worker programs, written to ``tmp_path``."""
    paths = {}
    for name, text in (("touch.py", TOUCH_PY), ("touch.sh", TOUCH_SH), ("launched.py", LAUNCHED_PY),
                       ("init_method.py", INIT_METHOD_PY)):
        path = tmp_path / name
        path.write_text(text)
        path.chmod(0o755)
        paths[name] = str(path)
    return paths


@pytest.fixture
def touched(tmp_path: Path) -> Path:
    """The directory the workers touch their rank files in."""
    directory = tmp_path / "touched"
    directory.mkdir()
    return directory


def launch_env(**extra: str) -> dict[str, str]:
    """The test's environment without launcher variables, with torch's sentinel and ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PET_", "TORCHELASTIC_"))}
    return {**env, "TEST_SENTINEL_PARENT": "FOOBAR", **extra}


def elasticrun(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elastic.run", *argv], capture_output=True, text=True,
                          env=env or launch_env(), timeout=180, check=False)


def start_elasticrun(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "elastic.run", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=launch_env())


def ranks(directory: Path) -> set[str]:
    return {path.name for path in directory.iterdir()}


def run_id() -> str:
    return str(uuid.uuid4().int)


def c10d_endpoint() -> str:
    return f"--rdzv-endpoint=localhost:{free_port()}"


QUOTED_CONF = "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'"
"""test_launch_elastic's value, its quotes inside the argv item (no shell took them off)."""


# -- scenarios that run workers ----------------------------------------------------------------


def touch_py(programs, touched) -> list[str]:
    return [programs["touch.py"], f"--touch-file-dir={touched}"]


def touch_sh(programs, touched) -> list[str]:
    return ["--no-python", programs["touch.sh"], str(touched)]


SPAWN = ("--monitor-interval=1", "--start-method=spawn")

# torch's test, the command line before the program, the program, the ranks that must touch.
RUNS = [
    ("test_launch_user_script_python", lambda: ["--nnodes=1", "--nproc-per-node=4", f"--rdzv-id={run_id()}", *SPAWN],
     touch_py, 4),
    ("test_launch_user_script_python_caffe2_bc",
     lambda: ["--nnodes=1", "--nproc-per-node=4", *SPAWN, "--master-addr=localhost", f"--master-port={free_port()}",
              "--node-rank=0"], touch_py, 4),
    ("test_launch_user_script_bash", lambda: ["--nnodes=1", "--nproc-per-node=4", f"--rdzv-id={run_id()}", *SPAWN],
     touch_sh, 4),
    ("test_launch_user_script_default_nproc", lambda: ["--nnodes=1", f"--rdzv-id={run_id()}", *SPAWN], touch_sh, 1),
    ("test_nproc_launch_number_configurations",
     lambda: ["--nnodes=1", "--nproc-per-node=4", f"--rdzv-id={run_id()}", *SPAWN], touch_sh, 4),
    ("test_launch_elastic", lambda: ["--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d", c10d_endpoint(),
                                     QUOTED_CONF, f"--rdzv-id={run_id()}", *SPAWN], touch_py, 4),
    ("test_launch_elastic_agent_raise_exception",
     lambda: ["--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d", c10d_endpoint(), "--rdzv_conf=timeout=5",
              f"--rdzv-id={run_id()}", "--monitor-interval=1", "--max-restarts=0", "--start-method=spawn"],
     touch_py, 4),
    ("test_launch_standalone", lambda: ["--nnodes=1", "--nproc-per-node=4", "--standalone", *SPAWN], touch_py, 4),
    ("test_launch_run_path", lambda: ["--run-path", "--nnodes=1", "--nproc-per-node=4", *SPAWN], touch_py, 4),
]


@pytest.mark.slow
@pytest.mark.parametrize("command, program, world_size", [row[1:] for row in RUNS], ids=[row[0] for row in RUNS])
def test_torchs_command_line_runs_every_worker(command, program, world_size, programs, touched):
    result = elasticrun(*command(), *program(programs, touched))
    assert result.returncode == 0, result.stderr
    assert ranks(touched) == {str(rank) for rank in range(world_size)}


@pytest.mark.slow
def test_auto_on_a_host_without_accelerators_runs_one_worker_per_cpu(programs, touched):
    """test_nproc_launch_auto_configurations (torch mocks the accelerator away; we hide the GPUs)."""
    result = elasticrun("--nnodes=1", "--nproc-per-node=auto", f"--rdzv-id={run_id()}", *SPAWN,
                        *touch_sh(programs, touched), env=launch_env(CUDA_VISIBLE_DEVICES=""))
    assert result.returncode == 0, result.stderr
    assert ranks(touched) == {str(rank) for rank in range(CPUS)}


@pytest.mark.slow
@pytest.mark.parametrize("module", [True, False], ids=["--module is refused", "then it runs"])
def test_pet_variables_give_the_whole_command_line(module, programs, touched):
    """test_launch_with_env_vars: every flag from PET_*; --no-python with --module is refused."""
    env = launch_env(PET_NNODES="1", PET_NPROC_PER_NODE="4", PET_RDZV_ID=run_id(), PET_MONITOR_INTERVAL="1",
                     PET_START_METHOD="spawn", PET_NO_PYTHON="1", PET_MODULE="1" if module else "0")
    result = elasticrun(programs["touch.sh"], str(touched), env=env)
    if module:
        assert result.returncode == 2 and "--module" in result.stderr and ranks(touched) == set(), result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert ranks(touched) == {"0", "1", "2", "3"}


@pytest.mark.slow
def test_a_failing_worker_fails_the_launch(programs):
    """test_launch_elastic_worker_raise_exception: torch raises ChildFailedError; we exit 1."""
    result = elasticrun("--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d", c10d_endpoint(), QUOTED_CONF,
                        f"--rdzv-id={run_id()}", "--monitor-interval=1", "--max-restarts=0", "--start-method=spawn",
                        programs["touch.py"], "--fail")
    assert result.returncode == 1, result.stderr
    assert "RuntimeError: failing, as --fail asks" in result.stderr
    assert "Root cause (first observed failure)" in result.stderr


@pytest.mark.slow
def test_two_agents_on_one_endpoint_run_eight_workers(programs, touched):
    """test_launch_elastic_multiple_agents."""
    argv = ["--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d", c10d_endpoint(), "--rdzv_conf=timeout=5",
            f"--rdzv-id={run_id()}", *SPAWN, *touch_py(programs, touched)]
    agents = [start_elasticrun(*argv) for _ in range(2)]
    try:
        outcomes = [agent.communicate(timeout=180) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    assert [agent.returncode for agent in agents] == [0, 0], [err for _, err in outcomes]
    assert ranks(touched) == {str(rank) for rank in range(8)}


@pytest.mark.slow
def test_nothing_of_a_finished_run_outlives_the_launcher(programs, touched):
    """test_launch_shutdown (torch checks its rendezvous handler is shut down once)."""
    agent = start_elasticrun("--nnodes=1", "--nproc-per-node=4", *SPAWN, *touch_py(programs, touched))
    seen: set[psutil.Process] = set()
    while agent.poll() is None:  # every process the run starts, sampled while it runs
        try:
            seen.update(psutil.Process(agent.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    _, stderr = agent.communicate(timeout=180)
    assert agent.returncode == 0, stderr
    assert ranks(touched) == {"0", "1", "2", "3"}
    assert [proc for proc in seen if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE] == []


@pytest.mark.slow
@pytest.mark.needs_torch
@pytest.mark.parametrize("logs_specs", [[], ["--logs_specs=default"]], ids=["plain", "torch's default logs specs"])
def test_torch_says_a_run_path_worker_was_launched_by_torchelastic(logs_specs, programs, tmp_path):
    """test_is_torchelastic_launched and test_is_torchelastic_launched_with_logs_spec_defined."""
    out = tmp_path / "out"
    result = elasticrun("--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1", *logs_specs,
                        programs["launched.py"], f"--out-file={out}")
    assert result.returncode == 0, result.stderr
    assert out.read_text() == "True"


@pytest.mark.slow
@pytest.mark.needs_torch
@pytest.mark.parametrize("init_method", ["tcp://localhost:{port}", "env://"], ids=["tcp", "env"])
def test_workers_that_leave_without_destroying_their_group_run_clean(init_method, programs):
    """test_init_method_tcp_with_torchelastic and test_init_method_env_with_torchelastic: under
    --run-path torchrun holds each worker until the node's all returned, so a script may end
    without destroy_process_group(); run as plain scripts, one was at times aborted at exit."""
    port = free_port()
    result = elasticrun("--run-path", "--nnodes=1", "--nproc-per-node=4", "--master-addr=localhost",
                        f"--master-port={port}", "--monitor-interval=1", programs["init_method.py"],
                        f"--init-method={init_method.format(port=port)}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Done") == 4  # unbuffered workers share the stdout: lines may interleave


@pytest.mark.slow
def test_each_workers_output_line_carries_the_prefix_template(programs, touched):
    """test_capture_logs_using_default_logs_specs."""
    result = elasticrun("--nnodes=1", "--nproc-per-node=4", f"--rdzv-id={run_id()}", "--redirect=3", "--tee=3",
                        *SPAWN, *touch_sh(programs, touched),
                        env=launch_env(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]: "))
    assert result.returncode == 0, result.stderr
    for rank in range(4):
        assert f"[rank{rank}]: creating " in result.stdout


# -- scenarios refused before any worker starts -------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ["--nnodes=1", "--nproc-per-node=4", "--monitor-interval=1", "--start-method=spawn", "--no-python", "--module"],
    ["--nnodes=1", "--monitor-interval=1", "--start-method=spawn", "--no-python", "--module"],
    ["--nnodes=1", "--nproc-per-node=unknown", "--monitor-interval=1", "--start-method=spawn", "--no-python"],
], ids=["test_launch_user_script_bash", "test_launch_user_script_default_nproc",
        "test_nproc_launch_unknown_configurations"])
def test_torchs_refused_command_line_is_refused_in_one_line(argv, programs, touched):
    result = elasticrun(*argv, f"--rdzv-id={run_id()}", programs["touch.sh"], str(touched))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert ranks(touched) == set()


@pytest.mark.slow
def test_a_logs_specs_name_nothing_installs_is_refused(programs):
    """test_logs_logs_spec_entrypoint_must_be_defined."""
    result = elasticrun("--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1",
                        "--logs_specs=DOESNOT_EXIST", programs["launched.py"])
    assert result.returncode == 2 and "DOESNOT_EXIST" in result.stderr, result.stderr


# -- scenarios torch checks with its internals mocked -------------------------------------------


@pytest.mark.parametrize("devices, words", [
    (FixedDevices(cpus=8, gpus=3), ("auto", "gpu")),  # test_nproc_gpu_launch_configurations
    (FixedDevices(cpus=8, gpus=0, xpus=3), ("auto", "xpu")),  # test_nproc_xpu_launch_configurations
])
def test_a_host_with_three_accelerators_runs_three_workers(devices, words):
    for word in words:
        config = config_from_args(["--nnodes=1", f"--nproc-per-node={word}", f"--rdzv-id={run_id()}", *SPAWN,
                                   "--no-python", "touch.sh", "dir"], {}, devices=devices)
        assert config.nproc_per_node == 3


def test_nnodes_takes_n_or_min_max_and_nothing_more():
    """test_min_max_nodes_parse."""
    def nnodes(text: str) -> tuple[int, int]:
        config = config_from_args([f"--nnodes={text}", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:29400",
                                   "train.py"], {}, devices=FixedDevices(cpus=1))
        return config.rendezvous.min_nodes, config.rendezvous.max_nodes

    assert nnodes("1") == (1, 1) and nnodes("2:20") == (2, 20)
    with pytest.raises(ConfigError, match="--nnodes: '2:20:30' is not N or MIN:MAX"):
        nnodes("2:20:30")

