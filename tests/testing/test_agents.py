"""The shared test harness (elastic.testing.agents): polling, process trees, launched processes, jobs.

``wait_until`` runs against a fake clock; everything else against real processes (``python -c``
scripts), each stopped by PID at the end of its test.
"""

from __future__ import annotations

import json
import signal
import sys
import textwrap
import time

import psutil
import pytest

from elastic.testing import with_stacks
from elastic.testing.agents import (
    DidNotExit,
    Job,
    Launched,
    ProcessExited,
    Reports,
    WaitTimeout,
    clean_env,
    kill_tree,
    read_json_lines,
    wait_until,
)

# A parent that starts a sleeping child and prints both pids.
PARENT_AND_CHILD = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(os.getpid(), child.pid, flush=True)
    time.sleep(60)
""")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def answers(*values):
    """A predicate that returns ``values`` one per call (then the last one forever)."""
    queue = list(values)
    return lambda: queue.pop(0) if len(queue) > 1 else queue[0]


# -- wait_until ---------------------------------------------------------------------------------


@pytest.mark.parametrize("values, result, sleeps", [
    ((True,), True, 0),                     # true at once: no sleep
    ((0, None, "", "found"), "found", 3),   # the first true value is returned
    ((0, 0, 0, 0, "late"), "late", 4),      # called once more at the deadline (1 s = 4 sleeps of 0.25 s)
])
def test_wait_until_returns_the_first_true_value(values, result, sleeps):
    clock = FakeClock()
    assert wait_until(answers(*values), 1.0, "x", 0.25, clock=clock, sleep=clock.sleep) == result
    assert clock.sleeps == [0.25] * sleeps


def test_wait_until_names_what_it_waited_for_and_what_it_saw_last():
    clock = FakeClock()
    with pytest.raises(WaitTimeout, match=r"^timed out after 1s waiting for the answer; last seen: 41$"):
        wait_until(answers(False), 1.0, "the answer", 0.25, context=lambda: "last seen: 41", clock=clock,
                   sleep=clock.sleep)
    assert clock.sleeps == [0.25] * 4
    assert isinstance(WaitTimeout("x"), AssertionError)  # pytest shows it as the test's failure


def test_wait_until_refuses_a_negative_timeout():
    with pytest.raises(ValueError, match=r"The timeout of the wait for x \(-1\) must not be negative\."):
        wait_until(lambda: True, -1, "x")


def test_clean_env_drops_launcher_and_worker_variables_from_outside(monkeypatch):
    dropped = {"RANK", "LOCAL_WORLD_SIZE", "ROLE_NAME", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "PET_NNODES",
               "ELASTIC_RUN_ID", "OMP_NUM_THREADS", "LOGLEVEL", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
    for key in dropped:
        monkeypatch.setenv(key, "1")
    monkeypatch.setenv("KEEP_ME", "yes")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/kept")  # torch's own settings are not the launcher's
    env = clean_env(TMPDIR="/x")
    assert dropped & set(env) == set()
    assert (env["KEEP_ME"], env["TORCHINDUCTOR_CACHE_DIR"], env["TMPDIR"]) == ("yes", "/kept", "/x")


# -- processes ----------------------------------------------------------------------------------


@pytest.fixture
def job(tmp_path):
    with Job(tmp_path, timeout=30) as started:
        yield started


def test_kill_tree_kills_a_process_and_its_children_at_once_and_says_how_long_it_took(job):
    parent = job.start("parent", [sys.executable, "-c", PARENT_AND_CHILD])
    pids = job.wait_for("the pids", lambda: parent.stdout.split())
    child = psutil.Process(int(pids[1]))
    before = time.time()
    killed = kill_tree(parent.pid)
    assert set(killed.pids) == {parent.pid, child.pid} and killed.survivors == ()
    assert before <= killed.at <= time.time() and 0 <= killed.seconds < 5
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert parent.proc.wait(timeout=10) == -signal.SIGKILL  # not reaped by kill_tree: the exit code is kept


def test_a_launched_process_keeps_its_output_in_files_and_its_exit_code(job, tmp_path):
    done = job.start("done", [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert done.wait() == 3
    assert (done.stdout, done.stderr) == ("out\n", "err\n")
    assert (done.stdout_path, done.stderr_path) == (tmp_path / "done.stdout", tmp_path / "done.stderr")
    merged = job.start("merged", [sys.executable, "-c", "import sys; print('a', flush=True); print('b', file=sys.stderr)"],
                       merge_output=True)
    assert merged.wait() == 0 and merged.stdout == merged.stderr == "a\nb\n"
    with pytest.raises(ValueError, match="A process named 'done' was started already"):
        job.start("done", [sys.executable, "-c", "pass"])


def test_describe_adds_the_stdout_tail_only_when_asked(job):
    script = "import sys; print('x' * 50 + 'out'); print('err', file=sys.stderr); sys.exit(3)"
    done = job.start("done", [sys.executable, "-c", script])
    assert done.wait() == 3
    assert done.describe() == f"--- done (pid {done.pid}, exit 3) stderr tail:\nerr\n"
    assert done.describe(stdout_chars=4).endswith("\n--- done's stdout tail:\nout\n")
    merged = job.start("merged", [sys.executable, "-c", "print('once')"], merge_output=True)
    assert merged.wait() == 0 and merged.describe(stdout_chars=100).count("once") == 1  # one file, quoted once


def test_a_wait_that_expires_says_where_the_process_waits(job):
    """Under with_stacks, the failure holds its OS threads and its Python stack (SIGUSR1)."""
    script = "import time\ndef waiting_here():\n    print('ready', flush=True)\n    time.sleep(60)\nwaiting_here()\n"
    (job.workdir / "hangs.py").write_text(script)
    hung = job.start("hung", with_stacks.command("hangs"), cwd=job.workdir, env=clean_env(PYTHONPATH=str(job.workdir)))
    job.wait_for("the script to start", lambda: "ready" in hung.stdout)
    with pytest.raises(DidNotExit, match=r"hung \(pid \d+\) did not exit within 0.5s") as raised:
        hung.wait(0.5)
    assert "waiting_here" in str(raised.value)  # its stack, dumped to its stderr on SIGUSR1
    assert hung.hang.startswith(f"process {hung.pid}: ") and f"native stacks of {hung.pid}" in hung.hang
    assert hung.returncode is None  # with_stacks answers SIGUSR1 and goes on


def test_a_process_not_under_with_stacks_is_not_sent_sigusr1(job):
    plain = job.start("plain", [sys.executable, "-c", "import time; time.sleep(60)"])
    assert plain.exited_within(0.2) is None
    time.sleep(0.3)
    assert plain.returncode is None, "SIGUSR1 would have killed it"
    assert plain.exited_within(0.1, diagnose=False) is None


def test_a_wait_for_fails_at_once_naming_the_process_that_exited(job):
    job.start("quitter", [sys.executable, "-c", "import sys; print('bye', file=sys.stderr); sys.exit(2)"])
    started = time.monotonic()
    with pytest.raises(ProcessExited, match=r"(?s)quitter exited \(2\) while waiting for Godot; .*bye"):
        job.wait_for("Godot", lambda: False)
    assert time.monotonic() - started < 10


def test_collect_gives_every_exit_code_within_one_deadline(job):
    job.start("fast", [sys.executable, "-c", "pass"])
    job.start("slow", [sys.executable, "-c", "import time; time.sleep(60)"])
    started = time.monotonic()
    assert job.collect(timeout=1.0, diagnose=False) == {"fast": 0, "slow": None}
    assert time.monotonic() - started < 5
    assert job.collect(["fast"]) == {"fast": 0}


def test_stop_all_kills_every_tree_and_the_reported_workers(tmp_path):
    marker = str(tmp_path / "worker-marker")
    job = Job(tmp_path)
    agent = job.start("agent", [sys.executable, "-c", PARENT_AND_CHILD])
    # A "worker" the agent no longer parents (a killed agent's orphan), named in the reports.
    orphan = Launched([sys.executable, "-c", "import time; time.sleep(60)", marker], name="orphan", logdir=tmp_path,
                      new_session=True)
    try:
        child = int(job.wait_for("the pids", lambda: agent.stdout.split())[1])
        reports = Reports(tmp_path / "reports.jsonl", job)
        (tmp_path / "reports.jsonl").write_text(json.dumps({"event": "started", "pid": orphan.pid}) + "\n")
        assert [r["pid"] for r in reports.events("started")] == [orphan.pid]
        job.worker_marker = marker
        job.stop_all()
        assert agent.returncode == -signal.SIGKILL and orphan.proc.wait(timeout=10) == -signal.SIGKILL
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    finally:
        job.stop_all()
        orphan.kill_tree()


def test_reports_leave_a_line_being_written_for_the_next_read(tmp_path):
    path = tmp_path / "reports.jsonl"
    assert read_json_lines(path) == []
    path.write_text('{"event": "a", "pid": 1}\n{"event": "b", "pi')
    assert read_json_lines(path) == [{"event": "a", "pid": 1}]
    reports = Reports(path)
    assert reports.events("a", pid=1) and reports.events("a", pid=2) == []


def test_reports_wait_for_names_what_and_the_last_reports(job, tmp_path):
    path = tmp_path / "reports.jsonl"
    path.write_text('{"event": "started", "pid": 1}\n')
    sleeper = job.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(WaitTimeout, match=r"waiting for a world of 2; last reports: \[\{'event': 'started'"):
        Reports(path).wait_for("a world of 2", lambda records: len(records) == 2, [sleeper], timeout=0.3)
    assert Reports(path).wait_for("one record", lambda records: len(records) == 1, [sleeper]) == [
        {"event": "started", "pid": 1}]
