"""The ``elasticrun`` program's exit: atexit handlers run and output is flushed, then the process
leaves without the interpreter's teardown (unless a non-daemon thread still runs)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import atexit, sys, threading, time
    import elastic.run

    class Finalized:
        def __del__(self):
            print("finalized", flush=True)

    kept = Finalized()  # freed only by the interpreter's teardown
    atexit.register(print, "atexit ran")
    if sys.argv[1] == "thread":
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
    sys.stdout.write("unflushed ")  # written to a pipe: block-buffered until the exit flushes it
    sys.argv = ["elasticrun", "--dry-run", "--standalone", "train.py"]
    elastic.run.program()
""")


def run_program(mode: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PET_")}
    env.pop("PYTHONUNBUFFERED", None)
    return subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, env=env,
                          timeout=60, check=False)


def test_elasticrun_exits_after_atexit_handlers_and_a_flush_without_the_interpreters_teardown():
    result = run_program("plain")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("unflushed entrypoint:")  # the dry run's description, all of it
    assert "dry_run:" in result.stdout and result.stdout.rstrip().endswith("atexit ran")
    assert "finalized" not in result.stdout


def test_elasticrun_under_a_profiler_exits_the_usual_way_so_the_profile_is_written(tmp_path):
    profile = tmp_path / "agent.prof"
    result = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "elastic.run", "--dry-run",
                             "--standalone", "train.py"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert profile.stat().st_size > 0


def test_elasticrun_waits_for_a_non_daemon_thread_and_exits_the_usual_way():
    result = run_program("thread")
    assert result.returncode == 0, result.stderr
    assert "thread done" in result.stdout and "atexit ran" in result.stdout
    assert "finalized" in result.stdout


@pytest.mark.parametrize("argv, status", [(["--help"], 0), (["--nproc-per-node=zero", "train.py"], 2)])
def test_help_and_a_bad_command_line_exit_the_usual_way(argv, status):
    result = subprocess.run([sys.executable, "-c", "import elastic.run; elastic.run.program()", *argv],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == status
