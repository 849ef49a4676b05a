"""The README's Troubleshooting table quotes what elasticrun really prints.

Each of the table's mistakes is made for real, and the line the table quotes for it must be
in the output: the quote's pieces between ``...``, in order. The rows that need a job use the
session's etcd (with its credentials) and plain Python scripts; the too-few-machines row runs
with a 5 s join timeout where the README quotes the default 600 s; the rows of a taken port
hold it with a plain listening socket (the README's port numbers stand for the test's).
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elastic.testing.agents import Job, clean_env
from elastic.testing.ports import free_port

REPO = Path(__file__).resolve().parents[2]

MISTAKES = {
    "a misspelt flag": ["--nproc-per-nodes=2", "--standalone", "train.py"],
    "an abbreviation that fits several flags": ["--n=2", "--standalone", "train.py"],
    "a misspelt `--rdzv-conf` key": ["--standalone", "--rdzv-conf=lease=5", "train.py"],
    "`--standalone` with several nodes": ["--standalone", "--nnodes=2", "train.py"],
    "etcd not started, or the wrong port": ["--nnodes=1", "--rdzv-backend=etcd", "--rdzv-endpoint=127.0.0.1:1",
                                           "--rdzv-id=j", "train.py"],
    "a script path that does not exist": ["--standalone", "--nproc-per-node=2", "examples/train_dpp.py"],
    "the training script raises an exception": ["--standalone", "fails.py"],
    "an etcd host name that does not resolve": ["--nnodes=1", "--rdzv-backend=etcd",
                                                "--rdzv-endpoint=etcd-0:2379", "--rdzv-id=j", "train.py"],
}
"""The first cell of a row of the table, and the elasticrun arguments that make that mistake."""


def table_rows() -> dict[str, str]:
    """The Troubleshooting table: mistake -> the quoted output (backticks removed)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    body = re.search(r"^## Troubleshooting\s*$(.*?)(?=^## )", text, re.M | re.S).group(1)
    rows = {}
    for line in body.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if len(cells) == 2 and not cells[0].startswith(("---", "mistake")):
            rows[cells[0]] = cells[1]
    return rows


def quoted_pieces(cell: str) -> list[str]:
    """The pieces of the first quoted line of ``cell``, split at ``...``."""
    quote = re.search(r"`([^`]*)`", cell).group(1)
    return [piece.strip() for piece in quote.split("...") if piece.strip()]


def appears_in_order(pieces: list[str], output: str) -> bool:
    position = 0
    for piece in pieces:
        found = output.find(piece, position)
        if found < 0:
            return False
        position = found + len(piece)
    return True


def _resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
    except OSError:
        return False
    return True


WITH_ETCD = ("fewer machines started than `--nnodes` min", "running a finished job's `--rdzv-id` again",
             "another script under a running job's `--rdzv-id`")
"""The rows made by the tests with etcd at the end of this file."""

WITH_A_HELD_PORT = {
    "a c10d endpoint whose port another program holds": ("29400", ["--rdzv-backend=c10d",
                                                                   "--rdzv-endpoint=127.0.0.1:{port}",
                                                                   "--rdzv-id=my-job", "train.py"]),
    "`--master-port` already in use (one node, or node rank 0)": ("29500", ["--nproc-per-node=2",
                                                                            "--master-port={port}", "train.py"]),
}
"""The rows made with a port held by a plain socket: the README's port, and the arguments."""


def test_the_table_has_thirteen_rows_and_this_file_makes_each_mistake():
    rows = table_rows()
    assert len(rows) == 13, sorted(rows)
    assert set(MISTAKES) | set(WITH_ETCD) | set(WITH_A_HELD_PORT) == set(rows)


def test_pieces_must_appear_in_order():
    assert appears_in_order(["a", "c"], "a b c") and not appears_in_order(["c", "a"], "a b c")


SLOW_ROWS = ("etcd not started, or the wrong port", "an etcd host name that does not resolve",
             "the training script raises an exception")
"""Rows that take seconds (connection retries, a worker started): in the slow tier."""


@pytest.mark.parametrize("mistake", [pytest.param(m, marks=[pytest.mark.slow] if m in SLOW_ROWS else [])
                                     for m in sorted(MISTAKES)])
