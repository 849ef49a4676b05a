"""A full disk under ``--log-dir`` costs log lines, never training (issue 35, item 4).

The chaos suite's job (2 agents x 1 gloo worker on one real etcd, ``elasticrun``) with both
agents' ``--log-dir`` and ``--event-log`` on one 4 MiB tmpfs (the PID files go there too), the
workers printing a line per step to stdout and to stderr (``train.py --chatter``), under
``--redirects 3 --tee 3`` and under ``--redirects 3`` alone. Once a worker finished step
:data:`FULL_AT` the tmpfs is filled; :data:`FULL_STEPS` steps later it is freed. Whatever the
disk, the job must finish with no restart, every worker in its first process; with ``--tee``
every line reaches the console; each agent says once that the output cannot be written (naming
the directory and the free space) and once that it is written again; and the log files go on
after the gap, which a line marks.

Then the PID file and the event log on a full tmpfs, each on its own: a write that fails there
fails nothing, is said once, and the file is written again once there is space.
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

import chaoslib
from chaoslib import ELASTICRUN
from elastic.agent.lifeline import pidfile
from elastic.agent.lifeline.keeper import Lifeline
from elastic.agent.observe.events import Event, EventLog
from elastic.agent.processes.group_state import GroupStatus
from elastic.agent.processes.group_settings import GroupSettings
from elastic.agent.processes.workers import WorkerGroup
from elastic.config import Entrypoint, LaunchConfig, Std, StdMask
from elastic.rendezvous.api import RendezvousInfo
from elastic.testing.agents import wait_until

from support.small_fs import SmallFilesystem

STEPS = 100
FULL_AT = 20
"""The disk is filled once a worker finished this step."""
FULL_STEPS = 30
"""Steps trained on the full disk (6 s; the warning repeats at most every 60 s: said once)."""
START_TIMEOUT = 120.0
GAP = re.compile(r"^\[elasticrun: \d+ bytes of output lost here \(No space left on device\)\]$")


def chatter(text: str, stream: str = "stdout") -> set[int]:
    """The steps whose chatter line (of ``stream``) is in ``text``, prefixed or not."""
    suffix = r" \(stderr\)" if stream == "stderr" else ""
    found = re.findall(rf"chatter step (\d+) rank \d+ \.+{suffix}$", text, re.MULTILINE)
    return {int(step) for step in found}


@pytest.mark.slow
@pytest.mark.etcd
@pytest.mark.chaos
@pytest.mark.needs_torch
@pytest.mark.timeout(420)
@pytest.mark.parametrize("tee", [True, False], ids=["tee", "redirects-only"])
def test_a_full_log_disk_costs_log_lines_but_no_restart_and_no_worker(tee, small_disk, etcd_cluster_factory,
                                                                      job_factory, report_figures):
    cluster = etcd_cluster_factory(1)
    flags = ("--redirects=3", "--tee=3") if tee else ("--redirects=3",)
    job = job_factory(ELASTICRUN, steps=STEPS, extra_args=flags, script_args=("--chatter",),
                      log_root=small_disk.path)
    for node in ("a", "b"):
        job.start(node, cluster.endpoints())
    if not job.wait_step(FULL_AT, START_TIMEOUT):
        pytest.fail(f"the job did not reach step {FULL_AT} within {START_TIMEOUT:.0f}s:\n{job.stderr_tails()}")
    filled = small_disk.fill()
    full_at = time.time()
    job.wait_step(chaoslib.last_step(job.records()) + FULL_STEPS, 60)
    small_disk.free()
    freed_at = time.time()
    codes = job.wait_exit(90 + STEPS * 0.25 * 3)
    records = job.records()
    found = chaoslib.figures(records, full_at)
    report_figures(f"full-log-disk {'tee' if tee else 'redirects':<9} exits {codes}: {found.line()}, "
                   f"full for {freed_at - full_at:.1f} s ({filled >> 10} KiB filled)")

    problems = chaoslib.common_problems(job, codes, found, STEPS)
    if found.worlds != (2,) or found.charged or any(found.restarts.values()):
        problems.append(f"a full log disk cost restarts: worlds {found.worlds}, restarts {found.restarts}, "
                        f"charged {found.charged}")
    # A log file's last page still takes a few lines once the disk is full: 2 s later it cannot.
    steps_when_full = {r.step for r in records if r.event == "step" and full_at + 2 < r.time < freed_at}
    if len(steps_when_full) < 10:
        problems.append(f"only {len(steps_when_full)} steps were trained on the full disk: nothing was shown")
    for node in ("a", "b"):
        problems += judge_node(job, node, tee, steps_when_full)
    assert not problems, "\n".join(problems) + f"\nfigures: {found.line()}\n" + job.stderr_tails(6000)


def judge_node(job: chaoslib.ChaosJob, node: str, tee: bool, steps_when_full: set[int]) -> list[str]:
    """What is wrong with one node's console and log files after the full disk."""
    problems = []
    agent = job.agents[node]
    logs = job.logs(node)
    said = [line for line in agent.stderr.splitlines() if line.startswith("elasticrun:")]
    full = [line for line in said if "Worker output cannot be written under" in line]
    again = [line for line in said if "Worker output is written under" in line]
    if len(full) != 1 or str(logs) not in full[0] or not re.search(r"\(No space left on device; .+ free there\)",
                                                                    full[0]):
        problems.append(f"node {node}: expected one warning naming {logs} and its free space, got {full}")
    if len(again) != 1 or str(logs) not in again[0]:
        problems.append(f"node {node}: expected one line saying the output is written again, got {again}")
    if "Traceback" in agent.stderr or "Log pump" in agent.stderr:
        problems.append(f"node {node}: a traceback or a failed log pump on the console")
    if tee:
        for stream, text in (("stdout", agent.stdout), ("stderr", agent.stderr)):
            shown = chatter(text, stream)
            if shown != set(range(1, STEPS + 1)):
                problems.append(f"node {node}: the console's {stream} missed steps "
                                f"{sorted(set(range(1, STEPS + 1)) - shown)}")
    elif chatter(agent.stdout) or chatter(agent.stderr, "stderr"):
        problems.append(f"node {node}: --redirects alone put worker lines on the console")
    for stream in ("stdout", "stderr"):
        files = sorted(logs.glob(f"*/*/attempt_0/0/{stream}.log"))
        if len(files) != 1:
            problems.append(f"node {node}: expected one {stream}.log, found {files}")
            continue
        lines = files[0].read_text(errors="replace").splitlines()
        logged = chatter("\n".join(lines), stream)
        gaps = [line for line in lines if GAP.match(line)]
        if len(gaps) != 1:
            problems.append(f"node {node}: {stream}.log has {len(gaps)} lines marking a gap, expected 1")
        if not logged >= set(range(1, FULL_AT + 1)) or STEPS not in logged:
            problems.append(f"node {node}: {stream}.log lost lines before the disk was full or did not resume "
                            f"after it was freed: it has steps {sorted(logged)}")
        if logged >= steps_when_full:
            problems.append(f"node {node}: {stream}.log lost nothing: the disk was never full")
    return problems


