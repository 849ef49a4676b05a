"""The lifeline: PID files, the parent-death signal, stopping what a dead agent left.

Real processes throughout (a small "agent" script forks "workers" that fork grandchildren);
every process a test starts is killed by its PID at the end. End-to-end SIGKILLs of
``elasticrun`` itself are in ``test_elasticrun.py``.
"""

from __future__ import annotations

import importlib
import errno
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from elastic.agent import pdeathsig
from elastic.agent.lifeline import keeper as lifeline, pidfile
from elastic.agent.lifeline.keeper import Lifeline
from elastic.agent.pdeathsig import parent_death_preexec
from elastic.agent.lifeline.pidfile import Liveness, PidFileError, PidRecord, ProcessId
from elastic.agent.lifeline.watchdog_process import Watchdog, watchdog_program

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")

# A worker: its own session, one grandchild in that session; prints "<pid> <grandchild pid>".
WORKER = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(os.getpid(), child.pid, flush=True)
    time.sleep(120)
""")


def alive(ident: ProcessId) -> bool:
    return pidfile.liveness(ident, pidfile.start_time(ident.pid)) is Liveness.ALIVE


def wait_gone(idents: list[ProcessId], timeout: float) -> list[ProcessId]:
    """Wait up to ``timeout`` for every process to be gone; the survivors."""
    deadline = time.monotonic() + timeout
    while True:
        left = [i for i in idents if alive(i)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


class Spawned:
    """Processes a test starts, killed by PID at the end."""

    def __init__(self) -> None:
        self.idents: list[ProcessId] = []
        self.popens: list[subprocess.Popen] = []

    def worker(self, **popen) -> tuple[ProcessId, ProcessId]:
        """A session-leading worker with one grandchild: their identities."""
        proc = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True,
                                start_new_session=True, **popen)
        self.popens.append(proc)
        worker, child = (int(t) for t in proc.stdout.readline().split())
        idents = [ProcessId.of(worker), ProcessId.of(child)]
        assert None not in idents, "the worker or its grandchild died at once"
        self.idents += idents
        return idents[0], idents[1]

    def add(self, proc: subprocess.Popen) -> subprocess.Popen:
        self.popens.append(proc)
        ident = ProcessId.of(proc.pid)
        if ident is not None:
            self.idents.append(ident)
        return proc

    def cleanup(self) -> None:
        for ident in self.idents:
            if alive(ident):
                os.kill(ident.pid, signal.SIGKILL)
        for proc in self.popens:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.fixture
def spawned():
    s = Spawned()
    try:
        yield s
    finally:
        s.cleanup()


def dead_process() -> ProcessId:
    """The identity of a process that has exited (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    ident = ProcessId.of(proc.pid)
    proc.stdin.close()
    proc.wait(timeout=10)
    return ident


# -- pure decisions and the file format ---------------------------------------------------------


@pytest.mark.parametrize(
    "recorded_start, current_start, expected",
    [
        (100.0, None, Liveness.GONE),  # no process has the pid
        (100.0, 100.0, Liveness.ALIVE),
        (100.0, 100.04, Liveness.ALIVE),  # psutil's clock-tick rounding
        (100.0, 100.5, Liveness.REUSED),  # a later process got the pid
        (100.0, 99.0, Liveness.REUSED),
    ],
)
def test_liveness_tells_the_recorded_process_from_a_reused_pid(recorded_start, current_start, expected):
    assert pidfile.liveness(ProcessId(1234, recorded_start), current_start) is expected


def test_a_pid_file_round_trips_and_is_private(tmp_path):
    live = PidRecord("run-1", ProcessId(10, 1.5), (ProcessId(11, 2.25), ProcessId(12, 3.0)))
    path = str(tmp_path / "workers-10.json")
    pidfile.write(path, live)
    assert pidfile.read(path) == live
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.listdir(tmp_path) == ["workers-10.json"]  # no temporary file left


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b'{"v": 3, "run_id": "r", "agent": {"pid": 1, "start": 1}, "workers": []}', "unknown version 3"),
        (b'{"v": 1, "run_id": "r", "agent": {"pid": 1, "start": 1}, "workers": []}', "unknown version 1"),  # no host
        (b"[1, 2]", "unknown version None"),
        (b'{"v": 2, "run_id": 5, "host": "h", "agent": {"pid": 1, "start": 1}, "workers": []}', "'run_id' must be"),
        (b'{"v": 2, "run_id": "r", "agent": {"pid": 1, "start": 1}, "workers": []}', "'host' must be a host key"),
        (b'{"v": 2, "run_id": "r", "host": "a/b", "agent": {"pid": 1, "start": 1}, "workers": []}', "'host' must be"),
        (b'{"v": 2, "run_id": "r", "host": "h", "agent": {"pid": -1, "start": 1}, "workers": []}', "positive integer"),
        (b'{"v": 2, "run_id": "r", "host": "h", "agent": {"pid": 1, "start": 1}, "workers": [{"pid": true, '
         b'"start": 1}]}', "positive integer"),
        (b'{"v": 2, "run_id": "r", "host": "h", "agent": {"pid": 1, "start": "x"}, "workers": []}', "a number 'start'"),
        (b'{"v": 2, "run_id": "r", "host": "h", "agent": 7, "workers": []}', "must be an object"),
    ],
)
def test_a_bad_pid_file_is_refused_with_one_clear_line(tmp_path, content, message):
    path = tmp_path / "workers-1.json"
    path.write_bytes(content)
    with pytest.raises(PidFileError, match=message) as raised:
        pidfile.read(str(path))
    assert "\n" not in str(raised.value)
    assert path.read_bytes() == content  # left as it was


