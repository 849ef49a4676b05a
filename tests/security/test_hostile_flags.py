"""Findings 5 and 11 of round three: hostile flag values give one clean line, never a traceback,
a hang or a lost file.

Each test runs the real ``elasticrun`` (``python -m elastic.run``) or ``elastic-store`` in a
subprocess with the review's value: ``--log-dir`` that is a file, ``/dev/null``, under
``/proc`` or on a read-only filesystem (a private mount namespace, root only); a 5,000-character
``--rdzv-id``; a token file that is ``/dev/zero``, a FIFO, a directory or a huge file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from elastic.agent.processes.log_dir import filesystem_type, log_dir_problem
from elastic.testing.ports import free_port
from hostile import REPO

TIMEOUT_S = 60


def elasticrun(tmp_path, *flags: str, wrap: list[str] | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in [name for name in env if name.startswith("PET_")]:
        del env[name]
    argv = [sys.executable, "-m", "elastic.run", "--nproc-per-node=1", *flags, str(script)]
    return subprocess.run([*(wrap or []), *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def assert_one_line(proc: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """The run exited ``code`` with exactly one ``elasticrun:`` error line naming ``words``, no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("elasticrun: error:")
              or line.startswith("elasticrun: ") and "warning" not in line and "INFO" not in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert proc.returncode == code, proc.stderr[-3000:]
    for word in words:
        assert word in errors[0], errors[0]
    assert len(errors[0]) < 500, errors[0]
    return errors[0]


# -- finding 5: --log-dir ------------------------------------------------------------------------


def test_a_log_dir_that_is_dev_null_is_refused_in_one_line_and_dev_null_stays_a_device(tmp_path):
    proc = elasticrun(tmp_path, "--standalone", "--log-dir", "/dev/null")
    assert_one_line(proc, 2, "--log-dir", "/dev/null", "not a directory")
    assert os.path.exists("/dev/null") and not os.path.isdir("/dev/null")
    assert "trained" not in proc.stdout


def test_a_log_dir_that_is_a_file_is_refused_in_one_line_and_the_file_kept(tmp_path):
    precious = tmp_path / "notes.txt"
    precious.write_text("precious\n")
    proc = elasticrun(tmp_path, "--standalone", f"--log-dir={precious}")
    assert_one_line(proc, 2, "--log-dir", "notes.txt", "not a directory")
    assert precious.read_text() == "precious\n"


@pytest.mark.parametrize("path", ["/proc/self/x", "/proc/x/y", "/sys/elastic-logs"])
def test_a_log_dir_on_a_kernel_pseudo_filesystem_is_refused_in_one_line(tmp_path, path):
    proc = elasticrun(tmp_path, "--standalone", "--log-dir", path)
    assert_one_line(proc, 2, "--log-dir", path)


def test_a_log_dir_on_a_read_only_filesystem_is_refused_in_one_line(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("needs root and unshare(1) for a private read-only mount (CI runs as root)")
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    # A private mount namespace: the read-only tmpfs is seen by this run only and vanishes with it.
    wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs -o ro,size=1m tmpfs "{frozen}" && exec "$0" "$@"']
    proc = elasticrun(tmp_path, "--standalone", f"--log-dir={frozen}/logs", wrap=wrap)
    assert_one_line(proc, 2, "--log-dir", "not writable")


def test_the_filesystem_of_a_path_is_that_of_its_longest_last_mount_point(tmp_path):
    table = tmp_path / "mountinfo"
    table.write_text(
        "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
        "23 22 0:22 / /proc rw,nosuid - proc proc rw\n"
        "24 22 0:23 / /my\\040logs rw shared:1 - tmpfs tmpfs rw\n"
        "25 24 0:24 / /my\\040logs rw - sysfs sysfs rw\n"  # stacked on the one before: it wins
    )
    assert filesystem_type("/proc/1/fd", str(table)) == "proc"
    assert filesystem_type("/procfs", str(table)) == "ext4"
    assert filesystem_type("/my logs/x", str(table)) == "sysfs"
    assert filesystem_type("/", str(table)) == "ext4"
    assert filesystem_type("/x", str(tmp_path / "missing")) is None
    assert log_dir_problem(str(tmp_path / "new" / "logs"), mountinfo=str(table)) is None
    with table.open("a") as more:
        more.write(f"26 22 0:25 / {tmp_path} rw - proc proc rw\n")
    assert "is on proc, a kernel pseudo-filesystem" in log_dir_problem(str(tmp_path / "new"), mountinfo=str(table))


def test_a_log_dir_that_is_fine_is_created_and_holds_the_logs(tmp_path):
    logs = tmp_path / "a" / "b"
    proc = elasticrun(tmp_path, "--standalone", "--redirects=3", f"--log-dir={logs}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert any(name.endswith(".log") for _, _, names in os.walk(logs) for name in names)


# -- finding 11: hostile flag values -------------------------------------------------------------


def test_a_5000_character_run_id_is_refused_in_one_line(tmp_path):
    port = free_port()
    proc = elasticrun(tmp_path, "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--nnodes=1",
                      "--rdzv-id=" + "a" * 5000)
    line = assert_one_line(proc, 2, "--rdzv-id", "at most")
    assert "a" * 200 not in line


def _fifo(path):
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("make, what", [
    (lambda tmp: "/dev/zero", "not a regular file"),
    (lambda tmp: _fifo(tmp / "token.fifo"), "not a regular file"),
    (lambda tmp: (tmp / "token.d").mkdir() or tmp / "token.d", "not a regular file"),
    (lambda tmp: (tmp / "huge").write_bytes(b"t" * (8 << 20)) and tmp / "huge", "bytes"),
], ids=["dev-zero", "fifo", "directory", "8-MiB-file"])
def test_a_hostile_token_file_gives_one_line_without_blocking_or_reading_it_all(tmp_path, make, what):
    token_file = make(tmp_path)
    port = free_port()
    proc = elasticrun(tmp_path, "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--nnodes=1",
                      "--rdzv-id=job", f"--rdzv-conf=token_file={token_file},request_timeout=5")
    assert_one_line(proc, 1, "token_file", str(token_file), what)


@pytest.mark.parametrize("name", ["dev-zero", "fifo", "directory"])
def test_elastic_store_refuses_a_hostile_token_file_in_one_line(tmp_path, name):
    path = {"dev-zero": "/dev/zero", "fifo": str(tmp_path / "t.fifo"), "directory": str(tmp_path)}[name]
    if name == "fifo":
        os.mkfifo(path)
    proc = subprocess.run([sys.executable, "-m", "backends.tcp.cli", "--port", "0", "--token-file", path],
                          cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert "token file" in line and "not a regular file" in line
