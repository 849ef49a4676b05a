"""Finding 9 of round three: an agent never acts on a PID file of another host or PID namespace,
and a state directory squatted by another user does not cost the lifeline.

The namespace test runs agent A in a PID namespace of its own (``unshare --pid``, root) with a
real worker tracked in a PID file in a directory shared with agent B (this process), as agents
sharing ``--log-dir`` across hosts or containers do; B then opens its lifeline there. The
squat tests run a real ``elasticrun`` whose ``<tmp>/elasticrun-<uid>`` another user created
first (or which is a file, or ours but open to everyone); the worker reports the watchdog and
the PID file it finds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap

import psutil
import pytest

from elastic.agent.lifeline import pidfile
from elastic.agent.lifeline.keeper import Lifeline
from elastic.agent.lifeline.pidfile import PidRecord, ProcessId
from hostile import REPO

NOBODY = 65534

AGENT_A = textwrap.dedent("""
    import subprocess, sys
    from elastic.agent.lifeline.keeper import Lifeline
    life = Lifeline.open(sys.argv[1], "job", "node-a", watchdog=False)
    worker = subprocess.Popen(["sleep", "300"], start_new_session=True)
    life.track([worker.pid])
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    life.untrack([worker.pid])
    worker.kill()
    life.close()
""")


def test_an_agent_in_another_pid_namespace_never_touches_this_ones_pid_file_or_workers(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("needs root and unshare(1) for a PID namespace (CI runs as root)")
    shared = tmp_path / "job"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    agent_a = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", AGENT_A,
                                str(shared)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert agent_a.stdout.readline().strip() == "ready"
        (file_a,) = os.listdir(shared)
        worker = next(p for p in psutil.Process(agent_a.pid).children(recursive=True) if p.name() == "sleep")
        life_b = Lifeline.open(str(shared), "job", "node-b", watchdog=False)  # agent B, in this namespace
        try:
            assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
            assert file_a in os.listdir(shared), "B deleted A's live PID file"
            assert sorted(os.listdir(shared)) == sorted([file_a, os.path.basename(life_b.path)])
        finally:
            life_b.close()
        assert os.listdir(shared) == [file_a]
    finally:
        agent_a.stdin.close()
        agent_a.wait(timeout=30)


def test_a_pid_file_of_another_host_naming_a_local_process_is_left_alone(tmp_path):
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        gone_agent = ProcessId(2 ** 22 + 17, 1.0)  # a pid no process has here
        other = "otherhost-0123456789ab"
        path = tmp_path / pidfile.file_name(other, gone_agent.pid)
        pidfile.write(str(path), PidRecord("job", gone_agent, (ProcessId.of(victim.pid),), other))
        renamed = tmp_path / pidfile.file_name(pidfile.host_key(), 4242)  # another host's content, our name
        pidfile.write(str(renamed), PidRecord("job", gone_agent, (ProcessId.of(victim.pid),), other))
        life = Lifeline.open(str(tmp_path), "job", "node-b", watchdog=False)
        assert life.stop_stale() == []
        life.close()
        assert victim.poll() is None
        assert path.exists() and renamed.exists()
    finally:
        victim.kill()
        victim.wait()


REPORT = textwrap.dedent("""
    import json, os, sys
    import psutil
    agent = psutil.Process(os.getppid())
    watchdogs = [p.pid for p in agent.children() if "lifeline.watchdog" in " ".join(p.cmdline())]
    state = os.path.join(os.environ["XDG_STATE_HOME"], "elasticrun", os.environ["TORCHELASTIC_RUN_ID"])
    files = sorted(os.listdir(state)) if os.path.isdir(state) else []
    json.dump({"watchdogs": watchdogs, "files": files}, open(sys.argv[1], "w"))
""")


def run_squatted(tmp_path, squat) -> tuple[dict, str]:
    tmp, state_home = tmp_path / "tmp", tmp_path / "state"
    tmp.mkdir()
    squat(tmp / f"elasticrun-{os.geteuid()}")
    (tmp_path / "report.py").write_text(REPORT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp), "XDG_STATE_HOME": str(state_home)}
    proc = subprocess.run([sys.executable, "-m", "elastic.run", "--standalone", "--nproc-per-node=1",
                           str(tmp_path / "report.py"), str(tmp_path / "report.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "report.json").read_text()), proc.stderr


def _owned_by_nobody(path) -> None:
    path.mkdir(mode=0o777)
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, 0o777)


@pytest.mark.parametrize("squat", [_owned_by_nobody, lambda path: path.write_text("squat")],
                         ids=["another-users-directory", "a-file"])
def test_a_squatted_state_directory_falls_back_to_a_private_one_with_the_watchdog(tmp_path, squat):
    report, stderr = run_squatted(tmp_path, squat)
    assert len(report["watchdogs"]) == 1, stderr[-3000:]
    assert len(report["files"]) == 1 and pidfile.is_file_of(report["files"][0], pidfile.host_key())
    assert "no PID file or watchdog" not in stderr
    (warning,) = [line for line in stderr.splitlines() if "cannot keep PID files in" in line]
    assert "elasticrun-" in warning and str(tmp_path / "state") in warning
    root = tmp_path / "state" / "elasticrun"
    assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700 and os.lstat(root).st_uid == os.geteuid()


def test_our_own_state_directory_open_to_everyone_is_made_private_again(tmp_path):
    def open_to_all(path):
        path.mkdir()
        os.chmod(path, 0o777)

    report, stderr = run_squatted(tmp_path, open_to_all)
    assert len(report["watchdogs"]) == 1 and report["files"] == []  # the PID file stayed in <tmp>
    assert stat.S_IMODE(os.lstat(tmp_path / "tmp" / f"elasticrun-{os.geteuid()}").st_mode) == 0o700
    assert "cannot keep PID files in" not in stderr


def test_the_watchdog_leaves_a_pid_file_of_another_host_alone(tmp_path):
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        path = tmp_path / "workers.json"
        pidfile.write(str(path), PidRecord("job", ProcessId.of(os.getpid()), (ProcessId.of(victim.pid),),
                                             "otherhost-0123456789ab"))
        read_end, write_end = os.pipe()
        from elastic.agent.lifeline.watchdog_process import watchdog_program
        watchdog = subprocess.Popen([sys.executable, "-S", "-c", watchdog_program()], stdin=read_end,
                                    stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        os.close(read_end)
        os.write(write_end, f"{path}\n".encode())  # the agent arms it with its PID file
        os.close(write_end)  # "the agent died"
        assert watchdog.wait(timeout=30) == 1
        assert "names host otherhost-0123456789ab" in watchdog.stderr.read()
        assert victim.poll() is None and path.exists()
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