def test_a_symlinked_or_oversized_pid_file_is_refused(tmp_path):
    target = tmp_path / "target.json"
    pidfile.write(str(target), PidRecord("r", ProcessId(1, 1.0)))
    link = tmp_path / "workers-2.json"
    link.symlink_to(target)
    with pytest.raises(PidFileError, match="symlink"):
        pidfile.read(str(link))
    big = tmp_path / "workers-3.json"
    big.write_bytes(b" " * (pidfile.MAX_FILE_BYTES + 1))
    with pytest.raises(PidFileError, match="more than"):
        pidfile.read(str(big))


# -- killing what a record names ------------------------------------------------------------------


def test_kill_workers_kills_a_live_worker_and_its_grandchild(spawned):
    worker, grandchild = spawned.worker()
    killed = pidfile.kill_workers([worker])
    assert set(killed) == {worker.pid, grandchild.pid}
    spawned.popens[-1].wait(timeout=5)
    assert wait_gone([worker, grandchild], 1.0) == []


def test_kill_workers_finds_a_dead_workers_grandchild_through_its_session(spawned):
    worker, grandchild = spawned.worker()
    os.kill(worker.pid, signal.SIGKILL)
    spawned.popens[-1].wait(timeout=5)  # reaped: its pid is free, its session lives on
    assert alive(grandchild)
    assert pidfile.kill_workers([worker]) == [grandchild.pid]
    assert wait_gone([grandchild], 1.0) == []


def test_kill_workers_spares_a_process_that_reused_the_pid(spawned):
    worker, grandchild = spawned.worker()
    reused = ProcessId(worker.pid, worker.start - 1000.0)  # the record is older than the process
    assert pidfile.kill_workers([reused]) == []
    assert alive(worker) and alive(grandchild)


# -- the parent-death signal -----------------------------------------------------------------------

AGENT = textwrap.dedent("""
    import subprocess, sys, time
    from elastic.agent.pdeathsig import parent_death_preexec
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True, preexec_fn=parent_death_preexec())
    print(proc.pid, flush=True)
    time.sleep(120)
""")


@linux_only
def test_a_worker_started_with_the_preexec_dies_when_its_agent_is_sigkilled(spawned):
    agent = spawned.add(subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True))
    worker = ProcessId.of(int(agent.stdout.readline()))
    spawned.idents.append(worker)
    assert alive(worker)
    agent.kill()
    agent.wait(timeout=5)
    assert wait_gone([worker], 1.0) == []


RECHECK = textwrap.dedent("""
    import os, signal
    from elastic.agent.pdeathsig import parent_death_preexec
    die_with_parent = parent_death_preexec()  # made for children of this process

    def fate(run):  # how a child running run() ends: 0 if it got past it, else -signal
        pid = os.fork()
        if pid == 0:
            run()
            os._exit(0)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    # A child of ours gets past it; a grandchild (its parent is not ours) kills itself.
    print(fate(die_with_parent), fate(lambda: os._exit(fate(die_with_parent) + 100)))
""")


