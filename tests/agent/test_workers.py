"""WorkerGroup with real processes: exits, signals, stopping whole trees, logs and the console.

Every test that takes the ``harness`` runs twice: workers started the normal way, and forked
from pre-warmed templates (``--prewarm``, templates importing ``json`` so no test pays torch's
import); both must behave the same.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import psutil
import pytest

from elastic.agent.prewarm.forked import ForkedWorker
from elastic.agent.prewarm.pool import TemplatePool
from elastic.testing.agents import wait_until
from elastic.agent.processes.group_state import GroupState, GroupStatus
from elastic.agent.processes.workers import (
    GroupSettings,
    WorkerGroup,
    WorkerStartError,
    attempt_log_dir,
    console_prefix,
    resolve_log_root,
)
from elastic.config import Entrypoint, LaunchConfig, Std, StdMask
from elastic.rendezvous.api import RendezvousInfo

PRELUDE = """\
import json, os, signal, subprocess, sys, time
LR = int(os.environ["LOCAL_RANK"])
RANK = int(os.environ["RANK"])
OUT = os.environ["TEST_OUT"]
def mark(name, value=""):
    tmp = os.path.join(OUT, f".{name}.{LR}.tmp")
    with open(tmp, "w") as f:
        f.write(str(value))
    os.replace(tmp, os.path.join(OUT, f"{name}.{LR}"))
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_done(group: WorkerGroup, timeout: float = 20.0) -> GroupState:
    """Wait (bounded) until the group is no longer running."""
    deadline = time.monotonic() + timeout
    state = group.poll()
    while state.status is GroupStatus.RUNNING:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"group still running after {timeout}s: {state}"
        state = group.wait(remaining)
    return state


class Harness:
    """Builds groups for one test; stops every group and kills every recorded pid at the end."""

    def __init__(self, tmp_path, prewarm: bool = False):
        self.prewarm = prewarm
        self.pools: list[TemplatePool] = []
        self.tmp = tmp_path
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.log_root = str(tmp_path / "logs")
        self.run_id = f"run-{uuid.uuid4().hex[:8]}"
        self.groups: list[WorkerGroup] = []
        self.pids: set[int] = set()

    def script(self, body: str) -> Entrypoint:
        path = self.tmp / f"worker_{len(self.groups)}.py"
        path.write_text(PRELUDE + textwrap.dedent(body))
        return Entrypoint("script", str(path))

    def group(
        self,
        body: str,
        nproc: int = 2,
        group_rank: int = 0,
        attempt: int = 0,
        line_prefix_template: str | None = None,
        **cfg,
    ) -> WorkerGroup:
        cfg.setdefault("redirects", StdMask(Std.ALL))
        config = LaunchConfig(
            min_nodes=1, max_nodes=4, nproc_per_node=nproc, entrypoint=self.script(body), **cfg
        )
        info = RendezvousInfo(
            run_id=self.run_id, round=0, group_rank=group_rank, group_world_size=group_rank + 1,
            master_addr="127.0.0.1", master_port=29999, members=(),
        )
        environ = dict(os.environ, TEST_OUT=str(self.out))
        pool = None
        if self.prewarm:
            pool = TemplatePool(dataclasses.replace(config, prewarm=True, prewarm_modules=("json",)),
                                environ, sys.executable)
            self.pools.append(pool)
            pool.start()
        group = WorkerGroup(config, info, attempt=attempt, settings=GroupSettings(
            log_root=self.log_root, environ=environ, line_prefix_template=line_prefix_template, templates=pool))
        self.groups.append(group)
        return group

    def start(self, group: WorkerGroup) -> WorkerGroup:
        group.start()
        self.pids.update(group.pids().values())
        if self.prewarm:  # really forked, not fallen back to a normal start
            assert all(isinstance(w.proc, ForkedWorker) for w in group._workers)
        return group

    def marks(self, name: str, nproc: int, pids: bool = False) -> dict[int, str]:
        """Each rank's ``mark(name, ...)`` value; with ``pids``, the values are pids to reap."""
        paths = {r: self.out / f"{name}.{r}" for r in range(nproc)}
        wait_until(lambda: all(p.exists() for p in paths.values()), 20, f"{name} marks")
        values = {r: p.read_text() for r, p in paths.items()}
        if pids:
            self.pids.update(int(t) for value in values.values() for t in value.split())
        return values

    def cleanup(self) -> None:
        for group in self.groups:
            group.stop(timeout=0)
        for pid in self.pids:
            if alive(pid):
                psutil.Process(pid).kill()
        for pool in self.pools:
            pool.close()


