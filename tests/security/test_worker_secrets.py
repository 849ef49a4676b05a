"""Finding 7 of round three: rendezvous secrets never reach the processes the agent starts, and a
secret on the command line is warned about once.

Real runs: ``elasticrun`` with a c10d store whose token is given inline (``PET_RDZV_CONF`` or
``--rdzv-conf``), and stock ``torchrun`` with our plugin against the session's etcd (auth on)
with the password inline. Rank 0's worker reads the environment of every process its agent
started (workers, store helper, watchdog: ``/proc/<pid>/environ``, as root) and reports where
the secret appears.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from elastic.rendezvous.secret_sources import hide_inline_secrets, without_inline_secrets
from elastic.testing.ports import free_port
from hostile import REPO

TIMEOUT_S = 180

WORKER = """
import json, os, sys
import psutil
import torch.distributed as dist
secret = sys.argv[2]
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 0:
    agent = psutil.Process(os.getppid())
    while agent.parent() is not None and "with_stacks" not in " ".join(agent.cmdline()) and \\
            not any(part.endswith(("elastic.run", "torch.distributed.run", "torchrun")) for part in agent.cmdline()):
        agent = agent.parent()
    seen = {}
    for child in agent.children(recursive=True):
        try:
            env = child.environ()
        except psutil.Error:
            continue
        seen[f"{child.pid} " + " ".join(child.cmdline())[:100]] = sorted(k for k, v in env.items() if secret in v)
    with open(sys.argv[1], "w") as out:
        json.dump({"seen": seen, "pet_rdzv_conf": os.environ.get("PET_RDZV_CONF")}, out)
dist.barrier()
dist.destroy_process_group()
"""


def run_elasticrun(tmp_path, secret: str, *, conf_env: str | None, conf_flag: str | None):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in [name for name in env if name.startswith("PET_")]:
        del env[name]
    if conf_env is not None:
        env["PET_RDZV_CONF"] = conf_env
    flags = [f"--rdzv-conf={conf_flag}"] if conf_flag is not None else []
    proc = subprocess.run(
        [sys.executable, "-m", "elastic.run", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
         f"--rdzv-id=secrets-{uuid.uuid4().hex[:6]}", "--nnodes=1", "--nproc-per-node=2", *flags,
         f"--log-dir={tmp_path / 'logs'}", str(script), str(report), secret],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert secret not in proc.stderr and secret not in proc.stdout
    return json.loads(report.read_text()), proc.stderr


def assert_nobody_has(seen: dict) -> None:
    assert len(seen) >= 3, seen  # the workers and at least the store helper or the watchdog
    assert {command: keys for command, keys in seen.items() if keys} == {}


@pytest.mark.slow
def test_an_inline_token_in_pet_rdzv_conf_reaches_no_process_the_agent_starts(tmp_path):
    secret = f"s3cret-{uuid.uuid4().hex}"
    report, stderr = run_elasticrun(tmp_path, secret, conf_env=f"token={secret},join_timeout=60", conf_flag=None)
    assert_nobody_has(report["seen"])
    assert report["pet_rdzv_conf"] == "join_timeout=60"  # the rest of the variable is kept
    assert "command line" not in stderr  # given through the environment: nothing to warn about


@pytest.mark.slow
def test_an_inline_token_on_the_command_line_is_warned_about_once_and_reaches_no_process(tmp_path):
    secret = f"s3cret-{uuid.uuid4().hex}"
    report, stderr = run_elasticrun(tmp_path, secret, conf_env=None, conf_flag=f"token={secret}")
    assert_nobody_has(report["seen"])
    warnings = [line for line in stderr.splitlines() if "puts a secret on the command line" in line]
    assert len(warnings) == 1 and "token_file=" in warnings[0] and "ps" in warnings[0], stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["environment", "command-line"])
def test_torchrun_with_our_plugin_hands_no_etcd_password_to_its_workers(etcd_server, tmp_path, where):
    config = etcd_server.client_config()
    secret = config.password
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    report = tmp_path / "report.json"
    conf = f"user={config.user},password={secret},join_timeout=60,read_timeout=60"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    flags = [f"--rdzv-conf={conf}"]
    if where == "environment":
        env["PET_RDZV_CONF"], flags = conf, []
    endpoint = etcd_server.endpoints.split(",")[0].split("://", 1)[-1]
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend=etcd-v3", f"--rdzv-endpoint={endpoint}",
         f"--rdzv-id=secrets-{uuid.uuid4().hex[:6]}", "--nnodes=1", "--nproc-per-node=2", "--max-restarts=0",
         *flags, str(script), str(report), secret],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(report.read_text())["seen"]
    assert len(seen) >= 2 and {command: keys for command, keys in seen.items() if keys} == {}, seen
    warnings = [line for line in proc.stderr.splitlines() if "puts a secret on the command line" in line]
    assert len(warnings) == (1 if where == "command-line" else 0), proc.stderr[-3000:]


@pytest.mark.parametrize("conf, kept", [
    ("token=t,join_timeout=60", "join_timeout=60"),
    ("password=p, user=u ,token_file=/run/t", "user=u,token_file=/run/t"),
    ("token=t", None),
    ("join_timeout=60", "join_timeout=60"),
    ("not a conf", None),  # unparsable: it may hold anything, so it goes
])
def test_inline_secrets_leave_pet_rdzv_conf_and_the_rest_stays(conf, kept):
    env = {"PET_RDZV_CONF": conf, "PATH": "/bin"}
    clean = without_inline_secrets(env)
    assert clean.get("PET_RDZV_CONF") == kept and clean["PATH"] == "/bin"
    assert env["PET_RDZV_CONF"] == conf  # a copy
    assert hide_inline_secrets(env) is (kept != conf)
    assert env.get("PET_RDZV_CONF") == kept