@pytest.mark.chaos
def test_a_pid_file_on_a_full_disk_fails_nothing_is_said_once_and_is_written_once_there_is_space(
        small_disk, tmp_path, caplog):
    small_disk.fill()
    with caplog.at_level("INFO", logger="elastic.agent.lifeline.keeper"):
        life = Lifeline.open(str(small_disk.path / "run-1"), "run-1", "node-a")  # the watchdog starts anyway
        try:
            assert life.watchdog_pid is not None
            for _ in range(3):
                life.track([life.watchdog_pid])  # any live process will do
                life.untrack([life.watchdog_pid])
            assert list((small_disk.path / "run-1").iterdir()) == []  # no file cut short, no temporary file
            small_disk.free()
            life.track([life.watchdog_pid])
            assert [w.pid for w in pidfile.read(life.path).workers] == [life.watchdog_pid]
            life.untrack([life.watchdog_pid])
        finally:
            life.close()
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"Run run-1 node node-a: cannot update the PID file {life.path} "
                               "(No space left on device; ")
    assert lines[1] == f"Run run-1 node node-a: the PID file {life.path} is up to date again."


@pytest.mark.chaos
def test_an_event_log_on_a_full_disk_fails_nothing_is_said_once_and_resumes_on_a_line_of_its_own(
        small_disk, caplog):
    path = small_disk.path / "events.jsonl"
    with caplog.at_level("WARNING", logger="elastic.agent.observe.events"):
        with EventLog(path, run_id="run-1", node="node-a", host="host-a") as events:
            events.emit(Event.NODES_WAITING, count=1)
            small_disk.fill()
            for count in range(2, 60):  # the file's last page takes a few more; the record crossing its end is cut
                events.emit(Event.NODES_WAITING, count=count)
            small_disk.free()
            events.emit(Event.NODES_WAITING, count=60)
    lines = path.read_text().splitlines()
    cut = [line for line in lines if not line.endswith("}")]
    counts = [json.loads(line)["count"] for line in lines if line.endswith("}")]
    assert len(cut) == 1 and lines[-2] == cut[0], lines[-3:]
    assert counts == [*range(1, len(counts)), 60]
    [warning] = [record.getMessage() for record in caplog.records]
    assert f"Cannot write to the event log {path} (No space left on device)" in warning


