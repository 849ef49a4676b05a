"""The agent's waker: wakes from threads, signals recorded (never raised), interruptible calls.

The last test starts real worker processes: a signal that arrives while a WorkerGroup stops
them must not cut the stop short.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

import pytest

from elastic.agent.processes.group_state import GroupStatus
from elastic.agent.processes.group_settings import GroupSettings
from elastic.agent.processes.workers import WorkerGroup
from elastic.agent.waking import Interrupted, Waker
from elastic.config import Entrypoint, LaunchConfig, Std, StdMask
from elastic.rendezvous.api import RendezvousInfo

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def waker():
    waker = Waker()
    yield waker
    waker.close()


def later(delay: float, action) -> threading.Timer:
    timer = threading.Timer(delay, action)
    timer.start()
    return timer


def kill_self(signum: int = signal.SIGUSR2) -> None:
    os.kill(os.getpid(), signum)


def test_a_wait_times_out_without_a_wake(waker):
    started = time.monotonic()
    assert waker.wait(0.05) is False
    assert time.monotonic() - started >= 0.05


def test_a_wake_from_another_thread_ends_a_wait_at_once(waker):
    later(0.05, waker.wake)
    started = time.monotonic()
    assert waker.wait(10.0) is True
    assert time.monotonic() - started < 5.0


def test_a_wake_before_the_wait_is_kept_and_taken_once(waker):
    waker.wake()
    waker.wake()
    assert waker.wait(10.0) is True
    assert waker.wait(0) is False


def test_wakes_never_block_even_when_the_pipe_is_full(waker):
    for _ in range(200_000):  # far beyond a pipe's buffer
        waker.wake()
    assert waker.wait(0) is True
    assert waker.wait(0) is False


def test_a_wake_after_close_is_ignored(waker):
    waker.close()
    waker.wake()


def test_a_caught_signal_is_recorded_wakes_the_wait_and_is_raised_only_at_a_check(waker):
    previous = signal.getsignal(signal.SIGUSR2)
    with waker.catching(("SIGUSR2", "SIGUSR1")):
        later(0.05, kill_self)
        started = time.monotonic()
        assert waker.wait(10.0) is True
        assert time.monotonic() - started < 5.0
        assert waker.signalled == signal.SIGUSR2
        kill_self(signal.SIGUSR1)
        assert waker.wait(0) is True
        assert waker.signalled == signal.SIGUSR2  # the first one decides
        with pytest.raises(Interrupted) as raised:
            waker.check()
        assert raised.value.signum == signal.SIGUSR2
    assert signal.getsignal(signal.SIGUSR2) is previous
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd was given back


def test_catching_skips_names_the_platform_does_not_know(waker, caplog):
    with caplog.at_level(logging.WARNING), waker.catching(("SIGNOPE", "SIGUSR2")):
        kill_self()
        waker.wait(10.0)
    assert waker.signalled == signal.SIGUSR2
    assert "Cannot handle signal SIGNOPE" in caplog.text


def test_catching_outside_the_main_thread_changes_nothing(waker, caplog):
    previous = signal.getsignal(signal.SIGUSR2)

    def enter():
        with waker.catching(("SIGUSR2",)):
            assert signal.getsignal(signal.SIGUSR2) is previous

    with caplog.at_level(logging.WARNING):
        thread = threading.Thread(target=enter)
        thread.start()
        thread.join()
    assert "cannot handle signals SIGUSR2" in caplog.text


def test_a_call_returns_what_its_function_returns_and_leaves_no_wake_behind(waker):
    assert waker.call(lambda: 42, what="answer") == 42
    assert waker.wait(0) is False


def test_a_call_raises_what_its_function_raises(waker):
    def fail():
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        waker.call(fail, what="failing")


def test_a_signal_during_a_call_interrupts_it_and_raises_interrupted(waker):
    release = threading.Event()
    interrupted = []

    def interrupt():
        interrupted.append(threading.current_thread() is threading.main_thread())
        release.set()

    with waker.catching(("SIGUSR2",)):
        later(0.1, kill_self)
        started = time.monotonic()
        with pytest.raises(Interrupted):
            waker.call(lambda: release.wait(30.0), what="blocked", interrupt=interrupt)
    assert interrupted == [True]  # from the main thread, not from the signal handler's context
    assert time.monotonic() - started < 5.0


def test_a_call_after_a_signal_does_not_start(waker):
    ran = []
    with waker.catching(("SIGUSR2",)):
        kill_self()
        waker.wait(10.0)
        with pytest.raises(Interrupted):
            waker.call(lambda: ran.append(1), what="late")
    assert ran == []


SLOW_TO_STOP = """
import os, signal, sys, time
def term(*_):
    time.sleep(1.0)  # a worker that saves a checkpoint before it exits
    open(os.environ["STOPPED"] + "." + os.environ["LOCAL_RANK"], "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
open(os.environ["READY"] + "." + os.environ["LOCAL_RANK"], "w").close()
while True:
    time.sleep(0.05)
"""


def test_a_signal_during_a_worker_groups_stop_does_not_interrupt_the_stop(waker, tmp_path):
    script = tmp_path / "slow_to_stop.py"
    script.write_text(SLOW_TO_STOP)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, entrypoint=Entrypoint("script", str(script)),
                          redirects=StdMask(Std.ALL))
    info = RendezvousInfo("stop-test", 0, 0, 1, "127.0.0.1", 29999, ())
    environ = dict(os.environ, READY=str(tmp_path / "ready"), STOPPED=str(tmp_path / "stopped"))
    group = WorkerGroup(config, info, attempt=0,
                        settings=GroupSettings(log_root=str(tmp_path / "logs"), environ=environ, python=sys.executable))
    killed_at = []
    try:
        group.start()
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready.{rank}").exists() for rank in range(2)):
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.02)
        with waker.catching(("SIGTERM",)):
            timer = later(0.3, lambda: (kill_self(signal.SIGTERM), killed_at.append(time.monotonic())))
            state = group.stop(timeout=10.0)
            stopped_at = time.monotonic()
            timer.join()
    finally:
        group.stop(timeout=0)
    assert waker.signalled == signal.SIGTERM and killed_at[0] < stopped_at  # it came during the stop
    assert state.status is GroupStatus.SUCCEEDED and not state.running  # both saved and exited 0
    assert all((tmp_path / f"stopped.{rank}").exists() for rank in range(2))
    for pid in group.pids().values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