@pytest.fixture(params=["normal", "prewarm"])
def harness(tmp_path, request):
    h = Harness(tmp_path, prewarm=request.param == "prewarm")
    try:
        yield h
    finally:
        h.cleanup()


# -- exits -------------------------------------------------------------------------------------


def test_two_workers_that_exit_0_make_the_group_succeed(harness):
    group = harness.start(harness.group("print(f'rank {RANK} of', os.environ['WORLD_SIZE'])"))
    state = wait_done(group)
    assert state == GroupState(GroupStatus.SUCCEEDED, failures=(), running=frozenset())
    for r, logs in group.logs().items():
        with open(logs.stdout) as f:
            assert f.read() == f"rank {r} of 2\n"


def test_a_worker_exiting_3_fails_the_group_with_its_exit_code_and_ranks(harness):
    body = """
    if LR == 1:
        sys.exit(3)
    time.sleep(60)
    """
    group = harness.start(harness.group(body, group_rank=1))
    before = time.time()
    state = wait_done(group)
    assert state.status is GroupStatus.FAILED
    assert state.running == frozenset({0})
    (f,) = state.failures
    assert (f.local_rank, f.global_rank, f.exitcode, f.signal) == (1, 3, 3, None)
    assert f.pid == group.pids()[1]
    assert before - 5 < f.exit_time <= time.time()
    assert f.error is None and not f.during_stop
    assert f.error_file == group.logs()[1].error_file
    final = group.stop(timeout=5)
    assert final.status is GroupStatus.FAILED  # the root cause stays the cause
    assert [x.local_rank for x in final.failures] == [1, 0]
    assert final.failures[1].during_stop and final.failures[1].signal == "SIGTERM"


def test_a_worker_killed_by_sigkill_is_reported_with_the_signal_name(harness):
    body = """
    if LR == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    """
    state = wait_done(harness.start(harness.group(body)))
    assert state.status is GroupStatus.FAILED
    (f,) = state.failures
    assert (f.local_rank, f.exitcode, f.signal) == (0, -9, "SIGKILL")


def test_wait_returns_when_a_worker_exits_not_at_the_timeout(harness):
    body = """
    time.sleep(0.3 if LR == 0 else 60)
    """
    group = harness.start(harness.group(body))
    t0 = time.monotonic()
    state = group.wait(timeout=15)
    assert time.monotonic() - t0 < 5
    assert state.status is GroupStatus.RUNNING and state.running == frozenset({1})
    t0 = time.monotonic()
    assert group.wait(timeout=0.3).status is GroupStatus.RUNNING
    assert 0.25 <= time.monotonic() - t0 < 3


def test_send_signal_reaches_every_worker(harness):
    body = """
    signal.signal(signal.SIGUSR1, lambda *_: sys.exit(0))
    mark("ready", os.getpid())
    time.sleep(60)
    """
    group = harness.start(harness.group(body))
    harness.marks("ready", 2)
    group.send_signal(signal.SIGUSR1)
    assert wait_done(group, 10).status is GroupStatus.SUCCEEDED


def test_worker_stdin_is_empty_and_closed(harness):
    body = """
    data = sys.stdin.read()
    print(repr(data))
    """
    group = harness.start(harness.group(body, nproc=1))
    assert wait_done(group, 10).status is GroupStatus.SUCCEEDED
    with open(group.logs()[0].stdout) as f:
        assert f.read() == "''\n"