GROUP_WORKER = """\
import os, sys, time
go = sys.argv[1]
for i in range(3):
    print(f"before {i}", flush=True)
open(f"{go}.ready.{os.environ['LOCAL_RANK']}", "w").close()
while not os.path.exists(go):
    time.sleep(0.05)
print("after", flush=True)
"""


@pytest.mark.chaos
def test_workers_start_on_a_disk_with_no_room_for_their_log_directory_and_log_once_there_is(tmp_path, caplog):
    """Each attempt's log directories are new: on a disk with no block (or inode) left, as ext4
    when full, creating them failed and took the agent down with a traceback (a restart on a
    full disk: by hand, tmpfs with nr_inodes=400). A tmpfs needs no block for a directory, so
    its inodes are taken here."""
    script = tmp_path / "worker.py"
    script.write_text(GROUP_WORKER)
    go = tmp_path / "go"
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, redirects=StdMask(Std.ALL),
                          entrypoint=Entrypoint("script", str(script), (str(go),)))
    info = RendezvousInfo("run-1", 0, 0, 1, "127.0.0.1", 29999, ())
    with SmallFilesystem(tmp_path / "disk", size=1 << 20, inodes=64) as disk:
        disk.fill()
        group = WorkerGroup(config, info, attempt=0, settings=GroupSettings(log_root=str(disk.path)))
        try:
            with caplog.at_level("WARNING", logger="elastic.agent.processes.log_loss"):
                group.start()
                wait_until(lambda: all(os.path.exists(f"{go}.ready.{rank}") for rank in (0, 1)), 30, "the workers")
                disk.free()
                go.touch()
                wait_until(lambda: group.poll().status is not GroupStatus.RUNNING, 30, "the workers to exit")
                state = group.poll()
        finally:
            group.stop(timeout=0)
        assert state.status is GroupStatus.SUCCEEDED, state
        for logs in group.logs().values():
            lines = open(logs.stdout).read().splitlines()
            assert len(lines) == 2 and GAP.match(lines[0]) and lines[1] == "after", lines
    [warning] = [record.getMessage() for record in caplog.records]
    assert warning.startswith(f"Worker output cannot be written under {group.log_dir}/")
