"""hang_report: a stuck process's OS threads, its native stacks (py-spy) and its Python stacks."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

from elastic.testing import hang_report as module
from elastic.testing import with_stacks
from elastic.testing.hang_report import hang_report, native_stacks

STUCK = """
import time
def waiting_in_a_named_function():
    time.sleep(60)
print("ready", flush=True)
waiting_in_a_named_function()
"""


@pytest.fixture
def stuck(tmp_path):
    """A process under with_stacks, asleep in a function with a name to look for; killed by PID after."""
    (tmp_path / "stuck_module.py").write_text(STUCK)
    stderr = tmp_path / "stderr"
    with open(stderr, "wb") as err:
        process = subprocess.Popen(with_stacks.command("stuck_module"),
                                   cwd=tmp_path, stdout=subprocess.PIPE, stderr=err, text=True,
                                   env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    try:
        assert process.stdout.readline().strip() == "ready"
        yield process, stderr
    finally:
        process.kill()
        process.wait(10)


def test_the_report_has_the_os_threads_and_the_native_stacks_then_the_python_stacks(stuck):
    process, stderr = stuck
    report = hang_report(process.pid)
    assert report.startswith(f"process {process.pid}: ")
    assert "--- native stacks of" in report
    # The test extra installs py-spy: its dump names the Python function the main thread is in.
    assert shutil.which("py-spy"), "py-spy is part of the test extra"
    assert "waiting_in_a_named_function" in report
    deadline = time.monotonic() + 5.0
    while "waiting_in_a_named_function" not in stderr.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGUSR1: faulthandler writes the Python stacks to the process's stderr
    assert "waiting_in_a_named_function" in stderr.read_text()


def test_a_process_that_is_gone_gives_an_empty_report():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(10)
    assert hang_report(process.pid) == ""


def test_without_py_spy_the_native_view_says_so(monkeypatch):
    monkeypatch.setattr(module.shutil, "which", lambda name: None)
    assert native_stacks(1) == "py-spy is not installed: no native stacks"


def test_a_failing_py_spy_is_one_line_not_an_exception(monkeypatch, tmp_path):
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'cannot attach' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(module.shutil, "which", lambda name: str(fake))
    assert native_stacks(1) == "py-spy dump of 1 failed (3): cannot attach"
