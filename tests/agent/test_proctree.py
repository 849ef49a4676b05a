"""Finding workers' process trees: a fake process table for the decisions, then the real /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from elastic.agent.processes.proctree import ProcLister, find_tree
from elastic.agent.processes.group_state import GroupStatus
from elastic.agent.processes.group_settings import GroupSettings
from elastic.agent.processes.workers import WorkerGroup
from elastic.config import Entrypoint, LaunchConfig
from elastic.rendezvous.api import RendezvousInfo


class FakeLister:
    """A process table of rows ``pid: (ppid, sid, pgid)``; counts the calls made to it."""

    def __init__(self, rows: dict[int, tuple[int, int, int]]) -> None:
        self.rows = rows
        self.children_calls: list[int] = []
        self.pids_calls = 0

    def children(self, pid: int) -> list[int]:
        self.children_calls.append(pid)
        return [p for p, (ppid, _, _) in self.rows.items() if ppid == pid]

    def pids(self) -> list[int]:
        self.pids_calls += 1
        return list(self.rows)

    def session_and_group(self, pid: int) -> tuple[int, int] | None:
        row = self.rows.get(pid)
        return None if row is None else (row[1], row[2])


# Worker 100 leads session 100: child 101, grandchild 102 that left for a session of its own,
# 103 re-parented to init but still in session 100, 104 re-parented and in process group 100 of
# another session (setsid after setpgid is impossible, but the table need not know). Worker 300
# has exited (not a root); its orphan 301 stays in session 300. 1, 200-202: unrelated.
TABLE = {
    1: (0, 1, 1),
    100: (1, 100, 100),
    101: (100, 100, 100),
    102: (101, 102, 102),
    103: (1, 100, 100),
    104: (1, 999, 100),
    200: (1, 200, 200),
    201: (200, 200, 200),
    202: (1, 202, 202),
    301: (1, 300, 300),
    500: (1, 500, 500),  # the agent itself
}


@pytest.mark.parametrize(
    ("roots", "sessions", "scan", "expected"),
    [
        ([100], [100], False, {100, 101, 102}),
        ([100], [100], True, {100, 101, 102, 103, 104}),
        ([], [100, 300], True, {103, 104, 101, 100, 301}),
        ([100], [300], True, {100, 101, 102, 301}),
        ([], [], True, set()),
        ([100], [], True, {100, 101, 102}),
        ([101], [], False, {101, 102}),
        ([100, 500], [500], True, {100, 101, 102}),  # the agent never signals itself
        ([777], [777], True, {777}),  # a root that vanished: still tried (signals then fail quietly)
    ],
)
def test_a_tree_is_its_roots_descendants_and_with_a_scan_its_sessions_members(roots, sessions, scan, expected):
    assert find_tree(FakeLister(TABLE), roots, sessions, scan_sessions=scan, exclude=(500,)) == expected


def test_following_descendants_reads_only_the_tree_never_the_whole_table():
    lister = FakeLister(TABLE)

    find_tree(lister, [100], [100], scan_sessions=False)

    assert lister.pids_calls == 0
    assert sorted(lister.children_calls) == [100, 101, 102]


def test_a_session_scan_reads_the_table_once():
    lister = FakeLister(TABLE)
    find_tree(lister, [100], [100], scan_sessions=True)
    assert lister.pids_calls == 1


def test_a_cycle_in_the_table_does_not_loop():
    cycle = {10: (12, 10, 10), 11: (10, 10, 10), 12: (11, 10, 10)}
    assert find_tree(FakeLister(cycle), [10], [10], scan_sessions=True) == {10, 11, 12}


def test_a_process_that_vanishes_during_the_scan_is_skipped():
    lister = FakeLister({100: (1, 100, 100), 103: (1, 100, 100)})
    lister.pids = lambda: [100, 103, 4242]  # 4242 is gone by the time it is looked at
    assert find_tree(lister, [100], [100], scan_sessions=True) == {100, 103}


# -- the real process table ------------------------------------------------------------------------
def test_the_proc_lister_finds_children_like_psutil_does():
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""\
        import subprocess, sys, time
        kids = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
        print(" ".join(str(k.pid) for k in kids), flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        kids = {int(p) for p in parent.stdout.readline().split()}
        lister = ProcLister()
        assert set(lister.children(parent.pid)) == kids == {c.pid for c in psutil.Process(parent.pid).children()}
        assert find_tree(lister, [parent.pid]) == kids | {parent.pid}
        assert lister.session_and_group(parent.pid) == (os.getsid(parent.pid), os.getpgid(parent.pid))
    finally:
        for pid in kids:
            os.kill(pid, 9)
        parent.kill()
        parent.wait()
        parent.stdout.close()
    assert lister.children(parent.pid) == []
    assert lister.session_and_group(parent.pid) is None


class CountingLister(ProcLister):
    def __init__(self) -> None:
        super().__init__()
        self.scans = 0

    def pids(self) -> list[int]:
        self.scans += 1
        return super().pids()


def test_a_stop_scans_the_whole_process_table_a_bounded_number_of_times(tmp_path):
    """A 3 s grace period used to rescan every process on the host every 0.25 s (12 times)."""
    script = tmp_path / "stubborn.py"
    script.write_text(textwrap.dedent(f"""\
        import os, signal, subprocess, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(["sleep", "60"])
        open(os.path.join({str(tmp_path)!r}, f"ready.{{os.environ['LOCAL_RANK']}}"), "w").close()
        time.sleep(60)
        """))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, entrypoint=Entrypoint("script", str(script)))
    info = RendezvousInfo(run_id="proctree", round=0, group_rank=0, group_world_size=1,
                          master_addr="127.0.0.1", master_port=29999, members=())
    lister = CountingLister()
    group = WorkerGroup(config, info, attempt=0,
                        settings=GroupSettings(log_root=str(tmp_path / "logs"), process_lister=lister))
    group.start()
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready.{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.02)
        tree = find_tree(ProcLister(), group.pids().values())
        assert len(tree) == 4

        state = group.stop(timeout=3.0)
    finally:
        group.stop(timeout=0)

    assert state.status is GroupStatus.STOPPED
    assert not [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert 1 <= lister.scans <= 3, lister.scans  # at the start, before the SIGKILL, a last look


def test_a_grandchild_that_left_the_session_and_ignores_sigterm_is_killed_after_its_parent_died(tmp_path):
    """Its parent (the worker) dies on SIGTERM, so neither the parent chain nor the session finds
    it any more; the stop still knows it from the start and SIGKILLs it after the grace."""
    script = tmp_path / "escaper.py"
    script.write_text(textwrap.dedent(f"""\
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"],
            start_new_session=True)
        time.sleep(0.5)  # the child has set SIG_IGN by now
        with open(os.path.join({str(tmp_path)!r}, "child"), "w") as f:
            f.write(str(child.pid))
        time.sleep(60)
        """))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, entrypoint=Entrypoint("script", str(script)))
    info = RendezvousInfo(run_id="proctree", round=0, group_rank=0, group_world_size=1,
                          master_addr="127.0.0.1", master_port=29999, members=())
    group = WorkerGroup(config, info, attempt=0, settings=GroupSettings(log_root=str(tmp_path / "logs")))
    group.start()
    child = None
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "child").exists():
            assert time.monotonic() < deadline, "the worker did not start its child"
            time.sleep(0.02)
        child = psutil.Process(int((tmp_path / "child").read_text()))

        group.stop(timeout=1.0)

        _, still_alive = psutil.wait_procs([child], timeout=5)
        assert still_alive == []
    finally:
        group.stop(timeout=0)
        if child is not None and child.is_running():
            child.kill()