@linux_only
def test_a_child_whose_parent_is_not_the_agent_any_more_kills_itself_at_once():
    # As a worker whose agent died between fork and prctl: it was re-parented, the signal will never come.
    out = subprocess.run([sys.executable, "-c", RECHECK], capture_output=True, text=True, timeout=30)
    assert out.stdout.split() == ["0", str(100 - signal.SIGKILL)], out.stderr


@linux_only
def test_the_preexec_is_withheld_off_the_main_thread_with_one_warning(caplog, monkeypatch):
    # The signal follows the forking thread: a worker forked by a short-lived thread would die with it.
    monkeypatch.setattr(pdeathsig, "_warned_thread", False)
    assert parent_death_preexec() is not None
    seen = []
    with caplog.at_level(logging.WARNING, logger="elastic.agent.pdeathsig"):
        for _ in range(2):
            thread = threading.Thread(target=lambda: seen.append(parent_death_preexec()))
            thread.start()
            thread.join()
    assert seen == [None, None]
    [warning] = [r.getMessage() for r in caplog.records]
    assert "no parent-death signal" in warning


def test_off_linux_the_module_imports_and_gives_no_preexec(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    try:
        reloaded = importlib.reload(pdeathsig)  # as imported on macOS
        assert not reloaded.PDEATHSIG_AVAILABLE
        assert reloaded.parent_death_preexec() is None
    finally:
        monkeypatch.undo()
        importlib.reload(pdeathsig)
    assert pdeathsig.PDEATHSIG_AVAILABLE is sys.platform.startswith("linux")


# -- the agent's side ------------------------------------------------------------------------------


def test_a_restarted_agent_stops_the_workers_a_dead_agent_left_and_logs_one_line(spawned, tmp_path, caplog):
    worker, grandchild = spawned.worker()
    state = tmp_path / "run-1"
    state.mkdir()
    dead = dead_process()
    pidfile.write(str(state / pidfile.file_name(pidfile.host_key(), dead.pid)), PidRecord("run-1", dead, (worker,)))

    with caplog.at_level(logging.WARNING, logger="elastic.agent.lifeline.keeper"):
        life = Lifeline.open(str(state), "run-1", "node-a", watchdog=False)
    try:
        assert wait_gone([worker, grandchild], 1.0) == []
        lines = [r.getMessage() for r in caplog.records if "left by an earlier agent" in r.getMessage()]
        assert len(lines) == 1 and "run-1" in lines[0] and f"(pid {dead.pid})" in lines[0]
        assert os.listdir(state) == [os.path.basename(life.path)]  # the dead agent's file is gone
    finally:
        life.close()
    assert not state.exists()  # the run's directory is removed once empty


def test_a_live_agents_workers_and_a_bad_file_are_left_alone(spawned, tmp_path, caplog):
    worker, grandchild = spawned.worker()
    other_agent = spawned.add(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
    state = tmp_path / "run-1"
    state.mkdir()
    live_file = state / pidfile.file_name(pidfile.host_key(), other_agent.pid)
    pidfile.write(str(live_file), PidRecord("run-1", ProcessId.of(other_agent.pid), (worker,)))
    bad_file = state / pidfile.file_name(pidfile.host_key(), 99)
    bad_file.write_text("{")

    with caplog.at_level(logging.WARNING, logger="elastic.agent.lifeline.keeper"):
        life = Lifeline.open(str(state), "run-1", "node-a", watchdog=False)
    life.close()
    assert sorted(os.listdir(state)) == sorted([live_file.name, bad_file.name])
    assert alive(worker) and alive(grandchild)
    assert live_file.exists() and bad_file.read_text() == "{"
    [warning] = [r.getMessage() for r in caplog.records]
    assert "ignoring the PID file" in warning and "not JSON" in warning


def test_track_and_untrack_keep_the_file_equal_to_the_live_workers(spawned, tmp_path):
    worker, _ = spawned.worker()
    life = Lifeline.open(str(tmp_path / "run-1"), "run-1", "node-a", watchdog=False)
    try:
        life.track([worker.pid])
        assert pidfile.read(life.path).workers == (worker,)
        life.untrack([worker.pid])
        assert pidfile.read(life.path).workers == ()
    finally:
        life.close()
    assert not os.path.exists(life.path)


def test_a_pid_file_update_that_cannot_be_written_is_said_once_and_its_recovery_once(spawned, tmp_path, caplog,
                                                                                     monkeypatch):
    worker, _ = spawned.worker()
    life = Lifeline.open(str(tmp_path / "run-1"), "run-1", "node-a", watchdog=False)
    blocked = {"on": False}
    real_replace = pidfile.replace_file

    def replace_file(path, write, **kwargs):  # the temporary file cannot be created while blocked
        if blocked["on"]:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), f"{path}.tmp")
        return real_replace(path, write, **kwargs)

    monkeypatch.setattr(pidfile, "replace_file", replace_file)
    try:
        life.track([worker.pid])
        blocked["on"] = True  # every update fails
        with caplog.at_level(logging.INFO, logger="elastic.agent.lifeline.keeper"):
            life.untrack([worker.pid])  # the file still names a stopped worker: harmless, not said
            assert not caplog.records
            life.track([worker.pid])
            life.untrack([worker.pid])
            life.track([worker.pid])
            blocked["on"] = False
            life.untrack([worker.pid])
            life.track([worker.pid])
        assert pidfile.read(life.path).workers == (worker,)
        life.untrack([worker.pid])
    finally:
        life.close()
    warning, recovered = [record.getMessage() for record in caplog.records]
    assert warning.startswith(f"Run run-1 node node-a: cannot update the PID file {life.path} (Is a directory; ")
    assert " free there); a restarted agent or the watchdog may miss these workers." in warning
    assert recovered == f"Run run-1 node node-a: the PID file {life.path} is up to date again."