def test_each_mistake_prints_the_line_the_readme_quotes(mistake, tmp_path):
    argv = MISTAKES[mistake]
    if "--rdzv-endpoint=etcd-0:2379" in argv and _resolves("etcd-0"):
        pytest.fail("the name etcd-0 resolves on this machine; the row cannot be checked here")
    scripts(tmp_path)
    result = elasticrun(argv, tmp_path)
    assert result.returncode != 0
    check_row(mistake, result.stderr)


def scripts(cwd: Path) -> None:
    """The scripts the rows name, where they exist: ``train.py``, ``fails.py`` and the quick start's."""
    (cwd / "train.py").write_text("print('ok')\n")
    (cwd / "fails.py").write_text("raise SystemExit('failed on purpose')\n")
    (cwd / "examples").mkdir()
    (cwd / "examples" / "train_ddp.py").write_text("print('ok')\n")


@pytest.mark.parametrize("mistake", sorted(WITH_A_HELD_PORT))
def test_a_taken_port_prints_the_line_the_readme_quotes(mistake, tmp_path):
    readme_port, argv = WITH_A_HELD_PORT[mistake]
    scripts(tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_port()))
        holder.listen(16)
        port = str(holder.getsockname()[1])
        result = elasticrun([arg.format(port=port) for arg in argv], tmp_path)
    assert result.returncode == 1
    check_row(mistake, result.stderr, **{readme_port: port})


def elasticrun(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "elastic.run", *argv], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=120)


def check_row(mistake: str, output: str, **replace: str) -> None:
    pieces = quoted_pieces(table_rows()[mistake])
    for old, new in replace.items():
        pieces = [piece.replace(old, new) for piece in pieces]
    assert appears_in_order(pieces, output), (pieces, output[-3000:])


def etcd_argv(etcd_server, tmp_path: Path, *extra: str, nnodes: str = "1:2") -> tuple[str, list[str]]:
    """A run id of its own (the session's etcd outlives a test), and the flags of a job under it."""
    config = etcd_server.client_config()
    password = tmp_path / "etcd-password"
    password.write_text(config.password)
    conf = f"user={config.user},password_file={password},lease_ttl=2,last_call_timeout=1"
    run_id = f"my-job-{time.monotonic_ns()}"
    return run_id, [f"--nnodes={nnodes}", "--rdzv-backend=etcd", f"--rdzv-endpoint={etcd_server.endpoints}",
                    f"--rdzv-id={run_id}", f"--rdzv-conf={conf}", "--local-addr=127.0.0.1", *extra]


def test_too_few_machines_prints_the_line_the_readme_quotes(etcd_server, tmp_path):
    (tmp_path / "train.py").write_text("print('ok')\n")
    run_id, argv = etcd_argv(etcd_server, tmp_path, "--rdzv-conf=join_timeout=5", "train.py", nnodes="2")
    result = elasticrun(argv, tmp_path)
    assert result.returncode == 1
    check_row("fewer machines started than `--nnodes` min", result.stderr, **{"(600s)": "(5s)", "my-job": run_id})


def test_a_finished_jobs_id_prints_the_line_the_readme_quotes(etcd_server, tmp_path):
    (tmp_path / "train.py").write_text("print('ok')\n")
    _, argv = etcd_argv(etcd_server, tmp_path, "train.py")
    assert elasticrun(argv, tmp_path).returncode == 0
    again = elasticrun(argv, tmp_path)
    assert again.returncode == 3
    check_row("running a finished job's `--rdzv-id` again", again.stderr)


def test_another_script_under_a_running_jobs_id_prints_the_line_the_readme_quotes(etcd_server, tmp_path):
    (tmp_path / "train.py").write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "other.py").write_text("print('other')\n")
    events = tmp_path / "events.jsonl"
    run_id, running = etcd_argv(etcd_server, tmp_path, "train.py")
    other = [*running[:-1], "other.py", "--lr", "3"]
    with Job(tmp_path, timeout=60) as job:
        train = job.start("train", [sys.executable, "-m", "elastic.run", f"--event-log={events}", *running],
                          cwd=tmp_path)
        job.wait_for("the job's first round", lambda: events.exists() and "round_joined" in events.read_text(),
                     names=["train"])
        result = elasticrun(other, tmp_path)
        assert train.returncode is None, train.describe()
    assert result.returncode != 0
    check_row("another script under a running job's `--rdzv-id`", result.stderr, **{"my-job": run_id})
