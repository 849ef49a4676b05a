"""The console says what happened (issue 34 item 14): real elasticrun agents on a real etcd.

* Under ``--live-recovery`` a crashed worker's node says its worker failed and how it is
  replaced, not that its surviving peer "is waiting to join"; no event counts restarts left
  below zero (``--max-restarts 0``, where the peers' rejoin restarts it anyway).
* A peer whose agent shut down (SIGTERM) is named as such; a SIGKILLed one as a lease expiry.
* One node at ``--nnodes=1:2`` counts down to the end of the last call, not the join timeout.

Plain Python workers (no torch) except for the live-recovery test (``live_train.py``, gloo).
"""

from __future__ import annotations

import json
import re
import signal
import os
import time

import pytest

from e2e import etcd_flags, run_id
from test_live_agent import FAULT_STEP, _agent, _at_step, _kill_stray_workers, _pids


pytestmark = [pytest.mark.slow, pytest.mark.etcd]

WAIT_FOR_STOP = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"


def node_id_of(stderr: str) -> str:
    return re.search(r"; node (\S+) runs ranks? ", stderr)[1]


@pytest.mark.needs_torch
@pytest.mark.parametrize("max_restarts", [0, 3])
def test_a_live_worker_crash_is_told_as_a_failure_healed_not_a_node_waiting(procs, etcd_server, tmp_path,
                                                                           max_restarts):
    total = 60
    rid = run_id()
    logs = {name: tmp_path / f"{name}.jsonl" for name in ("a", "b")}
    events = {name: tmp_path / f"{name}.events.jsonl" for name in ("a", "b")}
    try:
        for name in ("a", "b"):
            _agent(procs, etcd_server, rid, name, logs[name], total, "--max-restarts", str(max_restarts),
                   f"--event-log={events[name]}")
        procs.wait_for("both workers past the fault step", lambda: all(_at_step(log, FAULT_STEP, 2) for log in logs.values()))
        [victim] = _pids(logs["b"])
        os.kill(victim, signal.SIGKILL)
        assert [procs[name].wait(90) for name in ("a", "b")] == [0, 0], procs.logs()
    finally:
        _kill_stray_workers(*logs.values())
    crashed = procs["b"].stderr
    assert "is waiting to join" not in crashed and "restarting the workers" not in crashed, crashed
    failed = r"worker rank [01] failed \(killed by SIGKILL\)"
    told = [line for line in crashed.splitlines() if re.search(failed, line)]
    # Which comes first, its own worker's exit or the survivor's rejoin, is a race: its line is
    # either about the failure (with how it is replaced) or about the member rejoining; then the
    # next round counts the failure ("restart 1 of 3").
    assert told and all(re.fullmatch(
        rf"elasticrun: (run \S+ node \S+: {failed}(; its peers rejoined: replacing it in the next round, the other "
        rf"workers kept| and was replaced in its round; its peers rejoined: joining the next round with every "
        rf"worker)|{failed}; restart 1 of {max_restarts})", line) for line in told), told
    rejoins = [line for line in crashed.splitlines() if "a member rejoins: " in line]
    assert all(line.endswith("; joining the next round with the workers kept (does not count as a failure)")
               for line in rejoins), rejoins
    assert re.search(r"succeeded after [\d.]+s; \d attempts, \d restarts? \(.*1 worker failure\)", crashed), crashed
    restarts = [record for name in events for record in map(json.loads, events[name].read_text().splitlines())
                if record["event"] == "restart"]
    assert restarts and all(record["remaining"] == max(max_restarts - record["restart_count"], 0)
                            for record in restarts), restarts


@pytest.mark.parametrize("stop, why", [
    ("terminate", "its agent shut down"),
    ("kill", "its lease expired: its agent was killed, hung or cut off from the store"),
])
def test_a_member_that_left_is_named_with_why_it_left(procs, etcd_server, tmp_path, stop, why):
    (tmp_path / "train.py").write_text(WAIT_FOR_STOP)
    stop_file = tmp_path / "stop"
    job = ["--nnodes=1:2", "--nproc-per-node=1", *etcd_flags(etcd_server), str(tmp_path / "train.py"), str(stop_file)]
    a = procs.elasticrun(*job, name="a")
    b = procs.elasticrun(*job, name="b")
    procs.wait_for("a world of two nodes", lambda: all("workers on 2 nodes" in agent.stderr for agent in (a, b)),
                   names=["a", "b"])
    gone = node_id_of(b.stderr)
    if stop == "terminate":
        b.terminate()
        assert b.wait() == 143, b.stderr
    else:
        b.kill_tree()
    procs.wait_for("a to re-form alone", lambda: "round 1: formed a world of 1 worker" in a.stderr, names=["a"])
    stop_file.touch()
    assert a.wait() == 0, a.stderr
    assert (f"member lost: {gone} in round 0 ({why}); restarting the workers (does not count as a failure)"
            in a.stderr), a.stderr


def test_a_lone_node_counts_down_to_the_end_of_the_last_call_not_the_join_timeout(procs, etcd_server, tmp_path):
    (tmp_path / "train.py").write_text(WAIT_FOR_STOP)
    stop_file = tmp_path / "stop"
    stop_file.touch()  # the worker ends at once: the wait is the test
    flags = etcd_flags(etcd_server)
    conf = flags.index("--rdzv-conf") + 1
    flags[conf] += ",last_call_timeout=6"
    started = time.monotonic()
    alone = procs.elasticrun("--nnodes=1:2", "--nproc-per-node=1", *flags, str(tmp_path / "train.py"), str(stop_file),
                             name="alone")
    assert alone.wait() == 0, alone.stderr
    assert time.monotonic() - started >= 6
    lines = [line for line in alone.stderr.splitlines() if "nodes joined" in line]
    assert lines, alone.stderr
    for line in lines:
        assert "left before the join timeout" not in line, line
        closes_in = int(re.search(r"; the round closes in (\d+) s, at the end of the last call$", line)[1])
        assert closes_in <= 5, line  # the first line comes after 2 s of the 6 s last call
