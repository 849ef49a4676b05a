"""A user's commonest set-up mistakes, run as the user runs them: one line, no traceback, nothing left.

Each test starts the real ``elasticrun`` (``python -m elastic.run``) with the mistake, and asserts
that its whole output is the one line the README's Troubleshooting table quotes, that no worker
ever started, and that no process it started is left: every process that carries the test's
marker in its environment (the launcher, and whatever it would have started: store helper,
templates, workers) is gone once it exited.

The holder of a taken port is a plain listening socket started and stopped by the test.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from elastic.testing.agents import clean_env
from elastic.testing.ports import free_port

MARK = "ELASTICRUN_TEST_MISTAKE"
STARTS = "import pathlib, sys; pathlib.Path(sys.argv[0] + '.started').touch()\n"
"""A training script that leaves a file beside itself when a worker runs it."""


def elasticrun(cwd: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], float, str]:
    """Run ``elasticrun argv`` in ``cwd`` with a marker of its own; its result, seconds and marker."""
    marker = uuid.uuid4().hex
    begun = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "elastic.run", *argv], cwd=cwd, capture_output=True, text=True,
                            env=clean_env(**{MARK: marker}), timeout=120, check=False)
    return result, time.monotonic() - begun, marker


def left_running(marker: str) -> list[psutil.Process]:
    """Every process whose environment carries ``marker``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK) == marker:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The only line ``elasticrun`` printed (stdout and stderr together); fails otherwise."""
    lines = (result.stdout + result.stderr).splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stdout + result.stderr
    return lines[0]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port that a plain socket listens on and never answers (another program)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", free_port()))
    sock.listen(16)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(STARTS)
    return path


def test_a_c10d_endpoint_whose_port_another_program_holds_fails_in_one_line_within_seconds(tmp_path, script,
                                                                                            held_port):
    result, seconds, marker = elasticrun(tmp_path, "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{held_port}",
                                         "--rdzv-id=mistake-10", script.name)
    line = one_line(result)
    assert result.returncode == 1
    assert re.fullmatch(
        rf"elasticrun: Rendezvous mistake-10 \(node \S+\): cannot host the c10d store on 127\.0\.0\.1:{held_port}: "
        r"another process on this node holds the port and is not an elastic-store \(it did not answer the store's "
        r"handshake within 5s\)\. Stop that process, or choose a free port in --rdzv-endpoint\.", line), line
    assert seconds < 60, f"it took {seconds:.1f}s; the join timeout is 600 s"  # one dial timeout, 5 s
    assert not (tmp_path / "train.py.started").exists() and left_running(marker) == []


def test_a_script_path_that_does_not_exist_is_one_line_before_any_worker_starts(tmp_path):
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "train_ddp.py").write_text(STARTS)
    result, _, marker = elasticrun(tmp_path, "--standalone", "--nproc-per-node=2", "examples/train_dpp.py")
    assert result.returncode == 2
    assert one_line(result) == (f"elasticrun: error: the training script examples/train_dpp.py does not exist "
                                f"(in {tmp_path}); did you mean examples/train_ddp.py?")
    assert left_running(marker) == []


def test_a_master_port_in_use_is_one_line_naming_it_before_any_worker_starts(tmp_path, script, held_port):
    result, _, marker = elasticrun(tmp_path, "--nproc-per-node=2", f"--master-port={held_port}", script.name)
    assert result.returncode == 1
    assert one_line(result) == (
        f"elasticrun: The master port {held_port} is already in use on this node (node rank 0 hosts its workers' "
        "store there); stop what holds it, or choose a free port with --master-port (or leave it out: a single "
        "node then picks a free one).")
    assert not (tmp_path / "train.py.started").exists() and left_running(marker) == []
