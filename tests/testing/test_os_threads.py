"""describe_threads reads /proc: every thread with its state; a process that is gone is one line."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from elastic.testing.os_threads import describe_threads


def line_of(report: str, tid: int) -> str:
    return next((line for line in report.splitlines() if line.startswith(f"  tid {tid} ")), "")


def test_every_thread_of_a_process_is_listed_with_its_state():
    ready, release = threading.Event(), threading.Event()

    def park() -> None:
        ready.set()
        release.wait(10)

    thread = threading.Thread(target=park, name="parked-thread")
    thread.start()
    try:
        ready.wait(5)
        # Between ready.set() and its futex wait the thread still runs: read until it sleeps (5 s at most).
        deadline = time.monotonic() + 5.0
        report = describe_threads(os.getpid())
        while " state S " not in line_of(report, thread.native_id) and time.monotonic() < deadline:
            time.sleep(0.01)
            report = describe_threads(os.getpid())
    finally:
        release.set()
        thread.join()
    lines = report.splitlines()
    assert lines[0].startswith(f"process {os.getpid()}: ") and len(lines) >= 3
    assert line_of(report, os.getpid())  # the main thread
    # Python 3.11 does not name OS threads (every one shows the process's name): found by id
    assert " state S " in line_of(report, thread.native_id), report  # asleep, on a futex


def test_a_process_that_is_gone_is_one_line():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert describe_threads(child.pid) == f"process {child.pid}: cannot list its threads (No such file or directory)"