CUT_SHORT = textwrap.dedent("""
    import resource, signal, sys
    from elastic.agent.lifeline import pidfile
    from elastic.agent.lifeline.pidfile import PidRecord, ProcessId
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (40, 40))  # the new content stops after 40 bytes
    try:
        pidfile.write(sys.argv[1], PidRecord("run-1", ProcessId(10, 1.5), (ProcessId(11, 2.25),)))
    except OSError as error:
        print(error.strerror)
""")


def test_a_pid_file_write_cut_short_leaves_the_old_file_whole_and_no_temporary_file(tmp_path):
    old = PidRecord("run-1", ProcessId(10, 1.5))
    path = str(tmp_path / "workers-10.json")
    pidfile.write(path, old)

    done = subprocess.run([sys.executable, "-c", CUT_SHORT, path], capture_output=True, text=True, timeout=60)

    assert done.stdout == "File too large\n", done.stderr
    assert pidfile.read(path) == old
    assert os.listdir(tmp_path) == ["workers-10.json"]


WATCHED_AGENT = textwrap.dedent("""
    import sys, time
    from elastic.agent.lifeline.keeper import Lifeline
    life = Lifeline.open(sys.argv[1], "run-1", "node-a")
    life.track([int(sys.argv[2])])
    print(life.watchdog_pid, flush=True)
    if sys.argv[3] == "close":
        life.close()  # exits leaving a tracked worker: the watchdog must kill it
        print("closed", flush=True)
    time.sleep(120)
""")


