"""wait_exited: waiting for a helper's exit is woken by the exit, and reaps it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from elastic.agent.processes import reaping
from elastic.agent.processes.reaping import wait_exited


@pytest.fixture
def started():
    procs: list[subprocess.Popen] = []

    def start(code: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdin.close()


@pytest.fixture(params=["pidfd", "popen-wait"])
def pidfd(request, monkeypatch):
    """Each test with the pidfd and with the fallback (as on a kernel without pidfds)."""
    if request.param == "popen-wait":
        def no_pidfd(pid: int, flags: int = 0) -> int:
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(reaping.os, "pidfd_open", no_pidfd, raising=False)
    return request.param


def test_a_child_that_exits_is_reaped_with_its_status(started, pidfd):
    proc = started("import sys; sys.stdin.read(); sys.exit(3)")
    proc.stdin.close()  # it exits now
    assert wait_exited(proc, 30.0) is True
    assert proc.returncode == 3


def test_a_child_still_running_at_the_timeout_is_left_running(started, pidfd):
    proc = started("import sys; sys.stdin.read()")
    assert wait_exited(proc, 0.05) is False
    assert proc.poll() is None


def test_a_child_reaped_already_is_reported_exited(started, pidfd):
    proc = started("pass")
    proc.wait(timeout=30)
    assert wait_exited(proc, 0.0) is True


def test_the_pidfd_is_closed_after_each_wait(started):
    proc = started("import sys; sys.stdin.read()")
    before = set(os.listdir("/proc/self/fd"))
    assert wait_exited(proc, 0.01) is False
    assert set(os.listdir("/proc/self/fd")) == before
    proc.stdin.close()
    assert wait_exited(proc, 30.0) is True
    assert set(os.listdir("/proc/self/fd")) <= before