def test_a_command_that_cannot_start_raises_and_leaves_no_process(harness, tmp_path):
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=2,
        entrypoint=Entrypoint("command", str(tmp_path / "no-such-binary")),
    )
    info = RendezvousInfo("r", 0, 0, 1, "127.0.0.1", 1, ())
    group = WorkerGroup(config, info, attempt=0, settings=GroupSettings(log_root=str(tmp_path / "logs")))
    harness.groups.append(group)
    with pytest.raises(WorkerStartError, match="cannot start local rank 0"):
        group.start()
    assert group.pids() == {}


# -- stopping ----------------------------------------------------------------------------------


def test_stop_kills_a_term_ignoring_worker_after_the_timeout_and_all_grandchildren(harness):
    body = """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    same_session = subprocess.Popen(["sleep", "60"])
    own_session = subprocess.Popen(["sleep", "60"], start_new_session=True)
    mark("tree", f"{os.getpid()} {same_session.pid} {own_session.pid}")
    while True:
        time.sleep(1)
    """
    group = harness.start(harness.group(body))
    trees = harness.marks("tree", 2, pids=True)
    pids = {int(p) for value in trees.values() for p in value.split()}
    assert len(pids) == 6 and all(alive(p) for p in pids)

    t0 = time.monotonic()
    state = group.stop(timeout=1.0)
    elapsed = time.monotonic() - t0

    assert 1.0 <= elapsed < 5.0
    assert [p for p in pids if alive(p)] == []
    assert state.status is GroupStatus.STOPPED
    assert {f.signal for f in state.failures} == {"SIGKILL"}
    assert all(f.during_stop for f in state.failures)


def test_stop_returns_as_soon_as_workers_exit_on_sigterm(harness):
    body = """
    mark("ready", os.getpid())
    time.sleep(60)
    """
    group = harness.start(harness.group(body, shutdown_timeout=30.0))
    harness.marks("ready", 2)
    t0 = time.monotonic()
    state = group.stop()
    assert time.monotonic() - t0 < 5
    assert state.status is GroupStatus.STOPPED
    assert {f.signal for f in state.failures} == {"SIGTERM"}


def test_stop_reaps_grandchildren_left_by_a_worker_that_already_succeeded(harness):
    body = """
    child = subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mark("child", child.pid)
    """
    group = harness.start(harness.group(body))
    assert wait_done(group).status is GroupStatus.SUCCEEDED
    children = [int(v) for v in harness.marks("child", 2, pids=True).values()]
    assert all(alive(p) for p in children)
    assert group.stop(timeout=2).status is GroupStatus.SUCCEEDED
    wait_until(lambda: not any(alive(p) for p in children), 5, "grandchildren to die")


def test_stop_is_idempotent_and_a_stopped_group_cannot_start(harness):
    body = """
    time.sleep(60)
    """
    group = harness.start(harness.group(body))
    first = group.stop(timeout=2)
    t0 = time.monotonic()
    assert group.stop(timeout=2) == first
    assert time.monotonic() - t0 < 1
    never_started = harness.group(body)
    assert never_started.stop().status is GroupStatus.STOPPED
    with pytest.raises(RuntimeError):
        never_started.start()


def test_a_group_of_one_attempt_answers_no_to_what_live_recovery_asks(harness):
    """The agent asks every group the live questions; a plain group says no: its view does not
    follow rounds, a failed worker is replaced by nobody, and it cannot move to another round."""
    group = harness.start(harness.group("""
    if RANK == 1:
        sys.exit(3)
    time.sleep(60)
    """))
    wait_until(lambda: group.look().failures, 20, "rank 1 to fail")
    view = group.look()
    assert not view.follows_rounds and view.silent and view.formed is None
    assert group.refill(attempt=1, restart_count=0, use_agent_store=False) == ()
    group.held(None)
    assert group.look().failures == view.failures
    later = RendezvousInfo(run_id=harness.run_id, round=1, group_rank=0, group_world_size=1,
                           master_addr="127.0.0.1", master_port=29999, members=())
    with pytest.raises(WorkerStartError, match="cannot move to round 1"):
        group.move_to(later, attempt=1, restart_count=0, use_agent_store=False)
    assert group.look().running == frozenset({0})


