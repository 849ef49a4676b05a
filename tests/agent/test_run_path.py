"""A ``--run-path`` worker leaves only once its node's workers have all finished their script, as
torchrun holds them (elastic.agent.run_path); one that fails leaves at once. Real agents,
real workers, with and without pre-warmed templates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def elasticrun(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PET_", "TORCHELASTIC_"))}
    return subprocess.run([sys.executable, "-m", "elastic.run", *argv], capture_output=True, text=True, env=env,
                          timeout=180, check=False)


@pytest.fixture
def touched(tmp_path: Path) -> Path:
    directory = tmp_path / "touched"
    directory.mkdir()
    return directory


EXIT_ORDER_PY = '''\
"""Local rank 0 finishes at once (by sys.exit(0)) once rank 1 runs, and notes at its exit whether
rank 1 had finished; rank 1 finishes a second after rank 0."""
import atexit
import os
import pathlib
import sys
import time


def wait_for(name):
    while not (directory / name).exists():
        time.sleep(0.05)


directory = pathlib.Path(sys.argv[1])
if os.environ["LOCAL_RANK"] == "0":
    atexit.register(lambda: (directory / "rank 1 had finished").write_text(str((directory / "1").exists())))
    wait_for("1 runs")  # as a collective would: a script cannot finish before its peers started
    (directory / "0").touch()
    sys.exit(0)
(directory / "1 runs").touch()
wait_for("0")
time.sleep(1.0)
(directory / "1").touch()
'''


@pytest.mark.slow
@pytest.mark.parametrize("prewarm", [[], ["--prewarm"]], ids=["started", "forked from a template"])
def test_a_run_path_worker_leaves_only_once_the_nodes_workers_have_all_finished(prewarm, tmp_path, touched):
    """torchrun runs a --run-path script as a function and holds each worker until every worker of
    the node has returned (sys.exit(0) counts as returning)."""
    program = tmp_path / "exit_order.py"
    program.write_text(EXIT_ORDER_PY)
    result = elasticrun("--run-path", "--nproc-per-node=2", *prewarm, str(program), str(touched))
    assert result.returncode == 0, result.stderr
    assert (touched / "rank 1 had finished").read_text() == "True"


@pytest.mark.slow
def test_a_run_path_worker_that_fails_leaves_at_once(tmp_path):
    """A failed script does not wait for the others: the agent sees it and stops the group."""
    program = tmp_path / "fail_or_sleep.py"
    program.write_text("import os, time\nif os.environ['LOCAL_RANK'] == '0':\n    raise SystemExit(3)\n"
                       "time.sleep(600)\n")
    result = elasticrun("--run-path", "--nproc-per-node=2", "--max-restarts=0", str(program))
    assert result.returncode == 1, result.stderr
    assert "exit       : exit code 3" in result.stderr  # rank 0's, the root cause; rank 1 was stopped