@pytest.mark.parametrize("how", ["sigkill", "close"])
def test_the_watchdog_kills_the_tracked_workers_when_its_agent_dies_or_exits_without_stopping_them(
        spawned, tmp_path, how):
    worker, grandchild = spawned.worker()  # not the agent's child: only the watchdog can stop it
    state = tmp_path / "run-1"
    agent = spawned.add(subprocess.Popen(
        [sys.executable, "-c", WATCHED_AGENT, str(state), str(worker.pid), how],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    watchdog = ProcessId.of(int(agent.stdout.readline()))
    spawned.idents.append(watchdog)
    assert alive(worker) and alive(grandchild)
    if how == "close":
        assert agent.stdout.readline() == "closed\n"
    else:
        agent.kill()
    assert wait_gone([worker, grandchild], 1.0) == []
    assert wait_gone([watchdog], 5.0) == []
    if how == "sigkill":
        agent.wait(timeout=5)
        assert "elasticrun watchdog: agent" in agent.stderr.read()
    assert not state.exists()


def test_the_watchdog_of_an_agent_that_stopped_its_workers_exits_quietly(spawned, tmp_path):
    life = Lifeline.open(str(tmp_path / "run-1"), "run-1", "node-a")
    watchdog = life._watchdog.proc
    spawned.popens.append(watchdog)
    life.close()
    assert watchdog.returncode == 0
    assert not (tmp_path / "run-1").exists()


EARLY_WATCHED_AGENT = textwrap.dedent("""
    import sys, time
    from elastic.agent.lifeline.watchdog_process import Watchdog
    watchdog = Watchdog.start()  # before the PID file exists, as elasticrun does
    print(watchdog.pid, flush=True)
    sys.stdin.readline()  # the test looks at the watchdog before it is armed
    from elastic.agent.lifeline.keeper import Lifeline
    life = Lifeline.open(sys.argv[1], "run-1", "node-a", watchdog=watchdog)
    life.track([int(sys.argv[2])])
    print("armed", flush=True)
    time.sleep(120)
""")


def test_a_watchdog_started_before_its_pid_file_kills_the_workers_named_once_armed(spawned, tmp_path):
    worker, grandchild = spawned.worker()  # not the agent's child: only the watchdog can stop it
    state = tmp_path / "run-1"
    agent = spawned.add(subprocess.Popen(
        [sys.executable, "-c", EARLY_WATCHED_AGENT, str(state), str(worker.pid)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    watchdog = ProcessId.of(int(agent.stdout.readline()))
    spawned.idents.append(watchdog)
    assert alive(watchdog) and not state.exists()  # running, with no PID file to act on yet
    agent.stdin.write("go\n")
    agent.stdin.flush()
    assert agent.stdout.readline() == "armed\n"
    agent.kill()
    assert wait_gone([worker, grandchild], 1.0) == []
    assert wait_gone([watchdog], 5.0) == []
    agent.wait(timeout=5)
    assert "elasticrun watchdog: agent" in agent.stderr.read()
    assert not state.exists()


def test_a_watchdog_never_armed_exits_quietly_when_released(spawned):
    watchdog = Watchdog.start()
    spawned.popens.append(watchdog.proc)
    watchdog.close("run-1")
    assert watchdog.proc.returncode == 0
    watchdog.close("run-1")  # idempotent


def test_a_watchdog_handed_to_a_lifeline_that_cannot_open_is_released(spawned, tmp_path):
    watchdog = Watchdog.start()
    spawned.popens.append(watchdog.proc)
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        Lifeline.open(str(tmp_path / "file"), "run-1", "node-a", watchdog=watchdog)
    assert watchdog.proc.returncode == 0


def test_a_watchdog_is_armed_once(spawned, tmp_path):
    life = Lifeline.open(str(tmp_path / "run-1"), "run-1", "node-a")
    try:
        spawned.popens.append(life._watchdog.proc)
        with pytest.raises(OSError, match="armed already"):
            life._watchdog.arm(str(tmp_path / "other.json"))
    finally:
        life.close()


def test_a_watchdog_starts_without_site_and_imports_psutil_before_it_blocks(tmp_path):
    read_end, write_end = os.pipe()
    watchdog = subprocess.Popen([sys.executable, "-S", "-c", watchdog_program()], stdin=read_end,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    os.close(read_end)
    os.write(write_end, f"{tmp_path / 'removed.json'}\n".encode())  # armed; the file is gone at EOF
    os.close(write_end)
    try:
        assert watchdog.wait(timeout=30) == 0
    finally:
        if watchdog.poll() is None:
            watchdog.kill()
            watchdog.wait()
    imported = {line.rsplit("|", 1)[-1].strip() for line in watchdog.stderr.read().splitlines()}
    watchdog.stderr.close()
    assert {"elastic.agent.lifeline.watchdog", "psutil"} <= imported  # from the directories it was given
    assert "site" not in imported


def test_state_dir_is_under_the_log_dir_or_a_private_temporary_root(tmp_path):
    assert lifeline.state_dir(str(tmp_path), "a/b") == os.path.join(str(tmp_path), "a_b")
    root = os.path.dirname(lifeline.state_dir(None, "run-1"))
    info = os.lstat(root)
    assert info.st_uid == os.geteuid() and info.st_mode & 0o077 == 0


def test_a_state_directory_that_is_a_symlink_or_a_file_is_refused(tmp_path):
    # A PID file found there could name any process: nothing is read from, or written to, it.
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(OSError, match="not a directory owned by this user"):
        Lifeline.open(str(tmp_path / "link"), "run-1", "node-a", watchdog=False)
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        Lifeline.open(str(tmp_path / "file"), "run-1", "node-a", watchdog=False)
    assert os.listdir(real) == []