def test_a_stop_interrupted_by_a_signal_is_redone_by_the_next_stop(harness, monkeypatch):
    body = """
    mark("ready", os.getpid())
    time.sleep(60)
    """
    group = harness.start(harness.group(body))
    pids = [int(v) for v in harness.marks("ready", 2, pids=True).values()]
    real_terminate = group._terminate

    def interrupted(grace):
        raise KeyboardInterrupt  # as if the agent's signal handler raised inside stop()

    monkeypatch.setattr(group, "_terminate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        group.stop(timeout=1)
    monkeypatch.setattr(group, "_terminate", real_terminate)
    assert all(alive(p) for p in pids)
    assert group.stop(timeout=1).status is GroupStatus.STOPPED
    wait_until(lambda: not any(alive(p) for p in pids), 5, "workers to die")


# -- logs and console --------------------------------------------------------------------------


def test_logs_and_error_files_land_in_the_attempt_rank_directories(harness):
    body = """
    print("out", RANK)
    print("err", RANK, file=sys.stderr)
    print(os.environ["TORCHELASTIC_ERROR_FILE"])
    """
    stale = os.path.join(attempt_log_dir(harness.log_root, harness.run_id, 2), "stale.txt")
    os.makedirs(os.path.dirname(stale))
    open(stale, "w").close()
    group = harness.start(harness.group(body, attempt=2, group_rank=1))
    assert wait_done(group).status is GroupStatus.SUCCEEDED
    assert not os.path.exists(stale)  # a re-used attempt directory starts clean
    for local_rank, logs in group.logs().items():
        rank_dir = os.path.join(harness.log_root, harness.run_id, "attempt_2", str(local_rank))
        assert logs.stdout == os.path.join(rank_dir, "stdout.log")
        assert logs.stderr == os.path.join(rank_dir, "stderr.log")
        assert logs.error_file == os.path.join(rank_dir, "error.json")
        with open(logs.stdout) as f:
            assert f.read() == f"out {2 + local_rank}\n{logs.error_file}\n"
        with open(logs.stderr) as f:
            assert f.read() == f"err {2 + local_rank}\n"


CONSOLE_BODY = """
os.write(1, f"out {LR}\\n".encode())  # one write per line: ranks share an inherited console
os.write(2, f"err {LR}\\n".encode())
"""


@pytest.mark.parametrize(
    "cfg, stdout_lines, stderr_lines, files",
    [
        pytest.param(
            {"tee": StdMask(Std.ALL)},
            {"[default0]:out 0", "[default1]:out 1"},
            {"[default0]:err 0", "[default1]:err 1"},
            {0: ("out 0\n", "err 0\n"), 1: ("out 1\n", "err 1\n")},
            id="tee-all",
        ),
        pytest.param(
            {"redirects": StdMask(Std.ALL)},
            set(), set(),
            {0: ("out 0\n", "err 0\n"), 1: ("out 1\n", "err 1\n")},
            id="redirect-all",
        ),
        pytest.param(
            {}, {"out 0", "out 1"}, {"err 0", "err 1"}, {0: (None, None), 1: (None, None)},
            id="neither-inherits-the-console",
        ),
        pytest.param(
            {"local_ranks_filter": frozenset({1})}, {"out 1"}, {"err 1"},
            {0: (None, None), 1: (None, None)},
            id="neither-filtered",
        ),
        pytest.param(
            {"tee": StdMask(Std.ALL), "local_ranks_filter": frozenset({0})},
            {"[default0]:out 0"}, {"[default0]:err 0"},
            {0: ("out 0\n", "err 0\n"), 1: ("out 1\n", "err 1\n")},
            id="tee-filtered-still-writes-files",
        ),
        pytest.param(
            {"tee": StdMask(per_rank={0: Std.OUT}), "redirects": StdMask(per_rank={1: Std.ALL})},
            {"[default0]:out 0"}, {"err 0"},
            {0: ("out 0\n", None), 1: ("out 1\n", "err 1\n")},
            id="per-rank-masks",
        ),
        pytest.param(
            {"tee": StdMask(Std.OUT), "role": "trainer"},
            {"[trainer0]:out 0", "[trainer1]:out 1"}, {"err 0", "err 1"},
            {0: ("out 0\n", None), 1: ("out 1\n", None)},
            id="role-in-prefix",
        ),
    ],
)  # fmt: skip
def test_console_and_files_follow_redirects_tee_and_filter(
    harness, capfd, cfg, stdout_lines, stderr_lines, files
):
    cfg.setdefault("redirects", StdMask())
    group = harness.start(harness.group(CONSOLE_BODY, **cfg))
    assert wait_done(group).status is GroupStatus.SUCCEEDED
    group.stop(timeout=2)  # joins the pumps
    out, err = capfd.readouterr()
    assert set(out.splitlines()) == stdout_lines
    assert {line for line in err.splitlines() if not line.startswith("Run ")} == stderr_lines
    for local_rank, (stdout, stderr) in files.items():
        logs = group.logs()[local_rank]
        for path, expected in ((logs.stdout, stdout), (logs.stderr, stderr)):
            if expected is None:
                assert path is None
            else:
                with open(path) as f:
                    assert f.read() == expected


def test_a_tee_line_without_newline_is_ended_on_the_console_not_glued(harness, capfd):
    body = """
    sys.stdout.write("partial " + str(LR))
    """
    group = harness.start(harness.group(body, tee=StdMask(Std.OUT)))
    assert wait_done(group).status is GroupStatus.SUCCEEDED
    group.stop(timeout=2)
    out, _ = capfd.readouterr()
    lines = sorted(out.splitlines(keepends=True))
    assert lines == ["[default0]:partial 0\n", "[default1]:partial 1\n"]
    with open(group.logs()[0].stdout) as f:
        assert f.read() == "partial 0"  # the file keeps the bytes as written


def test_tee_lines_use_the_prefix_template_with_global_ranks(harness, capfd):
    body = """
    print("hello")
    """
    group = harness.group(
        body, group_rank=1, tee=StdMask(Std.OUT), line_prefix_template="${role_name}-${rank}| "
    )
    assert wait_done(harness.start(group)).status is GroupStatus.SUCCEEDED
    group.stop(timeout=2)
    out, _ = capfd.readouterr()
    assert sorted(out.splitlines()) == ["default-2| hello", "default-3| hello"]


def test_tee_lines_use_the_template_the_cli_read_into_the_config(harness, capfd):
    body = """
    print("hello")
    """
    group = harness.group(body, group_rank=1, tee=StdMask(Std.OUT), log_line_prefix_template="[rank${rank}]:")
    assert wait_done(harness.start(group)).status is GroupStatus.SUCCEEDED
    group.stop(timeout=2)
    out, _ = capfd.readouterr()
    assert sorted(out.splitlines()) == ["[rank2]:hello", "[rank3]:hello"]


@pytest.mark.parametrize("template, prefix", [
    (None, "[default1]:"),
    ("", "[default1]:"),  # torch tests the template's truth: empty is unset
    ("[${role_name} ${rank}/${local_rank}]${unknown}: ", "[default 5/1]${unknown}: "),
    ("$rank|$local_rank|$$|${rank", "5|1|$|${rank"),  # string.Template.safe_substitute, as torch
])
def test_console_prefix_defaults_to_torchruns_and_substitutes_the_template_as_torch(template, prefix):
    assert console_prefix(template, "default", rank=5, local_rank=1) == prefix


# -- failures with their causes ----------------------------------------------------------------


@pytest.mark.slow  # a worker that imports torch (seconds)
@pytest.mark.needs_torch
def test_a_worker_using_record_reports_its_traceback(harness):
    body = """
    if LR == 1:
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def main():
            raise ValueError(f"rank {RANK} broke")

        main()
    """
    group = harness.start(harness.group(body, group_rank=2))
    state = wait_done(group, 60)
    assert state.status is GroupStatus.FAILED
    (f,) = state.failures
    assert (f.global_rank, f.exitcode) == (5, 1)
    assert f.error is not None and f.error.message == "ValueError: rank 5 broke"
    assert 'raise ValueError(f"rank {RANK} broke")' in f.error.traceback
    report = group.failure_report("node-x")
    assert "rank       : 5 (local_rank 1)" in report
    assert "host       : node-x" in report
    assert "error      : ValueError: rank 5 broke" in report
    assert 'raise ValueError(f"rank {RANK} broke")' in report


def test_failure_report_without_error_file_shows_the_stderr_tail(harness):
    body = """
    if LR == 0:
        print("fatal: disk full", file=sys.stderr)
        sys.exit(7)
    time.sleep(60)
    """
    group = harness.start(harness.group(body))
    assert wait_done(group).status is GroupStatus.FAILED
    group.stop(timeout=5)
    report = group.failure_report("h")
    root = report.split("Other failures:")[0]
    assert "rank       : 0 (local_rank 0)" in root
    assert "exit       : exit code 7" in root
    assert "    fatal: disk full" in root
    assert "killed by signal SIGTERM" in report.split("Other failures:")[1]


def test_agent_modules_do_not_import_torch():
    code = (
        "import sys, elastic.agent.processes.workers, elastic.agent.processes.failures, elastic.agent.worker_env\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_worker_sees_the_torchrun_environment(harness):
    body = """
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_NAME",
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS"]
    mark("env", json.dumps({k: os.environ.get(k) for k in keys}))
    """
    group = harness.start(harness.group(body, group_rank=1))
    assert wait_done(group).status is GroupStatus.SUCCEEDED
    envs = {r: json.loads(v) for r, v in harness.marks("env", 2).items()}
    assert envs[1] == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1", "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29999", "TORCHELASTIC_RUN_ID": harness.run_id,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }  # fmt: skip


def test_without_log_dir_every_attempt_shares_one_temporary_root():
    first, second = resolve_log_root(None), resolve_log_root(None)
    assert first == second and os.path.isdir(first)
    assert os.path.basename(first).startswith("elasticrun_")


def test_failures_of_later_snapshots_extend_earlier_ones(harness):
    body = """
    time.sleep(0.1 * LR)
    sys.exit(10 + LR)
    """
    group = harness.start(harness.group(body, nproc=4))
    seen: list = []
    deadline = time.monotonic() + 20
    while len(seen) < 4 and time.monotonic() < deadline:
        state = group.wait(timeout=1)
        assert state.failures[: len(seen)] == tuple(seen)
        seen = list(state.failures)
        time.sleep(0.01)  # wait() returns at once once the group has failed
    assert sorted(f.exitcode for f in seen) == [10, 11, 12, 13]


def test_each_node_logs_under_its_own_directory_so_agents_can_share_a_log_dir(tmp_path):
    a = attempt_log_dir(str(tmp_path), "job", 3, "host-1-1234-abcdef")
    b = attempt_log_dir(str(tmp_path), "job", 3, "host-2-99-012345")
    assert a != b
    assert a == os.path.join(str(tmp_path), "job", "host-1-1234-abcdef", "attempt_3")


@pytest.mark.parametrize("run_id, node_id", [("..", None), (".", "n"), ("job", ".."), ("../x", None)])
def test_a_log_directory_outside_the_log_root_is_refused_before_anything_is_deleted(tmp_path, run_id, node_id):
    root = tmp_path / "logs"
    root.mkdir()
    sibling = tmp_path / "precious"
    sibling.mkdir()
    if run_id == "../x":  # a '/' in an id becomes '_': the result stays inside the root
        assert attempt_log_dir(str(root), run_id, 0, node_id).startswith(str(root))
        return
    with pytest.raises(ValueError, match="plain name"):
        attempt_log_dir(str(root), run_id, 0, node_id)
    assert sibling.exists()
